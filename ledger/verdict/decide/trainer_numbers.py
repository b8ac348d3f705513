"""The trainer's own numbers (losses at backward, grad norms, logged values) compared bit for bit across arms.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ledger.verdict.decide.mismatch import Mismatch, Steps, by_step


def decode_scalar(code: str | None) -> str:
    """A recorded trainer number in readable form: floats as their repr, other codes as stored."""
    if code is None:
        return "absent"
    dtype, _, raw = code.partition(":")
    try:
        if dtype == "float64":
            return repr(struct.unpack("<d", bytes.fromhex(raw))[0])
        if dtype == "float32":
            return repr(struct.unpack("<f", bytes.fromhex(raw))[0])
    except (ValueError, struct.error):
        pass
    return raw if dtype in ("text", "int", "bool") else code


def first_scalar_mismatch(
    steps: Steps, labels: Sequence[str], scalar_steps: Sequence[int], ranks: Sequence[int]
) -> tuple[Mismatch | None, int, int]:
    """The trainer's own numbers (losses at backward, grad norms, logged values) equal bit for bit across arms,
    in (step, rank, quantity) order, like torchtitan's loss_compare. Returns (first, mismatches, compared)."""
    first: Mismatch | None = None
    count = compared = 0
    indexed = {label: {rank: by_step(steps[label].get(rank, ())) for rank in ranks} for label in labels}
    for step in scalar_steps:
        for rank in ranks:
            recs = {label: indexed[label][rank].get(step) for label in labels}
            scalars = {label: (rec.scalars if rec is not None else {}) for label, rec in recs.items()}
            for name in sorted(set().union(*(d.keys() for d in scalars.values()))):
                compared += 1
                values = {label: scalars[label].get(name) for label in labels}
                if len(set(values.values())) != 1:
                    count += 1
                    shown = ", ".join(f"{k}={decode_scalar(v)}" for k, v in values.items())
                    first = first or Mismatch("scalars", step, rank, name, dict(values),
                                              f"the trainer's {name} differs ({shown})")
    return first, count, compared


def logged_nothing(steps: Steps, labels: Sequence[str], scalar_steps: Sequence[int]) -> list[str]:
    """Arms whose trainer logged no number at all (through wandb.log or logging) in the compared steps."""
    wanted = set(scalar_steps)
    silent = []
    for label in labels:
        logged = any(
            name.startswith(("log", "wandb"))
            for recs in steps[label].values()
            for rec in recs
            if rec.step in wanted
            for name in rec.scalars
        )
        if not logged:
            silent.append(label)
    return silent
