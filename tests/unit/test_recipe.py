"""The recipe's flag rule: when a launcher flag's text denotes a recipe value (values worked out by hand)."""

from __future__ import annotations

import pytest

from protocol.recipe import UPSTREAM_RECIPE, flag_value_equal, recipe_flags


@pytest.mark.parametrize(("expected", "given", "equal"), [
    (True, "True", True), (True, " true ", True), (True, "1", True),
    (True, "False", False), (True, "0", False), (True, "yes", False), (True, "", False),
    (False, "False", True), (False, "FALSE", True), (False, "0", True),
    (False, "True", False), (False, "1", False), (False, "no", False),
    (16, "16", True), (16, "16.0", True), (16, "1.6e1", True),  # an int written as a float is the same number
    (16, "17", False), (16, "15.9", False), (16, "sixteen", False), (0, "0.0", True),
    (5e-6, "5e-06", True), (5e-6, "5.0e-6", True), (5e-6, "0.000005", True),
    (5e-6, "1e-05", False), (5e-6, "5e-6x", False), (0.0, "-0.0", True),
    ("gloo", "gloo", True), ("gloo", "nccl", False),
])
def test_a_flag_denotes_the_recipe_value(expected: object, given: str, equal: bool) -> None:
    assert flag_value_equal(expected, given) is equal


def test_the_recipe_as_flags() -> None:
    flags = recipe_flags()
    assert flags[:6] == ["--group_size", "16", "--policy_group_size", "4", "--rounds", "2"]
    assert len(flags) == 2 * len(UPSTREAM_RECIPE) == 32
    pairs = dict(zip(flags[::2], flags[1::2], strict=True))
    assert pairs["--lr"] == "5e-06" and pairs["--eps"] == "1e-08" and pairs["--freeze_vit"] == "True"
    assert pairs["--beta2"] == "0.95" and pairs["--global_seed"] == "4396" and pairs["--data_seed"] == "42"
