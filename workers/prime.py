"""The prime package: the baseline's trainer launched once, untimed, before the first timed launch, so that every
kernel it compiles and tunes lands in the baseline's compile cache, which orch then seals for every later package.

Usage: python -m workers.prime --spec package.json -> result.json (orch.train/2, no checkpoint, never compared).
"""

from __future__ import annotations

import sys

from workers.common import run_entry_point
from workers.train import run


def main(argv: list[str] | None = None) -> int:
    spec, _ = run_entry_point("prime", run, argv)  # type: ignore[arg-type]
    print(f"prime: {spec.nproc} ranks x {spec.steps} steps of the baseline, compile cache filled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
