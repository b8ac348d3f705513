"""The probe's capture of the trainer's own numbers, in-process on CPU: losses at backward(), logged values through
Python logging and wandb (a stand-in module with wandb's call shapes), and what is left out (timing, evaluation)."""

from __future__ import annotations

import logging
import struct
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from workers.rank.scalars import TrainerNumbers, encode, text_numbers  # noqa: E402


def test_text_numbers_keep_values_and_drop_times() -> None:
    template, codes = text_numbers("(step=0000005)  step time: 1.23s train/loss: 0.1234, Train Steps/Sec: 0.81, ")
    assert template == "(step=#)  step time: #s train/loss: #, Train Steps/Sec: #, "
    assert codes == ["text:0000005", "", "text:0.1234", ""]
    assert text_numbers("Rank 1: Total norm: 3.5e-05")[1] == ["text:1", "text:3.5e-05"]


def test_encode_is_the_raw_bytes_of_the_dtype() -> None:
    assert encode(torch.tensor(1.0)) == "float32:" + struct.pack("<f", 1.0).hex()
    assert encode(torch.tensor(1.0, dtype=torch.bfloat16)) == "bfloat16:803f"
    assert encode(0.1) == "float64:" + struct.pack("<d", 0.1).hex()
    assert encode(7) == "int:7" and encode(True) == "bool:1"


@pytest.fixture
def hooked(tmp_path: Path) -> TrainerNumbers:
    numbers = TrainerNumbers(str(Path(__file__).parent))  # this file plays the trainer's sources
    saved = {m: getattr(logging.Logger, m) for m in ("debug", "info", "warning", "error", "critical", "exception",
                                                      "log")}
    backward = torch.autograd.backward
    numbers.install_torch()
    numbers.install_logging()
    yield numbers
    torch.autograd.backward = backward
    for name, method in saved.items():
        setattr(logging.Logger, name, method)


def test_backward_logging_and_wandb_are_recorded_per_window(hooked: TrainerNumbers) -> None:
    log = logging.getLogger("a-trainer")
    log.info("Training arguments lr=%s seed=%d", 5e-6, 4396)  # set-up, before any backward: not a training number
    w = torch.ones(3, requires_grad=True)
    loss = (w * 2).sum()
    loss.backward()  # Tensor.backward goes through torch.autograd.backward
    torch.autograd.backward((w * 3).sum())
    log.info("Rank %d: Text Loss: %s", 0, 0.25)
    log.debug("step %s", {"loss": 0.5, "step_time": 1.7, "eval": {"dev_reward": 0.9}})
    log.info("eval_log: %s", {"dev_mean_reward": 0.7})  # evaluation: blinded, never recorded
    fake = types.ModuleType("wandb")
    fake.log = lambda data, step=None, commit=None: None  # type: ignore[attr-defined]
    hooked.install_wandb(fake)
    fake.log({"train/loss": torch.tensor(0.125), "step_time": 3.0, "mem_allocated": torch.tensor(9.0)}, step=1)
    got = hooked.take()
    assert got == {
        "backward[0]": "float32:" + struct.pack("<f", 6.0).hex(),
        "backward[1]": "float32:" + struct.pack("<f", 9.0).hex(),
        "log[0] Rank #: Text Loss: ##0": "text:0",
        "log[0] Rank #: Text Loss: ##1": "text:0.25",
        "log.step[0].loss": encode(0.5),
        "wandb[0].train/loss": "float32:" + struct.pack("<f", 0.125).hex(),
    }
    assert hooked.take() == {}  # a new window
    assert hooked.logged_calls == 3


def test_log_calls_from_outside_the_sources_are_not_the_trainers(hooked: TrainerNumbers) -> None:
    torch.autograd.backward(torch.ones(1, requires_grad=True).sum())
    code = compile("import logging\nlogging.getLogger('lib').info('took %s ms, loss %s', 3, 0.5)", "/elsewhere.py",
                   "exec")
    exec(code, {})
    assert set(hooked.take()) == {"backward[0]"}


def test_wandb_forwarding_to_run_log_counts_once(hooked: TrainerNumbers) -> None:
    class Run:
        def log(self, data: dict, step: int | None = None) -> None:
            pass

    run = Run()
    sdk = types.SimpleNamespace(wandb_run=types.SimpleNamespace(Run=Run))
    fake = types.ModuleType("wandb")
    fake.sdk = sdk  # type: ignore[attr-defined]
    fake.log = lambda data, step=None: run.log(data, step=step)  # type: ignore[attr-defined]
    hooked.training = True
    hooked.install_wandb(fake)
    fake.log({"loss": 1.5}, step=3)
    run.log({"loss": 2.5})  # wandb re-binds wandb.log to the run's method at init: still seen
    assert hooked.take() == {"wandb[0].loss": encode(1.5), "wandb[1].loss": encode(2.5)}
    assert "wandb" not in sys.modules or sys.modules["wandb"] is not fake
