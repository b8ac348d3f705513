"""The watched replay: the candidate's trainer launched again, untimed, with the forbidden-dtype watch on every step.

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
    print(f"replay {spec.arm_label}: {spec.nproc} ranks x {spec.steps} steps, every step watched")
    return 0


if __name__ == "__main__":
    sys.exit(main())
