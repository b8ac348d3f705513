"""The rehearsal's torch compatibility shim (workers/rehearsal/shim/orch_torch_compat.py): without it, upstream's
FSDP2 reference forward under inference_mode fails when the shard group has one rank; with it (the documented way:
the shim folder on PYTHONPATH) the same forward runs, in inference mode, and every output and every parameter
after three training steps is bitwise equal to the same run with the reference forward under plain no_grad."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "workers" / "rehearsal" / "shim"
FIXTURE = REPO / "tests" / "fixtures" / "fsdp_ref_forward.py"
ERROR = "Inference tensors do not track version counter"


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
