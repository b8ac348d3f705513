"""Runs at every interpreter start with workers/rehearsal/shim on PYTHONPATH (rehearsals only): installs the
torch compatibility shim (orch_torch_compat, lazily, on torch's FSDP2 import), then the sitecustomize it shadows.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

import orch_torch_compat

orch_torch_compat.install()

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here]
)
if _spec is not None and _spec.loader is not None and _spec.origin != os.path.abspath(__file__):
    _shadowed = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_shadowed)  # e.g. a distribution's own sitecustomize keeps working
