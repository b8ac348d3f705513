"""The probe's rules inside one rank, in this process (no launch): what install() hooks, what each boundary records,
the clock's brackets on the step-clock socket, the device sync before every clock read, and the rank's summary.

Every global the probe touches (the optimizer hook registry, clip_grad_norm_, gc, the dispatch mode stack, the
watchdog) is put back after each test.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import json
import os
import socket
import sys
import time
import types
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode  # noqa: E402

from workers.rank import probe_steps  # noqa: E402
from workers.rank.digest import digest_cpu  # noqa: E402
from workers.rank.probe_steps import Probe, ProbeStop  # noqa: E402

OPTIMIZER = importlib.import_module("torch.optim.optimizer")  # torch.optim's attribute of that name is gone
# a process's first optimizer imports torch's compiler stack (about 3 s here): done once, when the tests are collected
# (mutmut forks each mutant's run from a process that has collected them)
torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)


class _Mode(TorchDispatchMode):
    """A dispatch mode that passes every op through and counts its entries and exits."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = self.exited = 0

    def __enter__(self) -> Any:
        self.entered += 1
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        self.exited += 1
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The probe's globals isolated; `watchdog` counts arm_watchdog() calls (the real one would end pytest)."""
    seen: dict[str, Any] = {"watchdog": 0}
    monkeypatch.setattr(OPTIMIZER, "_global_optimizer_post_hooks", OrderedDict())
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", torch.nn.utils.clip_grad_norm_)
    monkeypatch.setattr(torch.nn.utils.clip_grad, "clip_grad_norm_", torch.nn.utils.clip_grad.clip_grad_norm_)
    monkeypatch.setattr(torch.nn.utils, "clip_grads_with_norm_", torch.nn.utils.clip_grads_with_norm_)
    monkeypatch.setattr(probe_steps, "arm_watchdog", lambda: seen.__setitem__("watchdog", seen["watchdog"] + 1))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    gc.unfreeze()
    try:
        yield seen
    finally:
        gc.enable()
        gc.unfreeze()


def _quiet(probe: Probe) -> list[str]:
    """The trainer-number hooks (scalars.py's, global) replaced by a record of their calls."""
    calls: list[str] = []
    probe.numbers.install_torch = lambda: calls.append("torch")  # type: ignore[method-assign]
    probe.numbers.install_logging = lambda: calls.append("logging")  # type: ignore[method-assign]
    return calls


def _model() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.copy_(torch.tensor([0.5]))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _train_step(model: Any, optimizer: Any) -> None:
    optimizer.zero_grad()
    model(torch.tensor([[1.0, 1.0]])).sum().backward()
    optimizer.step()


def _lines(probe: Probe) -> list[dict[str, Any]]:
    return [json.loads(line) for line in probe.steps_path.read_text().splitlines()]


