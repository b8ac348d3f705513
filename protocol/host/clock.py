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

# The probe reads its clock between two lines, `pre_EVENT` sent just before the read and `EVENT` just after; the kernel
# stamps each on entry (before the send wakes the reader), so the true time of every read lies between the stamps of
# its two lines, whatever the scheduler does. A step's probe duration must therefore lie in [pre_end - start,
# end - pre_start] (the kernel's bracket), up to a rate tolerance. Why the bracket: with one line sent after the
# read, the stamp lagged the read by the time the rank waited for a core in between; on the 2-core dev host at
# load 7-10 (nice 5 beside busy loops) that wait reached 10-18 ms at one boundary in 3000, and it refused a
# two-node Slurm train package (a 1.18 s window 30 ms off); measured the same way, every stamp lay inside its
# bracket. A clock patched to run at 0.8x is off by 20% of every step, far outside a bracket of microseconds.
# So each window's time (the owner's sum of its steps) must lie within its bracket widened by 2 ms + 1%, and
# every step within 10 ms + 5%: a clock off by 2% over a 0.3 s window is refused. Lines of evidence written
# before the bracket (no pre_ lines) give a bracket of zero width: the former check, unchanged.
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
    max_step_abs_s: float  # max over steps of the probe duration's distance outside the kernel's bracket
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


EVENTS = ("start", "end", "pre_start", "pre_end")  # pre_X: sent just before the probe reads its clock for X


def _stamps(arrivals: Sequence[tuple[int, str, int]]) -> dict[str, dict[int, int]]:
    """event -> step -> stamp ns; each event once a step."""
    seen: dict[str, dict[int, int]] = {e: {} for e in EVENTS}
    for step, event, t_ns in arrivals:
        target = seen.get(event)
        if target is None or step in target:
            raise ValueError(f"clock line for step {step}: unexpected or repeated event {event!r}")
        target[step] = t_ns
    return seen


def independent_durations(arrivals: Sequence[tuple[int, str, int]]) -> dict[int, float]:
    """(step, event, stamp ns) lines -> step -> end stamp - start stamp (s); each event once."""
    seen = _stamps(arrivals)
    starts, ends = seen["start"], seen["end"]
    return {s: (ends[s] - starts[s]) / 1e9 for s in sorted(ends) if s in starts}


def independent_bounds(arrivals: Sequence[tuple[int, str, int]]) -> dict[int, tuple[float, float]]:
    """step -> (shortest, longest) duration (s) the kernel's stamps allow for the probe's reads: (pre_end - start,
    end - pre_start); a boundary without its pre_ line is bracketed by its one stamp."""
    seen = _stamps(arrivals)
    starts, ends = seen["start"], seen["end"]
    pre_starts, pre_ends = seen["pre_start"], seen["pre_end"]
    out = {}
    for s in sorted(ends):
        if s in starts:
            lo = pre_ends.get(s, ends[s]) - starts[s]
            hi = ends[s] - pre_starts.get(s, starts[s])
            out[s] = (lo / 1e9, hi / 1e9)
    return out


@dataclass(frozen=True)
class Comparison:
    bad: list[Disagreement]
    max_step_abs: float
    max_step_rel: float
    max_window_abs: float
    max_window_rel: float


def _outside(p: float, lo: float, hi: float) -> float:
    """How far p lies outside [lo, hi] (0 inside)."""
    return max(lo - p, p - hi, 0.0)


def compare(
    rank: int, probe: Mapping[int, float], independent: Mapping[int, float], windows: Sequence[Sequence[int]],
    step_tol: tuple[float, float] = (STEP_ABS_TOL_S, STEP_REL_TOL),
    window_tol: tuple[float, float] = (WINDOW_ABS_TOL_S, WINDOW_REL_TOL),
    bounds: Mapping[int, tuple[float, float]] | None = None,
) -> Comparison:
    """Windows first (what the audit measures), then steps; a step missing from either clock is a disagreement.
    `bounds`: each step's bracket (independent_bounds); the difference is the probe's distance outside it (without:
    outside the single value `independent`)."""
    bad: list[Disagreement] = []
    missing = sorted(set(probe) ^ set(independent))
    for step in missing:
        bad.append(Disagreement(rank, f"step {step} (seen by one clock only)", probe.get(step, float("nan")),
                                independent.get(step, float("nan")), step_tol))
    steps = sorted(set(probe) & set(independent))
    span = {s: (bounds or {}).get(s, (independent[s], independent[s])) for s in steps}
    max_sa = max_sr = max_wa = max_wr = 0.0
    for i, window in enumerate(windows):
        if any(s not in probe or s not in independent for s in window):
            continue
        p = math.fsum(probe[s] for s in window)
        q = math.fsum(independent[s] for s in window)
        diff = _outside(p, math.fsum(span[s][0] for s in window), math.fsum(span[s][1] for s in window))
        max_wa, max_wr = max(max_wa, diff), max(max_wr, diff / q if q > 0 else math.inf)
        if diff > window_tol[0] + window_tol[1] * abs(q):
            bad.append(Disagreement(rank, f"window w{i + 1} (steps {window[0]}-{window[-1]})", p, q, window_tol))
    for step in steps:
        p, q = probe[step], independent[step]
        diff = _outside(p, *span[step])
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
