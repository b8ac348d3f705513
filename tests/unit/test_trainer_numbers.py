"""ledger/verdict/decide/trainer_numbers.py: the trainer's own numbers compared bit for bit, on hand-made step lines."""

from __future__ import annotations

import struct

from ledger.verdict.decide.mismatch import Mismatch
from ledger.verdict.decide.trainer_numbers import decode_scalar, first_scalar_mismatch, logged_nothing
from protocol.results import RngFingerprint, StepRecord


def f64(x: float) -> str:
    return "float64:" + struct.pack("<d", x).hex()


def line(step: int, scalars: dict[str, str], rank: int = 0) -> StepRecord:
    return StepRecord(rank=rank, world_size=1, step=step, duration_s=1.0, probe_s=0.0, lr=[5e-6],
                      rng=RngFingerprint(cpu="0"), scalars=scalars)


def test_decode_scalar_shows_floats_by_repr_and_other_codes_as_stored() -> None:
    assert decode_scalar(None) == "absent"
    assert decode_scalar(f64(1.5)) == "1.5"
    assert decode_scalar("float32:" + struct.pack("<f", 0.1).hex()) == "0.10000000149011612"
    assert [decode_scalar(c) for c in ("int:7", "text:loss", "bool:True")] == ["7", "loss", "True"]
    assert decode_scalar("float64:zz") == "float64:zz"  # malformed bytes: the code as stored
    assert decode_scalar("bfloat16:3f80") == "bfloat16:3f80"


def test_the_first_differing_number_is_named_in_step_rank_quantity_order() -> None:
    same = {"backward[0]": f64(2.0), "grad_norm[0]": f64(0.5)}
    steps = {
        "A": {0: [line(0, same), line(1, {**same, "wandb[0].loss": f64(1.0)})]},
        "C": {0: [line(0, same), line(1, {"backward[0]": f64(2.5), "grad_norm[0]": f64(0.5)})]},
    }
    first, count, compared = first_scalar_mismatch(steps, ["A", "C"], [0, 1], [0])
    assert (count, compared) == (2, 5)  # step 1: backward[0] differs, wandb[0].loss is absent on C
    assert first == Mismatch("scalars", 1, 0, "backward[0]", {"A": f64(2.0), "C": f64(2.5)},
                             "the trainer's backward[0] differs (A=2.0, C=2.5)")
    assert first.line() == "scalars mismatch at step 1, rank 0, quantity backward[0]: the trainer's backward[0] " \
                           "differs (A=2.0, C=2.5)"
    assert first_scalar_mismatch(steps, ["A", "C"], [0], [0]) == (None, 0, 2)


def test_an_arm_that_logged_no_number_in_the_compared_steps_is_named() -> None:
    steps = {
        "A": {0: [line(0, {"log[0] loss %f#0": f64(1.0)}), line(1, {})]},
        "C": {0: [line(0, {"backward[0]": f64(1.0)}), line(1, {"wandb[0].loss": f64(1.0)})]},
    }
    assert logged_nothing(steps, ["A", "C"], [0, 1]) == []
    assert logged_nothing(steps, ["A", "C"], [0]) == ["C"]
    assert logged_nothing(steps, ["A", "C"], [1]) == ["A"]
