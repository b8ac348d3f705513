"""Where two arms first disagree (Mismatch), and the step lines it is found in: shared by the exactness checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from protocol.results import StepRecord

Steps = Mapping[str, Mapping[int, Sequence[StepRecord]]]  # arm label -> rank -> step lines


@dataclass(frozen=True)
class Mismatch:
    """The first place where two arms (or a train and its reload) disagree."""

    check: str  # digests | combined | final | reload | rng | lr | missing
    step: int | None
    rank: int | None
    tensor: str | None
    values: dict[str, str | None]  # arm label (or "reload X") -> value seen
    detail: str

    def line(self) -> str:
        where = []
        if self.step is not None:
            where.append(f"step {self.step}")
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.tensor is not None:
            where.append(f"{'quantity' if self.check == 'scalars' else 'tensor'} {self.tensor}")
        return f"{self.check} mismatch at {', '.join(where) or 'run level'}: {self.detail}"


def by_step(records: Sequence[StepRecord]) -> dict[int, StepRecord]:
    return {r.step: r for r in records}
