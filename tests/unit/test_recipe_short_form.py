"""The short form of a protocol (issue 33): no `recipe:` block and no recipe flags in launcher.args; orch renders
`--flag VALUE` of every recipe key that has a flag before launcher.args, and the explicit form stays as it was."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from protocol.errors import RefusedError
from protocol.recipe import recipe_flags, v1_recipe
from protocol.schema import load_protocol, protocol_id

REPO = Path(__file__).resolve().parents[2]
TRL = REPO / "protocol" / "trl_grpo_cpu2.yaml"
MINI = REPO / "protocol" / "r3_mini.yaml"


def _copy(tmp_path: Path, source: Path, edit: object = None) -> Path:
    shutil.copytree(REPO / "recipes", tmp_path / "recipes", dirs_exist_ok=True)
    data = yaml.safe_load(source.read_text())
    if callable(edit):
        edit(data)
    path = tmp_path / "protocol" / source.name
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _short(data: dict) -> None:
    """The explicit r3_mini protocol made short: its recipe block and every recipe flag with its value removed."""
    flags = set(v1_recipe().recipe.flags().values())
    args = data["launcher"]["args"]
    kept = [a for i, a in enumerate(args) if a not in flags and not (i and args[i - 1] in flags)]
    data.pop("recipe")
    data["launcher"]["args"] = kept


def test_the_shipped_trl_protocol_is_short_and_renders_every_flag_first() -> None:
    text = TRL.read_text()
    assert "\nrecipe:" not in text and "--learning_rate" not in text
    loaded = load_protocol(TRL)
    recipe = loaded.frozen_recipe().recipe
    rendered = recipe_flags(recipe)
    assert len(rendered) == 2 * len(recipe.flags()) == 40
    assert loaded.protocol.launcher.args[: len(rendered)] == rendered
    assert loaded.protocol.launcher.args[len(rendered):][:2] == ["--bf16", "False"]
    assert loaded.protocol.recipe == recipe.values()
    assert rendered[:4] == ["--learning_rate", "1e-05", "--warmup_steps", "10"]


def test_short_and_explicit_forms_of_one_experiment_are_one_protocol(tmp_path: Path) -> None:
    explicit = load_protocol(MINI)
    short_path = _copy(tmp_path / "short", MINI, _short)
    short = load_protocol(short_path)
    assert short.protocol.recipe == explicit.protocol.recipe
    flags = recipe_flags(short.frozen_recipe().recipe)
    kept = yaml.safe_load(short_path.read_text())["launcher"]["args"]
    assert short.protocol.launcher.args == [*flags, *kept] and len(kept) < len(explicit.protocol.launcher.args)
    # the same arguments, the recipe's first: the id is that of the explicit protocol written in this order
    def explicit_in_rendered_order(d: dict) -> None:
        _short(d)
        d["recipe"] = explicit.protocol.recipe
        d["launcher"]["args"] = [*flags, *d["launcher"]["args"]]

    reordered = _copy(tmp_path / "reordered", MINI, explicit_in_rendered_order)
    assert load_protocol(reordered).id == short.id == protocol_id(short.protocol) != explicit.id


def test_a_short_protocol_that_sets_a_recipe_flag_itself_is_refused(tmp_path: Path) -> None:
    path = _copy(tmp_path, MINI, lambda d: (_short(d), d["launcher"]["args"].extend(["--lr", "5e-6"])))
    with pytest.raises(RefusedError) as err:
        load_protocol(path)
    assert "launcher.args set the recipe again (--lr 5e-6)" in err.value.message
    assert "orch render every recipe flag from recipes/r3_tree_rl_bagel7b.yaml" in err.value.message
    abbreviated = _copy(tmp_path / "b", MINI, lambda d: (_short(d), d["launcher"]["args"].append("--warmup=3")))
    with pytest.raises(RefusedError, match="'--warmup=3' sets --warmup_steps"):
        load_protocol(abbreviated)


def test_an_arm_config_naming_a_recipe_flag_is_refused_in_the_short_form_too(tmp_path: Path) -> None:
    path = _copy(tmp_path, MINI, lambda d: (_short(d), d["arms"]["candidate"].update(config={"lr": "1e-5"})))
    with pytest.raises(RefusedError, match=r"arms\.candidate\.config\.lr sets the recipe's --lr"):
        load_protocol(path)


def test_an_orch_protocol_1_document_still_needs_its_recipe(tmp_path: Path) -> None:
    def v1(d: dict) -> None:
        _short(d)
        d["schema"] = "orch.protocol/1"
        d.pop("recipe_file")

    with pytest.raises(RefusedError, match=r"an orch\.protocol/1 document gives its recipe"):
        load_protocol(_copy(tmp_path, MINI, v1))
