"""The probe on a trainer with upstream's compiled flex_attention (tests/fixtures/flex_trainer.py), watched and not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _probe_flex(out: Path, watch_steps: str) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLEX_FP16_STEP": "1", "FLEX_HALF_SCORE_STEP": "2"}
    cmd = [
        sys.executable, "-m", "workers.probe", "--out", str(out), "--steps", "4", "--digest-steps", "0-3",
        "--watch-steps", watch_steps, "--", "flex_trainer.py",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO / "tests" / "fixtures", env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(x) for x in (out / "steps.rank0.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_probe_records_compiled_flex_attention_per_step_and_changes_no_bits(tmp_path: Path) -> None:
    """The probe on a trainer with upstream's compiled flex_attention: per step, what the watch let through and
    could not inspect; the float16 inputs (step 1) and the float16 score_mod (step 2) named; digests of every
    step equal to a run with no watch at all."""
    watched = _probe_flex(tmp_path / "watched", "0-2")
    plain = _probe_flex(tmp_path / "plain", "none")
    assert [r["digests"] for r in watched] == [r["digests"] for r in plain]
    region = "compiled:flex_attention.py:flex_attention"
    assert [r["watched"] for r in watched] == [True, True, True, False]
    assert all(r["hops"].get(region) == 1 for r in watched[:3]) and watched[3]["hops"] == {}
    assert all(f"{region}: backend-generated kernels (inspected as the graph handed to the backend)" in r["uninspected"]
               for r in watched[:3])  # fmt: skip
    seen = {(f["step"], f["op"], f["dtype"]) for r in watched for f in r["forbidden"]}
    assert (1, f"{region}:higher_order.flex_attention", "float16") in seen
    assert (2, f"{region}/score_mod_0:to", "float16") in seen
    assert {s for s, _, _ in seen} == {1, 2}
    assert all(r["forbidden"] == [] and r["hops"] == {} and not r["watched"] for r in plain)
