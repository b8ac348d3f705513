"""GPU-busy in the timed windows (issue 50): NVML's utilisation samples gathered per watch interval outside the ranks,
mapped to windows by the step counter, and the audit's launch-bound class with the width its calibration gives."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ledger.verdict.decide.gpu_busy import (
    LAUNCH_BOUND_BELOW,
    busy_of,
    expected_width,
    gpu_busy_block,
    launch_busy,
    window_intervals,
)
from ledger.verdict.decide.stats import Position, Spread, paired_interval, triplets_needed
from orchestrator.run import host_watch
from orchestrator.run.gpu_busy import UtilSampler
from orchestrator.run.host_watch import HostWatcher
from protocol.host.quiet_host import HOST_WATCH_FILE, HostWatchLog, WatchSample, WatchUtil


class FakeGpuLib:
    """NVML as nvidia-ml-py shows it, for one or two GPUs: a ring of timestamped utilisation samples that grows with
    the wall clock (one sample every `period_us`, value `percent[index]` at the time it is taken)."""

    NVML_GPU_UTILIZATION_SAMPLES = 1

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: int = 1, period_us: int = 10_000, samples: bool = True) -> None:
        self.gpus, self.period_us, self.samples = gpus, period_us, samples
        self.percent = [0.0] * gpus
        self.ring: list[list[tuple[int, float]]] = [[] for _ in range(gpus)]
        self.lock = threading.Lock()
        self.t0 = int(time.time() * 1e6)
        self.next = self.t0 - 5 * period_us  # the ring already holds samples from before the watch

    def tick(self) -> None:
        """Samples up to now, each at its GPU's current value."""
        now = int(time.time() * 1e6)
        with self.lock:
            while self.next <= now:
                for i in range(self.gpus):
                    self.ring[i].append((self.next, self.percent[i]))
                self.next += self.period_us

    def Init(self) -> None:
        pass

    def Shutdown(self) -> None:
        pass

    def DeviceGetCount(self) -> int:
        return self.gpus

    def DeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def DeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return []

    DeviceGetGraphicsRunningProcesses = DeviceGetComputeRunningProcesses

    def DeviceGetSamples(self, h: int, kind: int, since: int) -> tuple[int, list[Any]]:
        if not self.samples:
            raise self.NVMLError("Not Supported")
        assert kind == self.NVML_GPU_UTILIZATION_SAMPLES
        self.tick()
        with self.lock:
            got = [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=int(v))) for t, v in self.ring[h]
                   if t > since]  # fmt: skip
        return 0, got

    def DeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=int(self.percent[h]), memory=0)


# the library's spelling of each function (protocol/host/gpu_library.py: its lower-case prefix is never written out)
for _name in ("Init", "Shutdown", "DeviceGetCount", "DeviceGetHandleByIndex", "DeviceGetComputeRunningProcesses",
              "DeviceGetGraphicsRunningProcesses", "DeviceGetSamples", "DeviceGetUtilizationRates"):
    setattr(FakeGpuLib, "NVML".lower() + _name, getattr(FakeGpuLib, _name))


def _util(index: int, busy: float, n: int = 4) -> WatchUtil:
    return WatchUtil(index=index, busy=busy, samples=n)


def _log(shares: list[tuple[int, list[WatchUtil]]], gpus: list[int] | None = None) -> HostWatchLog:
    """A recorded watch: (steps_done, utilisation of the interval ending there) per sample, 0.1 s apart."""
    samples = [WatchSample(t_s=round(0.1 * i, 4), steps_done=done, gpu_util=u) for i, (done, u) in enumerate(shares)]
    return HostWatchLog(interval_s=0.1, cpus=[0], gpus=[0] if gpus is None else gpus, gpu_query="ok", cpu_query="ok",
                        gpu_util_query="ok", wall_s=0.1 * len(samples), sampler_cpu_s=0.0, samples=samples)  # fmt: skip


def _steady(busy: list[float]) -> HostWatchLog:
    """Steps 0..15, two watch intervals each; the intervals of step k report busy[k] (one value per step)."""
    rows: list[tuple[int, list[WatchUtil]]] = [(0, [])]
    for k in range(16):
        rows += [(k, [_util(0, busy[k])]), (k, [_util(0, busy[k])])]
    rows.append((16, [_util(0, 0.0)]))  # the trainer stopped: idle, after the last window
    return _log(rows)


