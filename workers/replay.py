"""The watched replay: the candidate's trainer launched again, untimed, with the forbidden-dtype watch on the steps
train-C did not watch (watch_from..end; train-C watched the warm-up), or on every step (watch_from 0).

Usage: python -m workers.replay --spec package.json -> result.json (orch.train/2, no checkpoint). Its per-step
digests must equal train-C's (it replayed the same computation); any forbidden op it sees is named with its step.
"""

from __future__ import annotations

import sys

from workers.common import WorkerFailed, run_entry_point
from workers.train import run


def main(argv: list[str] | None = None) -> int:
    def watched(spec: object) -> object:
        if not getattr(spec, "watch_all", False):
            raise WorkerFailed("replay spec must set watch_all (the replay watches every step)")
        return run(spec)  # type: ignore[arg-type]

    spec, _ = run_entry_point("replay", watched, argv)  # type: ignore[arg-type]
    first = getattr(spec, "watch_from", 0)
    print(f"replay {spec.arm_label}: {spec.nproc} ranks x {spec.steps} steps, steps {first}-{spec.steps - 1} watched")
    return 0


if __name__ == "__main__":
    sys.exit(main())
