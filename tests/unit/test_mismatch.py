"""ledger/verdict/decide/mismatch.py: where two arms first disagree, said in one line."""

from __future__ import annotations

from ledger.verdict.decide.mismatch import Mismatch, by_step
from protocol.results import RngFingerprint, StepRecord


def test_a_mismatch_names_step_rank_and_tensor_or_quantity() -> None:
    values: dict[str, str | None] = {"A": "01", "C": "02"}
    assert Mismatch("digests", 12, 1, "param/w", values, "A 01 != C 02").line() == (
        "digests mismatch at step 12, rank 1, tensor param/w: A 01 != C 02")
    assert Mismatch("scalars", 3, 0, "backward[0]", values, "differs").line() == (
        "scalars mismatch at step 3, rank 0, quantity backward[0]: differs")
    assert Mismatch("final", None, 2, None, values, "final digests differ").line() == (
        "final mismatch at rank 2: final digests differ")
    assert Mismatch("missing", None, None, None, {}, "arm C has no rank 1").line() == (
        "missing mismatch at run level: arm C has no rank 1")


def test_by_step_indexes_a_rank_s_lines_by_step() -> None:
    lines = [StepRecord(rank=0, world_size=1, step=s, duration_s=1.0, probe_s=0.0, lr=[1e-3],
                        rng=RngFingerprint(cpu=str(s))) for s in (2, 0, 1)]
    indexed = by_step(lines)
    assert sorted(indexed) == [0, 1, 2] and indexed[2].rng.cpu == "2"
    assert by_step([]) == {}
