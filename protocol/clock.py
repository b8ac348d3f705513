"""The cross-check of step times against a clock outside the trainer's interpreter (DESIGN.md section 5).

The probe sends one datagram per step boundary to the train worker's socket; the kernel stamps each as it is sent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

# Each clock line is sent right after the probe reads its clock and stamped on entry to the kernel, before the
# send wakes the reader, so the probe's and the stamped durations differ by the path into one system call
# (microseconds), more only when the rank is preempted in between on a loaded host. A clock patched to run at
# 0.8x is off by 20% of every step. Measured on r3-mini (2 gloo ranks, the 2-core dev host): at 1-minute load
# 4.6-6.0, 128 rank-steps, max |difference| 0.031 ms; at load 9-11, 192 rank-steps, median 0.006 ms, all but
# one below 0.08 ms, one preemption of 12.1 ms in a 1.23 s step. So the audited quantity, each window's time
# (the owner's sum of its steps), must agree within 2 ms + 1%, and every step within 10 ms + 5%: a clock off by
# 2% over a 0.3 s window is refused, the 12 ms preemption seen in a 2.4 s window is not.
WINDOW_ABS_TOL_S = 0.002
WINDOW_REL_TOL = 0.01
STEP_ABS_TOL_S = 0.010
STEP_REL_TOL = 0.05
CLOCK_FUNCTIONS = (
    "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "clock_gettime",
    "clock_gettime_ns", "process_time", "thread_time",
)  # fmt: skip


class ClockCheck(BaseModel):
    """Per rank: how the probe's step and window durations compare with the independent clock."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str  # "socket": kernel send stamps of the probe's lines, read by the train worker (another process)
    steps_checked: int
    windows_checked: int
    max_step_abs_s: float  # max over steps of |probe duration - independent duration|
    max_step_rel: float  # the same relative to the independent duration
    max_window_abs_s: float  # the same over the owner's windows (sums of their steps)
    max_window_rel: float
    step_tol: tuple[float, float]  # (abs s, relative)
    window_tol: tuple[float, float]
    arrivals_file: str  # relative to the package directory
    arrivals_sha256: str


@dataclass(frozen=True)
class Disagreement:
    rank: int
    what: str  # "step 12" or "window w2 (steps 12-13)"
    probe_s: float
    independent_s: float
    tol: tuple[float, float]

    def line(self) -> str:
        return (
            f"clock disagreement: rank {self.rank} {self.what}: the probe timed {self.probe_s:.6f} s, the "
            f"train worker's independent clock {self.independent_s:.6f} s (tolerance {self.tol[0] * 1000:g} ms + "
            f"{self.tol[1]:.0%})"
        )


def independent_durations(arrivals: Sequence[tuple[int, str, int]]) -> dict[int, float]:
    """(step, 'start'|'end', stamp ns) lines -> step -> end stamp - start stamp (s); each event once."""
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for step, event, t_ns in arrivals:
        target = starts if event == "start" else ends if event == "end" else None
        if target is None or step in target:
            raise ValueError(f"clock line for step {step}: unexpected or repeated event {event!r}")
        target[step] = t_ns
    return {s: (ends[s] - starts[s]) / 1e9 for s in sorted(ends) if s in starts}


@dataclass(frozen=True)
class Comparison:
    bad: list[Disagreement]
    max_step_abs: float
    max_step_rel: float
    max_window_abs: float
    max_window_rel: float


def compare(
    rank: int, probe: Mapping[int, float], independent: Mapping[int, float], windows: Sequence[Sequence[int]],
    step_tol: tuple[float, float] = (STEP_ABS_TOL_S, STEP_REL_TOL),
    window_tol: tuple[float, float] = (WINDOW_ABS_TOL_S, WINDOW_REL_TOL),
) -> Comparison:
    """Windows first (what the audit measures), then steps; a step missing from either clock is a disagreement."""
    bad: list[Disagreement] = []
    missing = sorted(set(probe) ^ set(independent))
    for step in missing:
        bad.append(Disagreement(rank, f"step {step} (seen by one clock only)", probe.get(step, float("nan")),
                                independent.get(step, float("nan")), step_tol))
    steps = sorted(set(probe) & set(independent))
    max_sa = max_sr = max_wa = max_wr = 0.0
    for i, window in enumerate(windows):
        if any(s not in probe or s not in independent for s in window):
            continue
        p = math.fsum(probe[s] for s in window)
        q = math.fsum(independent[s] for s in window)
        diff = abs(p - q)
        max_wa, max_wr = max(max_wa, diff), max(max_wr, diff / q if q > 0 else math.inf)
        if diff > window_tol[0] + window_tol[1] * abs(q):
            bad.append(Disagreement(rank, f"window w{i + 1} (steps {window[0]}-{window[-1]})", p, q, window_tol))
    for step in steps:
        p, q = probe[step], independent[step]
        diff = abs(p - q)
        max_sa, max_sr = max(max_sa, diff), max(max_sr, diff / q if q > 0 else math.inf)
        if diff > step_tol[0] + step_tol[1] * abs(q):
            bad.append(Disagreement(rank, f"step {step}", p, q, step_tol))
    return Comparison(bad, max_sa, max_sr, max_wa, max_wr)


def read_arrivals(path: Path) -> list[tuple[int, str, int]]:
    """The train worker's stamps file: one JSON line per clock line (step, event, ns since the first)."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out.append((int(row["step"]), str(row["event"]), int(row["t_ns"])))
    return out
