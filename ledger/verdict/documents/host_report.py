"""The quiet-host report of a run, shown beside the noise: per train launch, what else the host was doing.

Read from each train package's result (protocol.host.quiet_host); observation only, names of processes only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from protocol.host.quiet_host import GpuState
from protocol.results import TrainResult

# why a snapshot taken inside the package's PID namespace names no foreign process: it cannot see one
HIDDEN = ("not visible from inside the package's PID namespace (the host watch, outside it, names what ran beside "
          "the ranks)")


def _gpu(states: Sequence[GpuState]) -> list[dict[str, Any]]:
    return [
        {"index": g.index, "sm_mhz": g.sm_mhz, "mem_mhz": g.mem_mhz, "temperature_c": g.temperature_c,
         "power_w": g.power_w, "throttle": list(g.throttle), "foreign": [f.name for f in g.foreign]}
        for g in states
    ]  # fmt: skip


def quiet_host_doc(trains: Mapping[str, TrainResult], labels: Sequence[str]) -> dict[str, Any]:
    launches: dict[str, Any] = {}
    loads: list[float] = []
    steals: list[float] = []
    foreign: dict[str, float] = {}
    sm: list[int] = []
    throttles: set[str] = set()
    gpu_foreign: set[str] = set()
    gpu_note = "not recorded"
    hidden = False  # a snapshot taken inside the package's own PID namespace sees no other process
    for label in labels:
        q = trains[label].quiet_host
        if q is None:
            continue
        gpu_note = q.gpu_note
        launches[label] = {
            "load_start": q.load_start, "load_end": q.load_end, "steal": q.steal,
            "busy_foreign": [{"name": p.name, "core_share": p.core_share} for p in q.busy_foreign],
            "gpus_start": _gpu(q.gpus_start), "gpus_end": _gpu(q.gpus_end),
        }  # fmt: skip
        if q.own_pid_namespace is not None:  # recorded since it was known (older records read as they were)
            launches[label]["own_pid_namespace"] = q.own_pid_namespace
        hidden = hidden or bool(q.own_pid_namespace)
        loads += [q.load_start[0], q.load_end[0]]
        if q.steal is not None:
            steals.append(q.steal)
        for p in q.busy_foreign:
            foreign[p.name] = max(foreign.get(p.name, 0.0), p.core_share)
        for g in (*q.gpus_start, *q.gpus_end):
            if g.sm_mhz is not None:
                sm.append(g.sm_mhz)
            throttles.update(t for t in g.throttle if t != "gpu_idle")
            gpu_foreign.update(f.name for f in g.foreign)
    if not launches:
        return {"launches": {}, "words": "no quiet-host report (packages recorded before it existed)"}
    parts = [f"1-minute load {min(loads):.2f}-{max(loads):.2f}"]
    parts.append(f"CPU steal up to {max(steals):.2%}" if steals else "CPU steal unknown")
    top = sorted(foreign.items(), key=lambda kv: -kv[1])[:3]
    if hidden and not top:
        parts.append(f"foreign processes: {HIDDEN}")
    else:
        parts.append(
            "busiest foreign processes " + ", ".join(f"{n} {s:.0%} of a core" for n, s in top) if top
            else "no busy foreign process"
        )
    if sm:
        parts.append(f"SM clock {min(sm)}-{max(sm)} MHz")
        parts.append("throttle reasons: " + (", ".join(sorted(throttles)) if throttles else "none"))
        parts.append("foreign GPU processes: " + (", ".join(sorted(gpu_foreign)) if gpu_foreign
                                                  else HIDDEN if hidden else "none"))
    else:
        parts.append(f"GPU: {gpu_note}")
    return {"launches": launches, "words": "; ".join(parts) + " (observed at each train launch's start and end)"}


def clock_doc(trains: Mapping[str, TrainResult], labels: Sequence[str]) -> dict[str, Any]:
    """How the probe's step times compared with the train worker's independent clock, over every launch."""
    checks = [(label, r.rank, r.clock) for label in labels for r in trains[label].ranks]
    seen = [(label, rank, c) for label, rank, c in checks if c is not None]
    if not seen:
        return {"checked": False, "words": "step times were not cross-checked (packages recorded before the check)"}
    w = max(seen, key=lambda x: x[2].max_window_abs_s)
    st = max(seen, key=lambda x: x[2].max_step_abs_s)
    c = w[2]
    missing = len(checks) - len(seen)
    return {
        "checked": missing == 0,
        "max_window_abs_s": c.max_window_abs_s,
        "max_window_rel": max(x[2].max_window_rel for x in seen),
        "max_step_abs_s": st[2].max_step_abs_s,
        "window_tol": list(c.window_tol),
        "step_tol": list(c.step_tol),
        "words": (
            f"every window and step of {len(seen)} rank launch(es) agreed with the train worker's independent "
            f"clock: max |difference| {c.max_window_abs_s * 1000:.3f} ms per window (launch {w[0]} rank {w[1]}; "
            f"tolerance {c.window_tol[0] * 1000:g} ms + {c.window_tol[1]:.0%}), {st[2].max_step_abs_s * 1000:.3f} ms "
            f"per step (tolerance {c.step_tol[0] * 1000:g} ms + {c.step_tol[1]:.0%})"
            + (f"; {missing} rank launch(es) unchecked" if missing else "")
        ),
    }
