"""How busy the GPUs were in the timed windows (the host watch's NVML samples), and what that means for the verdict:
a protocol whose windows keep the GPU busy less than LAUNCH_BOUND_BELOW of the time is named launch-bound.

A launch-bound step waits on the host between kernels: its time follows the host (Python, the driver, CPU scheduling),
so it moves by 10-20% between fresh launches whatever the pinning, and the triplet's interval stays wide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from ledger.verdict.decide.evidence import RunEvidence
from ledger.verdict.decide.host_watch import load_logs
from ledger.verdict.decide.stats import Spread, expected_half_width, position_variance, triplets_needed
from protocol.host.quiet_host import HostWatchLog, WatchSample

LAUNCH_BOUND_BELOW = 0.80  # the timed windows' GPU-busy share under which a protocol is named launch-bound
GPU_BOUND_GOAL = 0.90  # what a GPU protocol sized for decisions should reach (docs/GUIDE.md)
TARGET = 0.05  # the half-width the advice sizes K for
ADVICE = (
    "make each kernel larger: a wider or deeper model, longer sequences or rollouts, or a larger batch where the "
    "recipe leaves it free, until the timed windows are at least {goal:.0%} GPU-busy (docs/GUIDE.md, 'Sizing a GPU "
    "protocol'); more triplets narrow the interval only as 1/sqrt(K)"
)


def _windows(steps: int, warmup: int, window: int) -> list[tuple[str, int, int]]:
    return [(f"w{i + 1}", s, s + window - 1) for i, s in enumerate(range(warmup, steps, window))]


def window_intervals(samples: Sequence[WatchSample], first: int, last: int) -> tuple[list[WatchSample], bool]:
    """The samples closing the watch intervals that lie inside steps first..last (step `k` runs while steps_done is
    k: at the interval's start step >= first runs, at its end step `last` has not ended), and False; where none lies
    inside (a window shorter than the interval), those that overlap the steps, and True (edge: they also hold some
    time of the steps beside)."""
    inside = [b for a, b in pairwise(samples) if a.steps_done >= first and b.steps_done <= last]
    if inside:
        return inside, False
    return [b for a, b in pairwise(samples) if a.steps_done <= last and b.steps_done >= first], True


def busy_of(closing: Sequence[WatchSample]) -> tuple[float | None, float | None, int]:
    """(mean over GPUs, least busy GPU, NVML samples) of the utilisation recorded in these intervals, each GPU's
    intervals weighted by their sample counts; (None, None, 0) when none was recorded."""
    per_gpu: dict[int, list[float]] = {}
    for s in closing:
        for u in s.gpu_util:
            acc = per_gpu.setdefault(u.index, [0.0, 0.0])
            acc[0] += u.busy * u.samples
            acc[1] += u.samples
    shares = [total / n for total, n in per_gpu.values() if n > 0]
    if not shares:
        return None, None, 0
    return round(math.fsum(shares) / len(shares), 4), round(min(shares), 4), int(sum(n for _, n in per_gpu.values()))


def launch_busy(log: HostWatchLog, steps: int, warmup: int, window: int) -> dict[str, Any]:
    """One train launch: GPU-busy per window, over all timed steps, and over the whole package."""
    windows = {}
    for name, a, b in _windows(steps, warmup, window):
        closing, edge = window_intervals(log.samples, a, b)
        mean, least, n = busy_of(closing)
        windows[name] = {"steps": [a, b], "busy": mean, "least_gpu": least, "samples": n, "edge": edge}
    closing, edge = window_intervals(log.samples, warmup, steps - 1)
    timed, least, n = busy_of(closing)
    whole = busy_of(log.samples)[0]
    return {"query": log.gpu_util_query, "gpus": list(log.gpus), "windows": windows, "timed": timed,
            "timed_least_gpu": least, "timed_samples": n, "package": whole}  # fmt: skip


def expected_width(calibration: Spread | None) -> dict[str, Any]:
    """The K = 1 half-width a calibration gives (relative, 95%), and the triplets for +-TARGET."""
    if calibration is None or calibration.df <= 0:
        return {"k1_half_width": None, "triplets_for_target": None, "calibration_sd": None}
    return {"k1_half_width": round(expected_half_width(calibration, 1), 6), "calibration_sd": round(calibration.sd, 6),
            "calibration_df": calibration.df,
            "triplets_for_target": triplets_needed(calibration.sd, calibration.df, target=TARGET,
                                                   carried=position_variance(calibration))}  # fmt: skip


def gpu_busy_block(logs: Mapping[str, HostWatchLog | None], labels: Sequence[str], steps: int, warmup: int,
                   window: int, calibration: Spread | None) -> dict[str, Any] | None:  # fmt: skip
    """The audit's "gpu_busy" block; None when no launch watched a GPU's utilisation (a CPU protocol, or packages
    recorded before it was sampled): the audit then has no such block, as before."""
    gpu_logs = {x: log for x in labels if (log := logs.get(x)) is not None and log.gpus and log.gpu_util_query}
    if not gpu_logs:
        return None
    launches = {x: launch_busy(log, steps, warmup, window) for x, log in gpu_logs.items()}
    timed = [v["timed"] for v in launches.values() if v["timed"] is not None]
    busy = round(math.fsum(timed) / len(timed), 4) if timed else None
    least = min(timed) if timed else None
    block: dict[str, Any] = {
        "threshold": LAUNCH_BOUND_BELOW, "goal": GPU_BOUND_GOAL, "launches": launches, "timed_busy": busy,
        "least_launch": least, "unread": [x for x in labels if x not in launches or launches[x]["timed"] is None],
        "launch_bound": None if busy is None else busy < LAUNCH_BOUND_BELOW, "expected": expected_width(calibration),
    }  # fmt: skip
    block["words"] = busy_words(block)
    return block


def busy_words(block: Mapping[str, Any]) -> str:
    """One paragraph: how busy the timed windows were, the class, the width to expect, what to change."""
    if block["timed_busy"] is None:
        queries = sorted({str(v["query"]) for v in block["launches"].values()})
        return f"GPU-busy was not read in the timed windows ({'; '.join(queries)})"
    worst = min(((x, name, w["busy"]) for x, v in block["launches"].items() for name, w in v["windows"].items()
                 if w["busy"] is not None), key=lambda t: t[2], default=None)  # fmt: skip
    head = f"the GPU was busy {block['timed_busy']:.0%} of the timed windows (mean over the train launches"
    head += f"; least: train-{worst[0]} {worst[1]} {worst[2]:.0%})" if worst else ")"
    exp = block["expected"]
    width = ("" if exp["k1_half_width"] is None else
             f"; this host's calibration (SD {exp['calibration_sd']:.4f}, df {exp['calibration_df']:g}) gives a K = 1 "
             f"interval of +-{exp['k1_half_width']:.1%} for a candidate whose steps are as steady as the baseline's"
             + (f" (+-{TARGET:.0%} is out of reach at any K: more A/A launches narrow it)"
                if exp["triplets_for_target"] is None else
                f" (+-{TARGET:.0%} needs K = {exp['triplets_for_target']})"))  # fmt: skip
    if not block["launch_bound"]:
        short = block["timed_busy"] < block["goal"]
        goal = f" (below the {block['goal']:.0%} goal of a protocol sized for decisions)" if short else ""
        return head + f": GPU-bound{goal}" + width
    if exp["k1_half_width"] is None:
        width = ("; no calibration of this workload on this host: `orch calibrate PROTOCOL --repeats 3` measures the "
                 "width to expect")
    return (head + f": launch-bound (under {block['threshold']:.0%}): the step waits on the host between kernels, so "
            "its time follows the host and moves between fresh launches" + width + "; to decide small differences, "
            + ADVICE.format(goal=block["goal"]))


def gpu_busy_doc(ev: RunEvidence, labels: Sequence[str], calibration: Spread | None) -> dict[str, Any] | None:
    """The audit's "gpu_busy" block of one run, from the recorded host watch files (checked by the integrity step)."""
    m = ev.protocol.measurement
    return gpu_busy_block(load_logs(ev, labels)[0], labels, m.steps, m.warmup, m.window, calibration)
