"""Shared fixtures and the layout of the suite: tests/unit (fast, `make test-fast`) and tests/e2e (real trainers run end
to end, every test `slow`); the repository root, and the cuda marker's skip."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
E2E = REPO / "tests" / "e2e"


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.slow)
        elif item.get_closest_marker("slow") is not None:
            misplaced.append(item.nodeid)
    if misplaced:  # the suites stay apart: `-m "not slow"` is exactly tests/unit
        raise pytest.UsageError(f"slow tests outside tests/e2e: {', '.join(misplaced)}; move them to tests/e2e")
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def repo() -> Path:
    return REPO
