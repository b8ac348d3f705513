"""The digest's Triton kernels (the probe's table kernel per launch group, the per-tensor and two-launch paths) run
on CPU through Triton's interpreter and equal the NumPy reference for several block sizes, grids, launch-group
schedules and the forced wide arithmetic: the GPU path's integer exactness proven where there is no GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parents[1] / "digest_interpret.py"


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_kernels_equal_the_numpy_reference_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["bad"] == []
    # 2 sets of 22 tensors: 4 table schedules x 2 + per-tensor + two-launch + wide (seed 0: 3 configs x 2 + 3)
    assert doc["compared"] == 22 * (3 * 2 + 3) + 22 * (1 * 2 + 3)


def test_the_check_refuses_to_run_without_the_interpreter() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode != 0 and "set TRITON_INTERPRET=1" in out.stderr
