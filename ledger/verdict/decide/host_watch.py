"""The host watched during the windows: each train launch's host_watch.json (orch's samples) summarised per window,
and every window whose foreign load passed the threshold named in one sentence (busy_windows).

The summary is computed from the recorded file, whose SHA256 run.json holds; host_watch_problems checks it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from pydantic import ValidationError

from ledger.verdict.decide.evidence import RunEvidence
from protocol.hashing import sha256_file
from protocol.host.quiet_host import HostWatchLog, WatchSample

# A window is busy when, averaged over the window, foreign processes used more than CPU_SHARE_MAX of the cores of
# the busiest rank (its pinned block; all of orch's cores when the ranks are not pinned), or when any foreign
# process held one of the package's GPUs at a sample inside it.
CPU_SHARE_MAX = 0.5
GPU_FOREIGN_MAX = 0
TOP = 5  # foreign process names listed per window
THRESHOLD_WORDS = (
    f"busy: foreign processes used more than {CPU_SHARE_MAX:.0%} of the busiest rank's cores on average over the "
    "window (cores of its pinned block, else every core), or a foreign process held one of the package's GPUs"
)


def _windows(steps: int, warmup: int, window: int) -> list[tuple[str, int, int]]:
    return [(f"w{i + 1}", s, s + window - 1) for i, s in enumerate(range(warmup, steps, window))]


def _intervals(samples: Sequence[WatchSample], first: int, last: int) -> list[tuple[WatchSample, WatchSample]]:
    """The (previous, this) sample pairs whose interval overlaps steps first..last: a step `k` was running while
    `steps_done` was k, so the interval ran steps prev.steps_done..this.steps_done. An interval across a window's
    edge counts for both windows (a noise episode at the edge is not lost)."""
    return [(a, b) for a, b in pairwise(samples) if a.steps_done <= last and b.steps_done >= first]


def window_figures(log: HostWatchLog, first: int, last: int) -> dict[str, Any]:
    """Per window: seconds sampled, foreign CPU (cores' worth) on the ranks' cores and elsewhere, the share of the
    busiest rank's cores, the busiest foreign processes, foreign GPU processes (names only)."""
    pairs = _intervals(log.samples, first, last)
    seconds = math.fsum(b.t_s - a.t_s for a, b in pairs)
    per_core: dict[int, float] = {}
    other = 0.0
    names: dict[str, float] = {}
    gpu: set[str] = set()
    unresolved = 0
    blocks: set[tuple[int, ...]] = set()
    for a, b in pairs:
        for core, s in b.foreign_s.items():
            per_core[int(core)] = per_core.get(int(core), 0.0) + s
        other += b.other_s
        for p in b.top:
            names[p.name] = names.get(p.name, 0.0) + p.cpu_s
        for g in (*a.gpu_foreign, *b.gpu_foreign):
            gpu.add(f"{g.name} (GPU {g.index})")
        unresolved = max(unresolved, a.gpu_unresolved, b.gpu_unresolved)
        blocks.update(tuple(x) for x in b.blocks)
    cores = [list(x) for x in sorted(blocks)] or [list(log.cpus)]
    share = 0.0
    if seconds > 0:
        share = max(math.fsum(per_core.get(c, 0.0) for c in block) / (seconds * len(block)) for block in cores)
    top = sorted(names.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]
    return {
        "steps": [first, last],
        "intervals": len(pairs),
        "seconds": round(seconds, 4),
        "cpu_share": round(share, 4),
        "foreign_cores": round(math.fsum(per_core.values()) / seconds, 4) if seconds > 0 else 0.0,
        "other_cores": round(other / seconds, 4) if seconds > 0 else 0.0,
        "blocks": cores,
        "top": [{"name": n, "cores": round(s / seconds, 4) if seconds > 0 else 0.0} for n, s in top],
        "gpu_foreign": sorted(gpu),
        "gpu_unresolved": unresolved,
    }


def launch_figures(log: HostWatchLog, steps: int, warmup: int, window: int) -> dict[str, Any]:
    return {
        "watched": True,
        "interval_s": log.interval_s,
        "samples": len(log.samples),
        "sampler_cpu_s": log.sampler_cpu_s,
        "sampler_core_share": round(log.sampler_cpu_s / log.wall_s, 4) if log.wall_s > 0 else 0.0,
        "cpu_query": log.cpu_query,
        "gpu_query": log.gpu_query,
        "gpus": list(log.gpus),
        "windows": {name: window_figures(log, a, b) for name, a, b in _windows(steps, warmup, window)},
    }


def _is_busy(w: Mapping[str, Any], threshold: Mapping[str, Any]) -> bool:
    return bool(w["cpu_share"] > threshold["cpu_share"] or len(w["gpu_foreign"]) > threshold["gpu_foreign"])


def busy_windows(block: Mapping[str, Any]) -> list[str]:
    """One sentence per busy window of the block (recomputed from its figures and its threshold), naming the train
    launch, the window and the figures; [] when no window was busy (or the block watched nothing)."""
    threshold = block.get("threshold") or {"cpu_share": CPU_SHARE_MAX, "gpu_foreign": GPU_FOREIGN_MAX}
    out = []
    for label, launch in (block.get("launches") or {}).items():
        if not launch.get("watched"):
            continue
        for name, w in launch["windows"].items():
            if not _is_busy(w, threshold):
                continue
            top = ", ".join(f"{p['name']} {p['cores']:.2f}" for p in w["top"]) or "none"
            gpu = ", ".join(w["gpu_foreign"]) or "none"
            out.append(
                f"train-{label} {name} (steps {w['steps'][0]}-{w['steps'][1]}): foreign processes used "
                f"{w['cpu_share']:.0%} of the busiest rank's cores ({w['foreign_cores']:.2f} cores on the ranks' "
                f"cores, {w['other_cores']:.2f} elsewhere; busiest: {top}); foreign GPU processes: {gpu}"
            )
    return out


def host_watch_block(
    logs: Mapping[str, HostWatchLog | None], labels: Sequence[str], steps: int, warmup: int, window: int
) -> dict[str, Any]:
    """The audit's "host_watch" block from each launch's samples (None: not recorded for that launch)."""
    launches: dict[str, Any] = {}
    for label in labels:
        log = logs.get(label)
        launches[label] = {"watched": False} if log is None else launch_figures(log, steps, warmup, window)
    block: dict[str, Any] = {
        "threshold": {"cpu_share": CPU_SHARE_MAX, "gpu_foreign": GPU_FOREIGN_MAX, "words": THRESHOLD_WORDS},
        "launches": launches,
        "unwatched": [label for label in labels if not launches[label]["watched"]],
    }
    block["busy"] = busy_windows(block)
    block["words"] = _words(block)
    return block


def _words(block: Mapping[str, Any]) -> str:
    watched = [(label, x) for label, x in block["launches"].items() if x["watched"]]
    if not watched:
        return "the host was not watched during the windows (packages recorded before the watch)"
    worst = max(((label, name, w) for label, x in watched for name, w in x["windows"].items()),
                key=lambda t: t[2]["cpu_share"], default=None)  # fmt: skip
    overhead = max(x["sampler_core_share"] for _, x in watched)
    parts = [f"{len(block['busy'])} busy window(s)" if block["busy"] else "no busy window"]
    if worst is not None:
        parts.append(f"highest foreign share of the ranks' cores {worst[2]['cpu_share']:.0%} (train-{worst[0]} "
                     f"{worst[1]})")
    if block["unwatched"]:
        parts.append("not watched: " + ", ".join(f"train-{label}" for label in block["unwatched"]))
    parts.append(f"sampler overhead up to {overhead:.1%} of a core")
    return "; ".join(parts) + f" (threshold: more than {CPU_SHARE_MAX:.0%} of a rank's cores, or a foreign GPU process)"


def load_logs(ev: RunEvidence, labels: Sequence[str]) -> tuple[dict[str, HostWatchLog | None], list[str]]:
    """Each train launch's host_watch.json as run.json references it, checked against its recorded SHA256."""
    logs: dict[str, HostWatchLog | None] = {}
    problems: list[str] = []
    for label in labels:
        name = f"train-{label}"
        entry = ev.run.package(name)
        ref = None if entry is None else entry.host_watch
        logs[label] = None
        if ref is None:
            continue
        path = ev.run_dir / "packages" / name / ref.file
        rel = f"packages/{name}/{ref.file}"
        if not path.is_file():
            problems.append(f"{rel}: missing (run.json records its sha256)")
            continue
        if sha256_file(path) != ref.sha256:
            problems.append(f"{rel}: sha256 is not the one run.json recorded (the host watch's samples were altered)")
            continue
        try:
            logs[label] = HostWatchLog.model_validate_json(path.read_bytes())
        except ValidationError as err:
            problems.append(f"{rel}: malformed ({err.errors()[0]['msg']})")
    return logs, problems


def host_watch_problems(ev: RunEvidence, labels: Sequence[str]) -> list[str]:
    """For the integrity check: every recorded host_watch.json present, unaltered and well formed."""
    return load_logs(ev, labels)[1]


def host_watch_doc(ev: RunEvidence, labels: Sequence[str]) -> dict[str, Any]:
    """The audit's "host_watch" block of one run, from its recorded samples."""
    m = ev.protocol.measurement
    return host_watch_block(load_logs(ev, labels)[0], labels, m.steps, m.warmup, m.window)
