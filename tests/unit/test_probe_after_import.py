"""workers.probe._AfterImport: the probe is installed when the trainer's import of torch runs, even after a library
asked importlib.util.find_spec for torch first (transformers' availability check does, before importing it)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from workers.probe import _AfterImport


@pytest.fixture
def fresh_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "orch_probe_after_import_target"
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def _finder(name: str, seen: list[Any], monkeypatch: pytest.MonkeyPatch) -> _AfterImport:
    finder = _AfterImport(name, seen.append)
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    return finder


def test_then_runs_after_the_import(fresh_module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    finder = _finder(fresh_module, seen, monkeypatch)
    module = importlib.import_module(fresh_module)
    assert seen == [module]
    assert finder not in sys.meta_path


def test_an_availability_check_first_does_not_consume_the_finder(
    fresh_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    finder = _finder(fresh_module, seen, monkeypatch)
    assert importlib.util.find_spec(fresh_module) is not None  # as transformers' _is_package_available does
    assert seen == [] and finder in sys.meta_path
    module = importlib.import_module(fresh_module)
    assert seen == [module]
    assert finder not in sys.meta_path
