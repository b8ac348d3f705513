"""A script of bench/ imported as a module, for the unit tests of its pure parts (bench/ is not a package: its
scripts import each other by name, so bench/ is on sys.path while one is imported, and only then)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_module(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))