# ---- the sampler -------------------------------------------------------------------------------------------------


def test_the_first_read_sets_the_base_and_each_later_read_averages_only_the_new_samples() -> None:
    lib = FakeGpuLib(gpus=2, period_us=1000)
    lib.percent = [100.0, 40.0]
    sampler = UtilSampler(lib, [(0, 0), (1, 1)])
    assert sampler.read() == [] and sampler.query == "ok"  # the ring's samples from before the watch never count
    time.sleep(0.02)
    first = {u.index: u for u in sampler.read()}
    assert first[0].busy == 1.0 and first[1].busy == 0.4 and first[0].samples >= 10
    lib.percent = [0.0, 50.0]
    time.sleep(0.02)
    second = {u.index: u for u in sampler.read()}
    assert second[0].busy < 0.2 and 0.4 <= second[1].busy <= 0.5, second  # the old 100% samples were not read again
    assert sampler.read() == [] or all(u.samples <= 2 for u in sampler.read())


def test_without_samples_the_current_rate_stands_for_the_interval_and_says_so() -> None:
    lib = FakeGpuLib(samples=False)
    lib.percent = [73.0]
    sampler = UtilSampler(lib, [(0, 0)])
    assert sampler.read() == [WatchUtil(index=0, busy=0.73, samples=1)]
    assert sampler.query == "rate"


# ---- windows -----------------------------------------------------------------------------------------------------


def test_windows_take_the_intervals_inside_their_steps_and_an_edge_only_when_none_is() -> None:
    log = _steady([0.5] * 10 + [0.9, 0.9, 0.6, 0.6, 0.95, 0.95])
    closing, edge = window_intervals(log.samples, 12, 13)
    assert not edge and {s.gpu_util[0].busy for s in closing} == {0.6}
    figures = launch_busy(log, 16, 10, 2)
    assert [figures["windows"][w]["busy"] for w in ("w1", "w2", "w3")] == [0.9, 0.6, 0.95]
    # the interval closing as step 10 starts holds the end of step 9: the timed share is over the 11 inside ones
    assert figures["timed"] == pytest.approx((0.9 * 3 + 0.6 * 4 + 0.95 * 4) / 11, abs=1e-4)
    assert figures["package"] < figures["timed"], "warm-up and the idle tail count only for the whole package"
    # one watch interval spans steps 10-13: no interval inside w1, the overlapping one stands, marked as an edge
    coarse = _log([(0, []), (10, [_util(0, 0.3)]), (14, [_util(0, 0.8)]), (16, [_util(0, 0.7)])])
    w1 = launch_busy(coarse, 16, 10, 2)["windows"]["w1"]
    assert w1["edge"] and w1["busy"] == pytest.approx((0.3 * 4 + 0.8 * 4) / 8)


def test_gpus_are_weighted_by_their_samples_and_the_least_busy_is_named() -> None:
    closing = [WatchSample(t_s=0.1, steps_done=10, gpu_util=[_util(0, 1.0, 3), _util(1, 0.5, 1)]),
               WatchSample(t_s=0.2, steps_done=10, gpu_util=[_util(0, 0.0, 1), _util(1, 0.5, 1)])]  # fmt: skip
    assert busy_of(closing) == (pytest.approx(0.625), 0.5, 6)
    assert busy_of([WatchSample(t_s=0.1, steps_done=10)]) == (None, None, 0)


# ---- the audit's class and words ---------------------------------------------------------------------------------


def test_under_80_percent_is_launch_bound_with_the_calibrations_k1_width_and_what_to_change() -> None:
    cal = Spread(0.12, 2, Position(0.01, 0.0, 3))
    logs = {x: _steady([0.4] * 10 + [0.55] * 6) for x in ("A", "C", "B")}
    block = gpu_busy_block(logs, ["A", "C", "B"], 16, 10, 2, cal)
    assert block is not None and block["launch_bound"] is True and block["timed_busy"] == 0.55
    k1 = paired_interval([0.0], cal).half_width
    assert block["expected"]["k1_half_width"] == pytest.approx(k1, rel=1e-5) and k1 > 0.3
    # the A/A mean of 3 launches, subtracted from every triplet, is known to +-1.96 * 0.12 / sqrt(3) = 13.6% alone:
    # no K reaches +-5% (without that mean, K = 26 would)
    assert block["expected"]["triplets_for_target"] is None and triplets_needed(0.12, 2, target=0.05) == 26
    words = block["words"]
    assert "launch-bound (under 80%)" in words and f"+-{k1:.1%}" in words and "busy 55%" in words
    assert "+-5% is out of reach at any K: more A/A launches narrow it" in words
    assert "wider or deeper model" in words and "Sizing a GPU protocol" in words


