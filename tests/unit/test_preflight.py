"""orchestrator/run/preflight.py: the worker packages a protocol needs are looked up, never imported; missing ones
are refused in one line before anything is locked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.run import preflight
from protocol.errors import RefusedError
from protocol.schema import load_protocol

REPO = Path(__file__).resolve().parents[2]


def test_the_packages_of_each_device() -> None:
    assert preflight.worker_packages("cpu") == ["torch", "safetensors"]
    assert preflight.worker_packages("cuda") == ["torch", "safetensors", "triton"]


def test_missing_packages_are_named_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_protocol(REPO / "protocol" / "r3_mini.yaml")
    preflight.require_worker_packages(loaded)  # this checkout has them
    monkeypatch.setattr(preflight, "_present", lambda name: name != "safetensors")
    with pytest.raises(RefusedError) as err:
        preflight.require_worker_packages(loaded)
    assert err.value.message == (
        "missing worker package(s) safetensors for r3_mini.yaml: install them with `pip install -e '.[workers]'` "
        "(or `make install`); nothing was locked or recorded")
    assert err.value.exit_code == 3


def test_looking_up_a_package_does_not_import_it() -> None:
    code = ("import sys; from orchestrator.run.preflight import _present; "
            "assert _present('torch') and not _present('no_such_package_here'); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
