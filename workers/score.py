"""The score package: runs the DEV scorer on each arm's checkpoint and seals the metrics (mode 0400).

Only the sealed file's SHA256 leaves; no metric value is printed. Usage: python -m workers.score --spec package.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from protocol.fileio import regular_sha256
from protocol.package import PackageSpec, ScoreTarget
from protocol.results import ScoreResult
from workers.common import WorkerFailed, run_entry_point, write_json
from workers.trainer_path import trainer_env


def score_target(spec: PackageSpec, target: ScoreTarget) -> dict[str, Any]:
    """Runs one scorer command; its output file and log stay in scratch, never on the terminal."""
    scratch = Path(spec.scratch_dir)
    out = scratch / f"score.{target.arm_label}.json"
    log = scratch / f"score.{target.arm_label}.log"
    argv = [a.replace("{ckpt}", target.ckpt_dir).replace("{out}", str(out)) for a in target.argv]
    with log.open("wb") as sink:
        rc = subprocess.run(
            argv, cwd=target.sealed_dir, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False,
            env=trainer_env(),
        ).returncode
    if rc != 0:
        raise WorkerFailed(f"scorer for arm {target.arm_label} exited with {rc} (its log is sealed in scratch)")
    if not out.exists():
        raise WorkerFailed(f"scorer for arm {target.arm_label} wrote no metrics file (argv must write {{out}})")
    try:
        metrics = json.loads(out.read_text())
    except json.JSONDecodeError as exc:
        raise WorkerFailed(f"scorer for arm {target.arm_label} wrote invalid JSON") from exc
    out.unlink()
    return {"arm_label": target.arm_label, "metrics": metrics}


def run(spec: PackageSpec) -> ScoreResult:
    if spec.sealed_metrics_path is None or not spec.score_targets:
        raise WorkerFailed("score spec needs sealed_metrics_path and at least one score target")
    Path(spec.scratch_dir).mkdir(parents=True, exist_ok=True)
    doc = {"schema": "orch.score.sealed/1", "targets": [score_target(spec, t) for t in spec.score_targets]}
    path = Path(spec.sealed_metrics_path)
    if path.exists():
        raise WorkerFailed(f"{path} exists already: sealed metrics are written once")
    write_json(path, doc, mode=0o400)
    return ScoreResult(sealed_file=path.name, sealed_sha256=regular_sha256(path))


def main(argv: list[str] | None = None) -> int:
    _, result = run_entry_point("score", run, argv)
    print(f"score: metrics sealed, sha256 {result.sealed_sha256}")
    return 0


if __name__ == "__main__":
    os.umask(0o077)  # sealed metrics are readable by their owner only
    sys.exit(main())
