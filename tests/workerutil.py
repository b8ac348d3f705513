"""Helpers shared by the worker tests: a package spec file, a worker run as the package runner runs it, and
train -> reload on one sealed tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from protocol.results import ReloadResult, TrainResult

REPO = Path(__file__).resolve().parents[1]


def write_spec(tmp: Path, name: str, kind: str, **fields: object) -> Path:
    base: dict[str, object] = {
        "schema": "orch.package/1", "run_id": "test", "name": name, "kind": kind, "arm_label": "A",
        "arm": "baseline", "package_dir": str(tmp / name), "sealed_dir": str(REPO / "tests" / "fixtures"),
        "scratch_dir": str(tmp / "scratch"), "ckpt_dir": str(tmp / "scratch" / "ckpt-A"),
        "result_path": str(tmp / name / "result.json"), "device": "cpu", "precision": "fp32", "nproc": 2,
        "backend": "gloo", "script": "tiny_trainer.py", "args": [], "steps": 16, "warmup": 10,
        "digest_first": 0, "digest_last": 13,
    }  # fmt: skip
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({**base, **fields}))
    return path


def run_worker(kind: str, spec: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run(
        [sys.executable, "-m", f"workers.{kind}", "--spec", str(spec)], cwd=cwd, env=env, capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip


def train_and_reload(tmp: Path, **fields: object) -> tuple[TrainResult, ReloadResult]:
    sealed = Path(str(fields.get("sealed_dir", REPO / "tests" / "fixtures")))
    train = run_worker("train", write_spec(tmp, "train-A", "train", **fields), sealed)
    assert train.returncode == 0, train.stderr
    reload = run_worker("reload", write_spec(tmp, "reload-A", "reload", **fields), sealed)
    assert reload.returncode == 0, reload.stderr
    t = TrainResult.model_validate_json((tmp / "train-A" / "result.json").read_text())
    r = ReloadResult.model_validate_json((tmp / "reload-A" / "result.json").read_text())
    return t, r
