"""What a package's start-up costs, phase by phase: from orch beginning to set it up to the end of the trainer's first
optimizer step (run.json's `startup` of each train, replay and prime package; `make bench-startup` tabulates it).

The times come from three places that share the host's clock: orch (set-up begun, worker spawned), the train worker
(its process created, torchrun started) and the probe of every rank (process created, torch imported, hooks
installed, step 0 ended). Informational only: no verdict reads them. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# phase -> (from, to) of the start-up times; a rank-side time is the latest rank's, the ranks' creation the earliest
PHASES: dict[str, tuple[str, str]] = {
    "namespace": ("isolate", "worker"),  # orch's set-up of the package (spec, namespace, folders) to its worker
    "worker": ("worker", "torchrun"),  # the worker's interpreter and imports, its step clock and host watch
    "torchrun": ("torchrun", "rank"),  # torchrun's interpreter and torch import, the rendezvous, the ranks' spawn
    "torch_import": ("rank", "torch"),  # the ranks' interpreter, the probe's start, the trainer's imports to torch
    "probe_install": ("torch", "installed"),  # the probe's hooks
    "model_build_step0": ("installed", "step0_end"),  # the trainer's model, data and optimizer, then step 0
}
WORDS = {
    "namespace": "orch's set-up, the namespace, to the worker",
    "worker": "the worker's interpreter and imports",
    "torchrun": "torchrun: interpreter, torch import, rendezvous",
    "torch_import": "the ranks' interpreter and import of torch",
    "probe_install": "the probe's hooks",
    "model_build_step0": "model build, data, optimizer, and step 0",
}


def startup_phases(orch_times: Mapping[str, float] | None, result: Any) -> dict[str, float] | None:
    """Seconds of each phase (PHASES) and `total` (set-up begun to step 0 ended) of one train package, or None when a
    time is missing (a package that failed early, a Slurm package whose ranks run on other hosts' clocks, an older
    worker)."""
    if not orch_times or result is None or not getattr(result, "startup", None):
        return None
    ranks = [r.startup for r in getattr(result, "ranks", []) if r.startup]
    keys = ("process", "torch", "installed", "step0_end")
    if not ranks or len(ranks) != len(result.ranks) or any(k not in r for r in ranks for k in keys):
        return None
    t = {**orch_times, **result.startup, "rank": min(r["process"] for r in ranks),
         **{k: max(r[k] for r in ranks) for k in keys[1:]}}
    if any(k not in t for k in ("isolate", "worker", "torchrun")):
        return None
    out = {name: round(t[b] - t[a], 3) for name, (a, b) in PHASES.items()}
    out["total"] = round(t["step0_end"] - t["isolate"], 3)
    return out
