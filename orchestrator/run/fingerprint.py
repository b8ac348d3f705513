"""Host fingerprint of a run: GPU model and count, driver, CUDA, torch, triton, python; the host only hashed.

Read without importing torch (package metadata and nvidia-smi), so the CPU side stays light.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.metadata
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from protocol.run_record import EarlierRun

FINGERPRINT_KEYS = ("gpu_model", "gpu_count", "driver", "cuda", "torch", "triton", "python")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _nvidia_smi() -> tuple[str, int, str, str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "none", 0, "none", "none"
    try:
        q = subprocess.run(
            [smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False,
        )
        head = subprocess.run([smi], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", 0, "unknown", "unknown"
    rows = [r.split(",") for r in q.stdout.strip().splitlines() if r.strip()]
    if q.returncode != 0 or not rows:
        return "none", 0, "none", "none"
    models = sorted({r[0].strip() for r in rows})
    m = re.search(r"CUDA Version:\s*([0-9.]+)", head.stdout)
    return " + ".join(models), len(rows), rows[0][1].strip(), m.group(1) if m else "unknown"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else platform.processor()); "unknown" when neither says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu_uuids(host_hash: str) -> str:
    """The GPUs' UUIDs, sorted, as an HMAC keyed by the host hash (never in clear); "none" without a GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "none"
    try:
        q = subprocess.run([smi, "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    ids = sorted(u.strip() for u in q.stdout.splitlines() if u.strip())
    if q.returncode != 0 or not ids:
        return "none"
    return hmac.new(host_hash.encode(), ",".join(ids).encode(), hashlib.sha256).hexdigest()


def host_fingerprint(host_hash: str) -> dict[str, Any]:
    model, count, driver, cuda = _nvidia_smi()
    return {
        "gpu_model": model,
        "gpu_count": count,
        "driver": driver,
        "cuda": cuda,
        "torch": _version("torch"),
        "triton": _version("triton"),
        "python": platform.python_version(),
        "host_hash": host_hash,
        # issue 52: an A/A calibration speaks for a run only on the same CPU, kernel and GPUs
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "gpu_uuids": gpu_uuids(host_hash),
    }


def last_run_fingerprint(runs_dir: Path) -> tuple[str, dict[str, Any]] | None:
    """(run_id, host fingerprint) of the most recently started earlier run, if any."""
    best: tuple[str, str, dict[str, Any]] | None = None
    if not runs_dir.is_dir():
        return None
    for run_json in runs_dir.glob("*/run.json"):
        run = EarlierRun.read(run_json)
        if run is not None and run.host is not None and (best is None or run.started > best[0]):
            best = (run.started, run.run_id or run_json.parent.name, run.host)
    return None if best is None else (best[1], best[2])


def fingerprint_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    keys = (*FINGERPRINT_KEYS, "host_hash")
    return [f"{k}: {old.get(k)} -> {new.get(k)}" for k in keys if old.get(k) != new.get(k)]
