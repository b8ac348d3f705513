"""What a Hugging Face Trainer script yields with no change (issue 53): the probe's hook on transformers' log calls,
and a rank that hangs after an AF_UNIX error ended within seconds, not at the package's timeout."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import transformers.trainer_callback as tc

from workers.rank.scalars import TrainerNumbers
from workers.rank_failure import wait_or_hung


def test_a_trainers_log_reaches_the_probe_whatever_its_report_to(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tc.CallbackHandler, "on_log", tc.CallbackHandler.on_log)  # put back after the test
    numbers = TrainerNumbers(str(tmp_path))
    numbers.install_transformers(tc)
    numbers.install_transformers(tc)  # once only: a second install does not wrap it again
    handler = tc.CallbackHandler([], None, None, None, None)  # report_to none: no reporting callback at all
    state, control = tc.TrainerState(), tc.TrainerControl()
    handler.on_log(None, state, control, {"loss": 2.5, "grad_norm": 0.75, "learning_rate": 1e-4, "epoch": 0.5,
                                          "train_runtime": 1.2, "eval_loss": 3.0})
    assert numbers.take() == {}  # before the first backward(): set-up, not a training step
    numbers.training = True
    handler.on_log(None, state, control, logs={"loss": 2.5, "grad_norm": 0.75, "train_runtime": 1.2,
                                               "eval_loss": 3.0})
    # bit for bit, the times and the evaluation left out
    assert numbers.take() == {"log.trainer[0].grad_norm": "float64:" + struct.pack("<d", 0.75).hex(),
                              "log.trainer[0].loss": "float64:" + struct.pack("<d", 2.5).hex()}
    assert numbers.logged_calls == 1


def test_a_rank_hung_after_an_af_unix_error_is_ended_at_once_with_its_line(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    hang = ("import sys, time; print('Traceback (most recent call last):'); "
            "print('OSError: AF_UNIX path too long', flush=True); time.sleep(300)")
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", hang], stdout=out, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        rc, line = wait_or_hung(proc, log, poll_s=0.2)
    assert line == "OSError: AF_UNIX path too long" and rc != 0 and time.monotonic() - t0 < 30
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", "print('step 1')"], stdout=out)
        assert wait_or_hung(proc, log, poll_s=0.2) == (0, None)
