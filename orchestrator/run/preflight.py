"""Pre-flight checks of `orch launch`, before any lock, run directory or ledger record: the worker packages.

Packages are looked up (importlib.util.find_spec), never imported: the CPU side of orch imports no torch.
"""

from __future__ import annotations

import importlib.util

from protocol.errors import RefusedError
from protocol.schema import LoadedProtocol

INSTALL = "pip install -e '.[workers]'"  # what `make install` runs


def _present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or blocked package is as good as absent
        return False


def worker_packages(device: str) -> list[str]:
    """What the packages of a protocol on `device` import: torch and safetensors, and triton on CUDA."""
    return ["torch", "safetensors", *(["triton"] if device == "cuda" else [])]


def require_worker_packages(loaded: LoadedProtocol) -> None:
    """RefusedError (exit 3, one line) naming every missing worker package and the install command."""
    missing = [name for name in worker_packages(loaded.protocol.launcher.device) if not _present(name)]
    if missing:
        raise RefusedError(
            f"missing worker package(s) {', '.join(missing)} for {loaded.path.name}: install them with "
            f"`{INSTALL}` (or `make install`); nothing was locked or recorded"
        )
