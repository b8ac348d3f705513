"""Parts of the r3-mini reference workload that need no training run: the judge (in process and as a server, any
batching) and the two diagnostics of the checks package (graph_diag's static output, the Triton top-k filter in
interpreter mode)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "examples" / "r3_mini"
PY = sys.executable


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("R3_FUSE_")}
    env.update(OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def test_judge_server_and_batching_give_the_same_rewards():
    sys.path.insert(0, str(SOURCE))
    try:
        import numpy as np
        from train.reward_func import RewardClient
    finally:
        sys.path.remove(str(SOURCE))
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((7, 16, 64)).astype(np.float32)
    metas = [{"color": i % 8, "count": 1 + i % 4, "object": i} for i in range(7)]
    results = []
    for mode, batch in (("inprocess", 1), ("inprocess", 4), ("server", 1), ("server", 3)):
        client = RewardClient(mode, batch, judge_seed=42)
        try:
            results.append([f.result() for f in client.submit(latents, metas)])
        finally:
            client.close()
    assert all(r == results[0] for r in results) and len(set(results[0])) > 1


def test_graph_diag_output_is_deterministic():
    outs = [
        subprocess.run(
            [PY, "train/graph_diag.py"], cwd=SOURCE, env=_env(), capture_output=True, text=True, check=True
        )
        for _ in range(2)
    ]
    assert outs[0].stdout == outs[1].stdout
    assert "# decode step ops" in outs[0].stdout and "aten.mm" in outs[0].stdout


def test_triton_diagnostic_in_interpreter_mode():
    pytest.importorskip("triton")
    env = {**_env(), "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [PY, "-m", "train.diagnostics", "--device", "cpu", "--trials", "6"],
        cwd=SOURCE, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout and "max_ulp=0" in proc.stdout