def _tensors(model: Any, optimizer: Any) -> dict[str, str]:
    """The digests a boundary must record: every parameter and every momentum buffer, by name."""
    out = {f"param/{n}": digest_cpu(p) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        out[f"optim/{n}/momentum_buffer"] = digest_cpu(optimizer.state[p]["momentum_buffer"])
    return out


def test_a_whole_run_through_the_optimizer_hook(tmp_path: Path, env: dict[str, Any]) -> None:
    model, optimizer = _model()
    probe = Probe(tmp_path / "out" / "pkg", steps=3, digest_steps={0, 2}, watch_steps=set(), ckpt_dir=tmp_path / "ck")
    calls = _quiet(probe)
    probe.install()
    probe.install()  # a second install changes nothing
    assert calls == ["torch", "logging"] and len(OPTIMIZER._global_optimizer_post_hooks) == 1
    assert gc.isenabled() and probe.applied_controls == {}
    expected, rng = [], []
    after_step0 = 0.0
    for step in range(3):
        if step < 2:
            _train_step(model, optimizer)
            assert len(_lines(probe)) == step + 1  # each line is flushed at its boundary
            after_step0 = after_step0 or time.time()
        else:
            with pytest.raises(ProbeStop) as stop:
                _train_step(model, optimizer)
            assert stop.value.code == 0
        expected.append(_tensors(model, optimizer))
        rng.append(hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest())
    lines = _lines(probe)
    assert [ln["step"] for ln in lines] == [0, 1, 2]
    assert {ln["schema"] for ln in lines} == {"orch.step/2"}
    assert [(ln["rank"], ln["world_size"]) for ln in lines] == [(0, 1)] * 3
    assert [ln["lr"] for ln in lines] == [[0.1]] * 3
    assert [ln["rng"] for ln in lines] == [{"cpu": h, "cuda": None} for h in rng]
    assert [(ln["peak_allocated"], ln["peak_reserved"]) for ln in lines] == [(None, None)] * 3
    assert [ln["digests"] for ln in lines] == [expected[0], None, expected[2]]
    assert lines[1]["combined"] is None
    for k in (0, 2):
        text = "".join(f"{name}={expected[k][name]}\n" for name in sorted(expected[k]))
        assert lines[k]["combined"] == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert [ln["digest_s"] is None for ln in lines] == [False, True, False]
    assert all(ln["duration_s"] > 0 and ln["probe_s"] >= 0 for ln in lines)
    assert lines[0]["prev_boundary_s"] is None and all(ln["prev_boundary_s"] > 0 for ln in lines[1:])
    watch = [(ln["forbidden"], ln["watched"], ln["hops"], ln["uninspected"]) for ln in lines]
    assert watch == [([], False, {}, [])] * 3
    assert env["watchdog"] == 1
    summary = json.loads((tmp_path / "out" / "pkg" / "probe.rank0.json").read_text())
    assert not (tmp_path / "out" / "pkg" / "probe.rank0.tmp").exists()
    ckpt = tmp_path / "ck" / "rank0.pt"
    recipe = summary.pop("observed_recipe")
    startup = summary.pop("startup")  # Unix times of the start-up (main() of workers.probe adds process and probe)
    assert set(startup) == {"torch", "installed", "step0_end"}
    assert startup["torch"] <= startup["installed"] <= startup["step0_end"] <= after_step0  # step 0's end, no later
    assert summary == {
        "schema": "orch.probe/2", "rank": 0, "world_size": 1, "complete": True, "steps": 3,
        "steps_file": "steps.rank0.jsonl", "steps_sha256": hashlib.sha256(probe.steps_path.read_bytes()).hexdigest(),
        "final_digests": expected[2], "final_combined": lines[2]["combined"], "peak_allocated": None,
        "peak_reserved": None, "checkpoint_file": "rank0.pt", "checkpoint_sha256": hashlib.sha256(
            ckpt.read_bytes()).hexdigest(), "other_optimizer_steps": 0, "host_controls": {}, "watched_steps": [],
        "logged_calls": 0, "clock_replaced": {}}
    assert (recipe["optimizer"], recipe["lr"], recipe["warmup_steps"], recipe["max_grad_norm"]) == ("SGD", 0.1, 0, None)
    saved = torch.load(ckpt)
    assert torch.equal(saved["params"]["weight"], model.weight.detach())
    assert torch.equal(saved["optim"]["bias"]["momentum_buffer"], optimizer.state[model.bias]["momentum_buffer"])


def test_the_last_step_is_digested_even_when_it_is_not_a_digest_step(tmp_path: Path, env: dict[str, Any]) -> None:
    model, optimizer = _model()
    probe = Probe(tmp_path, steps=2, digest_steps={0}, watch_steps=set(), ckpt_dir=None)
    _quiet(probe)
    probe.install()
    _train_step(model, optimizer)
    with pytest.raises(ProbeStop):
        _train_step(model, optimizer)
    last = _lines(probe)[1]
    assert last["digests"] is None and last["combined"] is None and last["digest_s"] is not None
    assert probe.final_digests == _tensors(model, optimizer)
    summary = json.loads((tmp_path / "probe.rank0.json").read_text())
    assert summary["final_digests"] == _tensors(model, optimizer)
    assert summary["checkpoint_file"] is None and summary["checkpoint_sha256"] is None


def test_rank_and_world_size_come_from_torchrun(tmp_path: Path, env: dict[str, Any],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    model, optimizer = _model()
    probe = Probe(tmp_path, steps=1, digest_steps=set(), watch_steps=set(), ckpt_dir=tmp_path / "ck")
    _quiet(probe)
    probe.install()
    with pytest.raises(ProbeStop):
        _train_step(model, optimizer)
    assert probe.steps_path == tmp_path / "steps.rank3.jsonl"
    assert [(ln["rank"], ln["world_size"]) for ln in _lines(probe)] == [(3, 4)]
    summary = json.loads((tmp_path / "probe.rank3.json").read_text())
    assert (summary["rank"], summary["world_size"], summary["checkpoint_file"]) == (3, 4, "rank3.pt")
    ckpt = torch.load(tmp_path / "ck" / "rank3.pt")
    assert (ckpt["rank"], ckpt["world_size"]) == (3, 4)


def test_a_second_optimizer_is_counted_and_never_recorded(tmp_path: Path, env: dict[str, Any]) -> None:
    model, optimizer = _model()
    other = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1.0)
    probe = Probe(tmp_path, steps=5, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    _quiet(probe)
    probe.install()
    _train_step(model, optimizer)
    other.step()
    other.step()
    _train_step(model, optimizer)
    assert [ln["step"] for ln in _lines(probe)] == [0, 1] and probe.step == 2
    probe.write_summary(complete=False)
    summary = json.loads((tmp_path / "probe.rank0.json").read_text())
    assert (summary["other_optimizer_steps"], summary["complete"], summary["steps"]) == (2, False, 2)


def test_clip_grad_norm_is_observed_and_unchanged(tmp_path: Path, env: dict[str, Any]) -> None:
    probe = Probe(tmp_path, steps=5, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    _quiet(probe)
    probe.install()
    wrapped = torch.nn.utils.clip_grad_norm_
    assert torch.nn.utils.clip_grad.clip_grad_norm_ is wrapped and wrapped.__name__ == "clip_grad_norm_"
    w = torch.nn.Parameter(torch.zeros(2))
    w.grad = torch.tensor([3.0, 4.0])  # norm 5
    total = wrapped([w], 2, norm_type=1.0)  # the L1 norm: 7
    assert float(total) == 7.0 and probe.max_norm == 2.0 and isinstance(probe.max_norm, float)
    assert torch.allclose(w.grad, torch.tensor([6 / 7, 8 / 7]), atol=1e-5)  # scaled by 2/7: the call ran as asked
    w.grad = torch.tensor([3.0, 4.0])
    assert float(wrapped([w], 10.0, 1.0)) == 7.0  # positional arguments pass through too (and 7 < 10: no scaling)
    assert torch.equal(w.grad, torch.tensor([3.0, 4.0])) and probe.max_norm == 10.0
    assert list(probe.numbers.take()) == ["grad_norm[0]", "grad_norm[1]"]


def test_two_part_clipping_is_observed_once(tmp_path: Path, env: dict[str, Any]) -> None:
    """accelerate clips with get_total_norm + clip_grads_with_norm_ (the TRL run): the max_norm is observed there,
    and clip_grad_norm_ (which clips through the private form) still counts one grad norm per call."""
    probe = Probe(tmp_path, steps=5, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    _quiet(probe)
    probe.install()
    w = torch.nn.Parameter(torch.zeros(2))
    w.grad = torch.tensor([3.0, 4.0])
    total = torch.nn.utils.get_total_norm([w.grad])
    torch.nn.utils.clip_grads_with_norm_([w], 1.0, total)
    assert probe.max_norm == 1.0 and torch.allclose(w.grad, torch.tensor([0.6, 0.8]), atol=1e-5)
    w.grad = torch.tensor([3.0, 4.0])
    torch.nn.utils.clip_grad_norm_([w], 2.0)
    assert probe.max_norm == 2.0 and list(probe.numbers.take()) == ["grad_norm[0]", "grad_norm[1]"]


def test_gc_runs_only_at_boundaries_when_the_host_control_asks(tmp_path: Path, env: dict[str, Any]) -> None:
    model, optimizer = _model()
    probe = Probe(tmp_path, steps=5, digest_steps=set(), watch_steps=set(), ckpt_dir=None,
                  host_controls=frozenset({"gc_at_boundaries"}))
    _quiet(probe)
    probe.install()
    assert not gc.isenabled()
    assert probe.applied_controls == {"gc": "disabled within steps; full collection at each step boundary"}
    full: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(probe.step)

    gc.callbacks.append(seen)
    try:
        _train_step(model, optimizer)
    finally:
        gc.callbacks.remove(seen)
    assert full == [0] and gc.get_freeze_count() > 0  # collected, then the survivors frozen, before step 1


def test_without_the_host_control_gc_is_left_alone(tmp_path: Path, env: dict[str, Any]) -> None:
    model, optimizer = _model()
    probe = Probe(tmp_path, steps=5, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    _quiet(probe)
    probe.install()
    _train_step(model, optimizer)
    assert gc.isenabled() and gc.get_freeze_count() == 0 and probe.applied_controls == {}


def test_the_watch_is_on_exactly_in_the_watched_steps(tmp_path: Path, env: dict[str, Any],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    mode = _Mode()
    made: list[Any] = []

    def make_watch(log: Any, active: Any) -> _Mode:
        made.append((log, active))
        return mode

    monkeypatch.setattr(probe_steps, "make_watch", make_watch)

    def inspect(log: Any, active: Any, note: Any = None) -> str:
        made.append((log, active))
        return "compiled graphs: not inspected"

    monkeypatch.setattr(probe_steps, "inspect_compiled_graphs", inspect)
    model, optimizer = _model()
    probe = Probe(tmp_path, steps=4, digest_steps=set(), watch_steps={0, 2, 3, 4, 9}, ckpt_dir=None)
    _quiet(probe)
    try:
        probe.install()
        assert [log for log, _ in made] == [probe.log, probe.log]
        assert [active() for _, active in made] == [True, True]  # `active` reads probe.watching
        assert probe.watching and _get_current_dispatch_mode() is mode and mode.entered == 1
        _train_step(model, optimizer)  # step 0 watched; step 1 is not
        assert not probe.watching and mode.exited == 1 and [active() for _, active in made] == [False, False]
        _train_step(model, optimizer)  # step 1; step 2 is watched
        assert probe.watching and mode.entered == 2
        probe.log.forbidden.add(("aten.mm", "torch.float16"))
        probe.log.hops["flex_attention"] += 2
        _train_step(model, optimizer)  # step 2; step 3 is watched too: the watch stays on
        assert probe.watching and mode.entered == 2 and mode.exited == 1
        with pytest.raises(ProbeStop):
            _train_step(model, optimizer)  # the last step: the watch is taken off before the stop
        assert not probe.watching and mode.exited == 2 and _get_current_dispatch_mode() is None
    finally:
        if probe.watching:
            probe._watch_off()
    lines = _lines(probe)
    assert [ln["watched"] for ln in lines] == [True, False, True, True]
    note = "compiled graphs: not inspected"
    assert [ln["uninspected"] for ln in lines] == [[note], [], [note], [note]]
    assert lines[2]["forbidden"] == [{"op": "aten.mm", "dtype": "torch.float16", "step": 2}]
    assert lines[2]["hops"] == {"flex_attention": 2} and lines[3]["hops"] == {} and lines[3]["forbidden"] == []
    summary = json.loads((tmp_path / "probe.rank0.json").read_text())
    assert summary["watched_steps"] == [0, 2, 3]  # steps past the run's end are not watched steps


def test_a_watch_under_the_trainers_own_mode_is_left_in_place_but_passive(tmp_path: Path, env: dict[str, Any],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    mode, trainer = _Mode(), _Mode()
    monkeypatch.setattr(probe_steps, "make_watch", lambda log, active: mode)
    monkeypatch.setattr(probe_steps, "inspect_compiled_graphs", lambda log, active, note=None: None)
    probe = Probe(tmp_path, steps=4, digest_steps=set(), watch_steps={0}, ckpt_dir=None)
    _quiet(probe)
    probe.install()
    try:
        with trainer:
            probe._watch_off()
            assert not probe.watching and mode.exited == 0  # not on top: never popped from under the trainer's
    finally:
        mode.__exit__(None, None, None)
    assert _get_current_dispatch_mode() is None


def test_no_watch_is_made_without_watched_steps(tmp_path: Path, env: dict[str, Any],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_steps, "make_watch", lambda log, active: pytest.fail("a watch was made"))
    probe = Probe(tmp_path, steps=4, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    _quiet(probe)
    probe.install()
    assert probe.watch is None and not probe.watching


def test_a_watch_not_asked_for_step_0_starts_off(tmp_path: Path, env: dict[str, Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    mode = _Mode()
    monkeypatch.setattr(probe_steps, "make_watch", lambda log, active: mode)
    monkeypatch.setattr(probe_steps, "inspect_compiled_graphs", lambda log, active, note=None: None)
    probe = Probe(tmp_path, steps=4, digest_steps=set(), watch_steps={1}, ckpt_dir=None)
    _quiet(probe)
    probe.install()
    assert probe.watch is mode and not probe.watching and mode.entered == 0


def test_each_clock_read_sits_between_its_two_stamped_lines(tmp_path: Path, env: dict[str, Any],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    name = f"orch-test-clock-{os.getpid()}-{time.monotonic_ns()}"
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind("\0" + name)
    rx.setblocking(False)
    got: list[str] = []

    def drain() -> list[str]:
        while True:
            try:
                got.append(rx.recv(256).decode())
            except BlockingIOError:
                return list(got)

    reads: list[list[str]] = []
    clock = iter([10.0, 13.0, 13.5, 14.0])

    def now() -> float:
        reads.append(drain())
        return next(clock)

    model, optimizer = _model()
    probe = Probe(tmp_path, steps=5, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    probe._now = now  # type: ignore[method-assign]
    _quiet(probe)
    probe.install()
    try:
        probe.open_clock(name)
        assert probe.t_end == 10.0
        _train_step(model, optimizer)
        drain()
    finally:
        probe.clock_sock.close()
        rx.close()
    assert reads == [["2 0 pre_start"],
                     ["2 0 pre_start", "2 0 start", "2 0 pre_end"],
                     ["2 0 pre_start", "2 0 start", "2 0 pre_end", "2 0 end"],  # probe_s: an unstamped read
                     ["2 0 pre_start", "2 0 start", "2 0 pre_end", "2 0 end", "2 1 pre_start"]]
    assert got == ["2 0 pre_start", "2 0 start", "2 0 pre_end", "2 0 end", "2 1 pre_start", "2 1 start"]
    line = _lines(probe)[0]
    assert (line["duration_s"], line["probe_s"]) == (3.0, 0.5) and probe.t_end == 14.0


def test_the_device_is_synchronized_before_every_clock_read(tmp_path: Path, env: dict[str, Any],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    syncs, resets = [0], [0]
    peaks = iter([(100, 1000), (300, 900), (200, 3000)])
    current: list[tuple[int, int]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.__setitem__(0, syncs[0] + 1))

    def allocated() -> int:
        current[:] = [next(peaks)]
        return current[0][0]

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: current[0][1])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: resets.__setitem__(0, resets[0] + 1))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all",
                        lambda: [torch.tensor([1, 2, 3], dtype=torch.uint8), torch.tensor([4], dtype=torch.uint8)])
    at_read: list[int] = []
    clock = iter(float(t) for t in range(100, 200))

    def now() -> float:
        at_read.append(syncs[0])
        return next(clock)

    model, optimizer = _model()
    probe = Probe(tmp_path, steps=3, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    probe._now = now  # type: ignore[method-assign]
    probe.t_end = 99.0
    _quiet(probe)
    probe.install()
    for _ in range(2):
        _train_step(model, optimizer)
    with pytest.raises(ProbeStop):
        _train_step(model, optimizer)
    assert at_read == list(range(1, 9))  # three reads a boundary (the last stops before its restart), each after a sync
    assert resets == [3]
    lines = _lines(probe)
    assert [(ln["peak_allocated"], ln["peak_reserved"]) for ln in lines] == [(100, 1000), (300, 900), (200, 3000)]
    assert {ln["rng"]["cuda"] for ln in lines} == {hashlib.sha256(b"\x01\x02\x03\x04").hexdigest()}
    summary = json.loads((tmp_path / "probe.rank0.json").read_text())
    assert (summary["peak_allocated"], summary["peak_reserved"]) == (300, 3000)


def test_a_replaced_clock_is_named_with_the_first_step_it_was_seen(tmp_path: Path, env: dict[str, Any],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model, optimizer = _model()
    probe = Probe(tmp_path, steps=5, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    _quiet(probe)
    probe.install()
    _train_step(model, optimizer)  # step 0: the clocks are the ones bound at import
    monkeypatch.setattr(time, "time", lambda: 0.0)
    _train_step(model, optimizer)  # step 1
    monkeypatch.setattr(time, "monotonic", lambda: 0.0)
    monkeypatch.delattr(time, "thread_time")  # a clock taken away is named too, and never breaks the hook
    _train_step(model, optimizer)  # step 2: time still replaced, monotonic too now
    monkeypatch.undo()
    assert probe.clock_replaced == {"time": 1, "monotonic": 2, "thread_time": 2}
    probe.write_summary(complete=False)
    summary = json.loads((tmp_path / "probe.rank0.json").read_text())
    assert summary["clock_replaced"] == {"monotonic": 2, "thread_time": 2, "time": 1}


def test_the_recipe_is_discovered_once_and_its_warm_up_read_from_the_learning_rates(
        tmp_path: Path, env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    found: list[Any] = []
    real = probe_steps.discover
    monkeypatch.setattr(probe_steps, "discover", lambda opt, norm: found.append(norm) or real(opt, norm))
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr": 0.2}], lr=0.1)
    for g in optimizer.param_groups:
        g["initial_lr"] = g["lr"]
    probe = Probe(tmp_path, steps=9, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    _quiet(probe)
    probe.install()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    for lr in (0.025, 0.05, 0.1, 0.1):
        optimizer.param_groups[0]["lr"] = lr
        _train_step(model, optimizer)
    assert found == [1.0]  # the first boundary only, with the clipping norm seen before it
    assert [ln["lr"] for ln in _lines(probe)] == [[0.025, 0.2], [0.05, 0.2], [0.1, 0.2], [0.1, 0.2]]
    assert probe.lr0 == [0.025, 0.05, 0.1, 0.1]
    recipe = probe.observed_recipe()
    assert recipe is not None and (recipe["lr"], recipe["warmup_steps"], recipe["max_grad_norm"]) == (0.1, 2, 1.0)
    assert probe.root is model and set(probe.param_names.values()) == {"weight", "bias"}


def test_the_observed_recipe_without_a_step_or_a_warm_up_that_ends(tmp_path: Path, env: dict[str, Any]) -> None:
    probe = Probe(tmp_path, steps=9, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    assert probe.observed_recipe() is None
    probe.recipe = {"lr": 0.1, "optimizer": "AdamW"}
    probe.lr0 = [0.05, 0.07]
    assert probe.observed_recipe() == {"lr": 0.1, "optimizer": "AdamW", "warmup_steps": None}
    probe.lr0 = [0.1, 0.05, 0.1]
    assert probe.observed_recipe() == {"lr": 0.1, "optimizer": "AdamW", "warmup_steps": 0}


def test_the_trainers_numbers_of_a_step_go_into_its_line(tmp_path: Path, env: dict[str, Any]) -> None:
    model, optimizer = _model()
    probe = Probe(tmp_path, steps=5, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    _quiet(probe)
    probe.install()
    probe.numbers.add_tensor("backward", torch.tensor(2.0))
    _train_step(model, optimizer)
    _train_step(model, optimizer)
    scalars = [ln["scalars"] for ln in _lines(probe)]
    assert list(scalars[0]) == ["backward[0]"] and scalars[1] == {}


def test_an_incomplete_rank_writes_no_checkpoint_and_names_the_torch_shim(
        tmp_path: Path, env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    model, optimizer = _model()
    probe = Probe(tmp_path, steps=5, digest_steps={0}, watch_steps=set(), ckpt_dir=tmp_path / "ck")
    _quiet(probe)
    probe.install()
    _train_step(model, optimizer)
    monkeypatch.setitem(sys.modules, "orch_torch_compat", types.SimpleNamespace(applied={"b": "two", "a": "one"}))
    probe.numbers.logged_calls = 5
    probe.write_summary(complete=False)
    summary = json.loads((tmp_path / "probe.rank0.json").read_text())
    assert (summary["complete"], summary["steps"], summary["checkpoint_file"]) == (False, 1, None)
    assert summary["logged_calls"] == 5
    assert summary["final_digests"] == {} and summary["final_combined"] is None
    assert summary["host_controls"] == {"torch_compat": "a: one; b: two"}
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("compat", [types.SimpleNamespace(applied={}), types.SimpleNamespace()])
def test_a_torch_shim_that_applied_nothing_is_not_named(tmp_path: Path, env: dict[str, Any],
                                                        monkeypatch: pytest.MonkeyPatch, compat: Any) -> None:
    probe = Probe(tmp_path, steps=5, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    monkeypatch.setitem(sys.modules, "orch_torch_compat", compat)
    probe.write_summary(complete=False)
    summary = json.loads((tmp_path / "probe.rank0.json").read_text())
    assert summary["host_controls"] == {} and summary["observed_recipe"] is None and summary["steps"] == 0


def test_the_probe_never_initializes_cuda_itself(tmp_path: Path, env: dict[str, Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    touched: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a device, which the trainer has not used
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    for name in ("synchronize", "max_memory_allocated", "max_memory_reserved", "reset_peak_memory_stats",
                 "get_rng_state_all"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, _n=name: touched.append(_n))
    model, optimizer = _model()
    probe = Probe(tmp_path, steps=2, digest_steps=set(), watch_steps=set(), ckpt_dir=None)
    _quiet(probe)
    probe.install()
    _train_step(model, optimizer)
    with pytest.raises(ProbeStop):
        _train_step(model, optimizer)
    assert touched == []
    lines = _lines(probe)
    assert [(ln["peak_allocated"], ln["peak_reserved"], ln["rng"]["cuda"]) for ln in lines] == [(None, None, None)] * 2
