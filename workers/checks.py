"""The checks package: environment versions, the protocol's prepare and diagnostic commands, the static graph
diagnostic against its recorded digest, and the precision policy. Usage: python -m workers.checks --spec package.json
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path

from protocol.package import ChecksSpec, CommandSpec, PackageSpec
from protocol.results import ChecksResult, Diagnostic
from workers.common import fail, run_entry_point
from workers.trainer_path import trainer_env

ALLOWED_PRECISION = ("fp32", "bf16")


def torch_build() -> dict[str, str] | None:
    """torch's version and CUDA build from its `torch/version.py` (what `torch.__version__` and `torch.version.cuda`
    return), read without importing torch: a CPU package then spends no second on torch's import; None if absent."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        found = runpy.run_path(str(Path(spec.submodule_search_locations[0]) / "version.py"))
    except (OSError, SyntaxError):
        return None
    return {"torch": str(found["__version__"]), "cuda": str(found.get("cuda") or "none")}


def versions() -> dict[str, str]:
    """python, torch, triton, CUDA, driver, GPU model and count, as the sealed worker sees them. A package granted no
    GPU (CUDA_VISIBLE_DEVICES empty, as gpu-run sets for CPU slots) sees none: torch is not imported for that."""
    out = {"python": platform.python_version()}
    build = torch_build() if os.environ.get("CUDA_VISIBLE_DEVICES") == "" else None
    if build is not None:
        out |= build | {"gpu_count": "0", "gpu_model": "none"}
    else:
        try:
            import torch

            out["torch"] = torch.__version__
            out["cuda"] = str(torch.version.cuda or "none")
            out["gpu_count"] = str(torch.cuda.device_count() if torch.cuda.is_available() else 0)
            out["gpu_model"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
        except ImportError:
            out["torch"] = "absent"
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = "absent"
    out["driver"] = "none"
    if shutil.which("nvidia-smi"):
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if q.returncode == 0 and q.stdout.strip():
            out["driver"] = q.stdout.strip().splitlines()[0]
    return out


def run_command(spec: PackageSpec, cmd: CommandSpec) -> Diagnostic:
    """Runs one command in the sealed copy; ok = exit 0 and, when a digest is recorded, stdout matches it."""
    started = time.monotonic()
    proc = subprocess.run(cmd.argv, cwd=spec.sealed_dir, capture_output=True, stdin=subprocess.DEVNULL, check=False,
                          env=trainer_env())
    wall = round(time.monotonic() - started, 3)
    digest = hashlib.sha256(proc.stdout).hexdigest()
    ok = proc.returncode == 0 and (cmd.expect_sha256 is None or digest == cmd.expect_sha256)
    detail = ""
    if proc.returncode != 0:
        detail = f"exit {proc.returncode}: " + proc.stderr.decode(errors="replace").strip()[-500:]
    elif not ok:
        detail = f"stdout sha256 {digest} differs from the recorded {cmd.expect_sha256}"
    return Diagnostic(
        name=cmd.name, command=cmd.argv, ok=ok, exit_code=proc.returncode, output_sha256=digest,
        expected_sha256=cmd.expect_sha256, detail=detail, wall_s=wall,
    )  # fmt: skip


def precision_policy(spec: PackageSpec) -> tuple[bool, str]:
    if spec.precision not in ALLOWED_PRECISION:
        return False, f"precision {spec.precision!r} is not allowed (fp32 or bf16 only; no fp16, fp8 or int8)"
    if spec.precision == "bf16" and spec.device == "cuda":
        import torch

        if not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
            return False, "bf16 requested but this device does not support it"
    return True, f"{spec.precision} on {spec.device}"


def run(spec: PackageSpec) -> ChecksResult:
    prepare = [run_command(spec, c) for c in spec.prepare]
    found = versions()
    # the owner's rule: rerun the GPU diagnostics after upgrades. A later A/A launch of one calibration skips them
    # only under exactly the versions its first launch passed them under; any difference runs them again
    earlier = spec.diagnosed if isinstance(spec, ChecksSpec) else None
    left_to = earlier.run_id if earlier is not None and earlier.versions == found else None
    diagnostics = []
    if left_to is None and all(d.ok for d in prepare):
        diagnostics = [run_command(spec, c) for c in spec.diagnostics]
        if spec.static_graph is not None:
            diagnostics.append(run_command(spec, spec.static_graph))
    ok, detail = precision_policy(spec)
    return ChecksResult(
        versions=found, prepare=prepare, diagnostics=diagnostics, precision_ok=ok, precision_detail=detail,
        diagnosed_by=left_to,
    )


def main(argv: list[str] | None = None) -> int:
    spec, result = run_entry_point("checks", run, argv)
    failed = [d.name for d in [*result.prepare, *result.diagnostics] if not d.ok]
    if failed or not result.precision_ok:
        why = ", ".join(failed) if failed else result.precision_detail
        fail(f"checks: failed: {why}; see {spec.result_path}")
    ran = [*result.prepare, *result.diagnostics]
    took = ", ".join(f"{d.name} {d.wall_s:.1f} s" for d in ran if d.wall_s is not None)
    by = "" if result.diagnosed_by is None else (
        f"; the diagnostics not run again: run {result.diagnosed_by} passed them under the same versions")
    print(f"checks: {len(result.prepare)} prepare, {len(result.diagnostics)} diagnostics ok, {result.precision_detail}"
          + (f" ({took})" if took else "") + by)
    return 0


if __name__ == "__main__":
    sys.exit(main())
