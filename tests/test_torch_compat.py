"""The rehearsal's torch compatibility shim (workers/rehearsal/shim/orch_torch_compat.py): without it, upstream's
FSDP2 reference forward under inference_mode fails when the shard group has one rank; with it (the documented way:
the shim folder on PYTHONPATH) the same forward runs, in inference mode, and every output and every parameter
after three training steps is bitwise equal to the same run with the reference forward under plain no_grad."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
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


def _python(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ORCH_TORCH_COMPAT")}
    done = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    return done.stdout.strip()


CHECK = (
    "import sys; import torch.distributed.fsdp._fully_shard._fsdp_param_group as g; "
    "print(getattr(g.FSDPParamGroup.wait_for_unshard, '_orch_torch_compat', False), "
    "'orch_torch_compat' in sys.modules)"
)


def test_shim_is_on_only_from_its_folder_on_pythonpath_and_can_be_switched_off() -> None:
    assert _python(CHECK, PYTHONPATH=str(SHIM)) == "True True"
    assert _python(CHECK, PYTHONPATH=str(SHIM), ORCH_TORCH_COMPAT="none") == "False True"


def test_shim_imports_no_torch_and_keeps_a_shadowed_sitecustomize(tmp_path: Path) -> None:
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_SITECUSTOMIZE'] = 'ran'\n")
    code = "import os, sys; print(os.environ.get('SHADOWED_SITECUSTOMIZE'), 'torch' in sys.modules)"
    assert _python(code, PYTHONPATH=os.pathsep.join([str(SHIM), str(other)])) == "ran False"
