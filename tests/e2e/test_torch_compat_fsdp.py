"""The rehearsal's torch compatibility shim on upstream's FSDP2 reference forward under torchrun (1 rank; 2 ranks on a
(2, 1) mesh): without it the inference-mode forward fails as upstream did; with it every output and parameter is
bitwise the no_grad run's (tests/fixtures/fsdp_ref_forward.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "workers" / "rehearsal" / "shim"
FIXTURE = REPO / "tests" / "fixtures" / "fsdp_ref_forward.py"
ERROR = "Inference tensors do not track version counter"


def _launch(out: Path, nproc: int) -> list[dict[str, Any]]:
    """One torchrun: the shim importable but off (ORCH_TORCH_COMPAT=none) for the no_grad and inference runs,
    then patched in for the last run (test_shim_is_on_... checks that the folder on PYTHONPATH alone does that)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(REF_MODES="no_grad,inference,shim", PYTHONPATH=str(SHIM), ORCH_TORCH_COMPAT="none")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(FIXTURE), str(out), "full", "hybrid"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return [torch.load(f"{out}.rank{r}.pt", weights_only=False) for r in range(nproc)]


@pytest.fixture(scope="module", params=[1, 2], ids=["1rank", "2ranks"])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Any]:
    nproc = request.param
    return nproc, _launch(tmp_path_factory.mktemp(f"compat{nproc}") / "out", nproc)


@pytest.mark.slow
def test_without_the_shim_a_one_rank_shard_group_fails_as_upstream_did(runs: tuple[int, Any]) -> None:
    nproc, ranks = runs
    for rank in ranks:
        assert ERROR in rank["inference/hybrid"]["error"]  # shard group of one rank: the world-size-1 fast path
        full = rank["inference/full"]
        assert (ERROR in full["error"]) if nproc == 1 else ("error" not in full)  # 2 ranks shard: the all-gather
        assert "error" not in rank["no_grad/full"] and "error" not in rank["no_grad/hybrid"]


@pytest.mark.slow
def test_with_the_shim_inference_mode_forward_is_bitwise_the_no_grad_forward(runs: tuple[int, Any]) -> None:
    for rank in runs[1]:
        assert set(rank["compat"]) == {"fsdp_unshard_outside_inference_mode"}
        for mesh in ("full", "hybrid"):
            want, have = rank[f"no_grad/{mesh}"], rank[f"shim/{mesh}"]
            assert "error" not in have, have
            assert have["ref_inference"] == [True, True, True] and want["ref_inference"] == [False] * 3
            for key in ("ref", "policy", "params"):
                assert len(want[key]) == len(have[key]) > 0
                assert all(torch.equal(a, b) for a, b in zip(want[key], have[key], strict=True)), (mesh, key)