def test_at_or_over_80_percent_is_gpu_bound_and_under_90_says_the_goal_is_missed() -> None:
    bound = gpu_busy_block({"A": _steady([0.96] * 16)}, ["A"], 16, 10, 2, Spread(0.002, 2))
    assert bound is not None and bound["launch_bound"] is False
    assert "GPU-bound" in bound["words"] and "goal" not in bound["words"] and "K = 1 interval of +-" in bound["words"]
    edge = gpu_busy_block({"A": _steady([LAUNCH_BOUND_BELOW] * 16)}, ["A"], 16, 10, 2, None)
    assert edge is not None and edge["launch_bound"] is False and "below the 90% goal" in edge["words"]


def test_without_a_calibration_the_words_say_how_to_measure_the_width() -> None:
    block = gpu_busy_block({"A": _steady([0.3] * 16)}, ["A"], 16, 10, 2, None)
    assert block is not None and block["expected"]["k1_half_width"] is None
    assert "orch calibrate PROTOCOL --repeats 3" in block["words"]
    assert expected_width(Spread(0.1, 0))["k1_half_width"] is None


def test_cpu_protocols_and_runs_recorded_before_have_no_block() -> None:
    old = _steady([0.5] * 16).model_copy(update={"gpu_util_query": None})
    cpu = _steady([0.5] * 16).model_copy(update={"gpus": []})
    assert gpu_busy_block({"A": old, "C": cpu, "B": None}, ["A", "C", "B"], 16, 10, 2, None) is None
    # a file written before the field existed still reads (the default), as recorded runs are re-audited
    data = json.loads(_steady([0.5] * 16).model_dump_json(by_alias=True))
    del data["gpu_util_query"]
    for s in data["samples"]:
        del s["gpu_util"]
    assert HostWatchLog.model_validate(data).gpu_util_query is None


def test_unread_utilisation_is_said_not_guessed() -> None:
    log = _log([(k, []) for k in range(17)]).model_copy(update={"gpu_util_query": "NVML error (NVMLError)"})
    block = gpu_busy_block({"A": log}, ["A"], 16, 10, 2, None)
    assert block is not None and block["launch_bound"] is None and block["unread"] == ["A"]
    assert block["words"] == "GPU-busy was not read in the timed windows (NVML error (NVMLError))"


# ---- the host watch records it ------------------------------------------------------------------------------------


def test_the_host_watch_records_gpu_busy_per_interval_and_the_audit_maps_it_to_windows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = FakeGpuLib(period_us=5000)
    monkeypatch.setattr(host_watch, "gpu_library", lambda: lib)
    watcher = HostWatcher(tmp_path, [0], interval_s=0.05)
    watcher.start()

    def steps(upto: int, start: int, percent: float, seconds: float) -> None:
        lib.percent = [percent]
        with open(tmp_path / "steps.rank0.jsonl", "a") as fh:
            fh.writelines(json.dumps({"step": k}) + "\n" for k in range(start, upto))
        time.sleep(seconds)

    steps(0, 0, 20.0, 0.3)  # start-up: steps_done 0
    steps(10, 0, 20.0, 0.4)  # steps 10-11 (w1) run at 20%
    steps(12, 10, 95.0, 0.4)  # w2
    steps(14, 12, 95.0, 0.4)  # w3
    steps(16, 14, 0.0, 0.2)  # stopped
    watcher.finish()
    log = HostWatchLog.model_validate_json((tmp_path / HOST_WATCH_FILE).read_bytes())
    assert log.gpu_util_query == "ok" and log.gpus == [0]
    assert not log.samples[0].gpu_util, "the first sample only sets the base"
    figures = launch_busy(log, 16, 10, 2)["windows"]
    # a watch interval may close a few ms after the step file moved: the windows' interior intervals stay near
    assert figures["w1"]["busy"] < 0.35 and figures["w2"]["busy"] > 0.85 and figures["w3"]["busy"] > 0.85, figures
    assert not any(figures[w]["edge"] for w in figures)
