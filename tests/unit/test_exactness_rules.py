"""first_digest_mismatch on hand-made step lines (issue 18): what it counts, where it stops, how it words a miss.

Every expected value is worked out by hand from the rule (DESIGN.md section 1), never from the code under test.
"""

from __future__ import annotations

from ledger.verdict.exactness import first_digest_mismatch
from ledger.verdict.mismatch import Mismatch
from protocol.results import RngFingerprint, StepRecord


def _line(step: int, digests: dict[str, str] | None, combined: str | None = None) -> StepRecord:
    return StepRecord(rank=0, world_size=1, step=step, duration_s=1.0, probe_s=0.0, lr=[1e-3],
                      rng=RngFingerprint(cpu="r"), digests=digests, combined=combined)


def test_a_step_without_digests_is_one_mismatch_and_the_next_steps_are_still_compared() -> None:
    same = {"w": "a" * 32, "v": "b" * 32}
    steps = {
        "A": {0: [_line(1, same, "c"), _line(2, same, "c")]},
        "C": {0: [_line(1, None), _line(2, {**same, "w": "f" * 32}, "c")]},  # step 1: no digests; step 2: w differs
        "B": {0: [_line(1, same, "c"), _line(2, same, "c")]},
    }
    first, count, compared = first_digest_mismatch(steps, ("A", "C", "B"), [1, 2], [0])
    # step 1 is one miss (no tensors compared); step 2 compares v and w and w disagrees: 2 misses, 2 tensors
    assert (count, compared) == (2, 2)
    assert first == Mismatch("missing", 1, 0, None, {}, "no digests from arm(s) C")
    assert first.line() == "missing mismatch at step 1, rank 0: no digests from arm(s) C"


def test_a_rank_without_lines_is_missing_in_every_arm_that_lacks_it() -> None:
    steps = {"A": {0: [_line(1, {"w": "a"}, "c")]}, "C": {}, "B": {}}
    first, count, compared = first_digest_mismatch(steps, ("A", "C", "B"), [1], [0])
    assert (count, compared) == (1, 0)
    assert first is not None and first.detail == "no digests from arm(s) C, B"


def test_a_tensor_digest_mismatch_names_its_values_cut_to_16_characters() -> None:
    steps = {
        "A": {0: [_line(3, {"w": "0123456789abcdef0123"}, "c1")]},
        "C": {0: [_line(3, {"w": "fedcba9876543210fedc"}, "c2")]},
        "B": {0: [_line(3, {}, "c1")]},  # B has no digest of w at all
    }
    first, count, compared = first_digest_mismatch(steps, ("A", "C", "B"), [3], [0])
    # one tensor, one miss; the combined digests differ too but a tensor miss already counts the step
    assert (count, compared) == (1, 1)
    assert first == Mismatch(
        "digests", 3, 0, "w", {"A": "0123456789abcdef0123", "C": "fedcba9876543210fedc", "B": None},
        "digest of w differs (A=0123456789abcdef, C=fedcba9876543210, B=absent)")


def test_equal_tensors_with_a_different_combined_digest_are_a_mismatch_of_their_own() -> None:
    same = {"w": "a" * 32}
    steps = {"A": {0: [_line(1, same, "x")]}, "C": {0: [_line(1, same, "y")]}, "B": {0: [_line(1, same, "x")]}}
    first, count, compared = first_digest_mismatch(steps, ("A", "C", "B"), [1], [0])
    assert (count, compared) == (1, 1)
    assert first == Mismatch("combined", 1, 0, None, {"A": "x", "C": "y", "B": "x"},
                             "combined digest differs (A=x, C=y, B=x)")


def test_a_missing_rank_does_not_skip_the_other_ranks_of_that_step() -> None:
    def line(rank: int, w: str | None) -> StepRecord:
        return StepRecord(rank=rank, world_size=2, step=1, duration_s=1.0, probe_s=0.0, lr=[1e-3],
                          rng=RngFingerprint(cpu="r"), digests=None if w is None else {"w": w}, combined="c")

    steps = {"A": {0: [line(0, "a")], 1: [line(1, "a")]}, "C": {0: [line(0, None)], 1: [line(1, "b")]},
             "B": {0: [line(0, "a")], 1: [line(1, "a")]}}
    first, count, compared = first_digest_mismatch(steps, ("A", "C", "B"), [1], [0, 1])
    # rank 0: C has no digests (one miss); rank 1: w differs (one more miss, one tensor compared)
    assert (count, compared) == (2, 1)
    assert first is not None and (first.check, first.rank) == ("missing", 0)
