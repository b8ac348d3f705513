"""scripts/mutation.py's bookkeeping of equivalent mutants: a name counts apart only while it still means the
mutant that was judged (mutmut renumbers a function's mutants when code is added above them)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mutation.py"


@pytest.fixture(scope="module")
def driver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_driver", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_named_equivalent_counts_apart_only_with_its_pinned_diff(driver: ModuleType) -> None:
    named = {"m.x_f__mutmut_3": "same square", "m.x_f__mutmut_7": "a bound", "m.x_f__mutmut_9": "gone"}
    pinned = {"m.x_f__mutmut_3": "-z = a | +z = -a", "m.x_f__mutmut_7": "-k < n | +k <= n"}
    now = {"m.x_f__mutmut_3": "-z = a | +z = -a", "m.x_f__mutmut_7": "-x = 1 | +x = 2"}  # _7 renumbered
    equivalent, moved = driver.judged_equivalents(named, now, pinned)
    assert equivalent == {"m.x_f__mutmut_3": "same square"}
    assert moved == {"m.x_f__mutmut_7": {"pinned": "-k < n | +k <= n", "now": "-x = 1 | +x = 2"}}
    # a name never pinned is not counted apart either; a name with no mutant now is neither (it is stale)
    equivalent, moved = driver.judged_equivalents(named, now, {})
    assert equivalent == {} and set(moved) == {"m.x_f__mutmut_3", "m.x_f__mutmut_7"}
    assert moved["m.x_f__mutmut_3"] == {"pinned": None, "now": "-z = a | +z = -a"}


def test_every_named_equivalent_is_pinned_and_every_pin_is_named(driver: ModuleType) -> None:
    pins = driver.read_pins()
    assert pins == json.loads(driver.PINS.read_text())
    for module, target in driver.MODULES.items():
        assert set(pins.get(module, {})) == set(target.equivalent), module
        assert all(isinstance(d, str) and d.startswith("-") for d in pins.get(module, {}).values()), module
    assert set(pins) <= set(driver.MODULES)
