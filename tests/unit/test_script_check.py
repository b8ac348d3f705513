"""Issue 53: every protocol error before the lock. `orch launch` refuses (exit 3, one line) a launcher.script missing
from the arm's tree, a flag of the recipe, launcher.args or an arm's config that the script's parser does not take,
and a recipe key without a flag that the script takes; a refused launch writes nothing into the project."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from manifests.core import hash_tree
from orchestrator.cli.orch import app
from orchestrator.init.script_args import read_script
from orchestrator.init.script_check import read_parser
from protocol.errors import RefusedError
from protocol.schema import load_protocol

REPO = Path(__file__).resolve().parents[2]
MINIMAL = REPO / "tests" / "fixtures" / "minimal"
runner = CliRunner()


def _project(tmp_path: Path, protocol_edit: object = None, recipe_edit: object = None) -> Path:
    """The minimal trainer as a user's project (trainer/, recipes/, protocol/, manifests/), its protocol committing
    to the recipe file as edited."""
    proj = tmp_path / "proj"
    (proj / "trainer").mkdir(parents=True)
    for name in ("train.py", "score.py"):
        shutil.copy(MINIMAL / name, proj / "trainer" / name)
    recipe = yaml.safe_load((MINIMAL / "recipe.yaml").read_text())
    if callable(recipe_edit):
        recipe_edit(recipe)
    raw = yaml.safe_dump(recipe, sort_keys=False).encode()
    (proj / "recipes").mkdir()
    (proj / "recipes" / "minimal.yaml").write_bytes(raw)
    data = yaml.safe_load((MINIMAL / "protocol.yaml").read_text())
    data["recipe_file"]["sha256"] = hashlib.sha256(raw).hexdigest()
    if callable(protocol_edit):
        protocol_edit(data)
    (proj / "protocol").mkdir()
    (proj / "protocol" / "minimal.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (proj / "manifests").mkdir()
    (proj / "manifests" / "minimal.json").write_text(hash_tree(proj / "trainer", ["*.py"]).to_json())
    return proj


def _refused(proj: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """`orch launch` from the project's root with the default home: exit 3, one line, nothing new in the project."""
    monkeypatch.chdir(proj)
    monkeypatch.delenv("ORCH_HOME", raising=False)
    before = sorted(p.relative_to(proj) for p in proj.rglob("*"))
    result = runner.invoke(app, ["launch", "protocol/minimal.yaml", "--lock-timeout", "1"])
    assert result.exit_code == 3, result.output
    assert sorted(p.relative_to(proj) for p in proj.rglob("*")) == before  # no .orch, no host.salt
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_script_missing_from_the_tree_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = _project(tmp_path, lambda d: d["launcher"].update(script="trian.py"))
    line = _refused(proj, monkeypatch)
    assert "launcher.script trian.py is not a file in the baseline arm's sources (trainer)" in line


def test_a_launcher_flag_the_parser_does_not_take_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = _project(tmp_path, lambda d: d["launcher"].update(args=["--extra_froward", "1"]))
    line = _refused(proj, monkeypatch)
    assert "launcher.args pass --extra_froward, which train.py does not take (did you mean --extra_forwards?)" in line


def test_a_recipe_flag_typo_names_the_key_and_orch_init(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = _project(tmp_path, recipe_edit=lambda r: r["keys"]["lr"].update(flag="--learnig_rate"))
    line = _refused(proj, monkeypatch)
    assert "recipes/minimal.yaml: key lr is passed as --learnig_rate, which train.py does not take" in line
    assert "`orch init trainer/train.py --device cpu --name minimal --protocol-only --force`" in line


def test_a_recipe_key_without_a_flag_the_script_takes_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = _project(tmp_path, recipe_edit=lambda r: r["keys"]["width"].pop("flag"))
    line = _refused(proj, monkeypatch)
    assert "key width has no flag, so train.py would keep its own default of --width; add `flag: --width`" in line


def test_an_arm_config_flag_the_parser_does_not_take_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = _project(tmp_path, lambda d: d["arms"]["candidate"].update(config={"extra_forwrds": "0"}))
    line = _refused(proj, monkeypatch)
    assert "arms.candidate.config.extra_forwrds passes --extra_forwrds, which train.py does not take" in line


def test_an_edited_recipe_is_refused_naming_orch_init_protocol_only(tmp_path: Path) -> None:
    proj = _project(tmp_path)
    recipe = proj / "recipes" / "minimal.yaml"
    recipe.write_text(recipe.read_text().replace("value: 256", "value: 128"))
    with pytest.raises(RefusedError, match=r"write the protocol again against it \(`orch init trainer/train.py "
                                           r"--device cpu --name minimal --protocol-only --force`, or set "):
        load_protocol(proj / "protocol" / "minimal.yaml")


def test_what_the_parser_takes_is_read_statically(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import argparse, transformers\nfrom dataclasses import dataclass\n"
        "@dataclass\nclass Base:\n    depth: int = 2\n"
        "@dataclass\nclass Model(Base):\n    use_cache: bool = True\n"
        "@dataclass\nclass Train(transformers.TrainingArguments):\n    pass\n"
        "ap = argparse.ArgumentParser()\nap.add_argument('--seed', '--random-seed', type=int, default=0)\n"
        "m, t = transformers.HfArgumentParser((Model, Train)).parse_args_into_dataclasses()\n")
    found = read_script(script)
    assert found.library == {"transformers.TrainingArguments": "transformers:TrainingArguments"}
    assert {a.name for a in found.args} == {"depth", "use_cache", "seed"}  # the local base's field too
    assert found.options == {"--seed", "--random-seed"} and found.open == []


@pytest.mark.parametrize("line", [
    "args, rest = ap.parse_known_args()",
    "ap.add_argument(*names)",
    "add_model_arguments(ap)",
])
def test_a_parser_that_may_take_more_flags_refuses_none(tmp_path: Path, line: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(f"import argparse\nap = argparse.ArgumentParser()\nap.add_argument('--lr')\n{line}\n")
    parser = read_parser(script)
    assert parser.unknown is not None and parser.takes("--lr")


def test_a_trainer_script_s_library_fields_are_read_in_a_subprocess() -> None:
    parser = read_parser(REPO / "tests" / "fixtures" / "hf_trainer" / "train.py")
    assert parser.unknown is None
    assert parser.takes("--learning_rate") and parser.takes("--learning-rate")
    assert parser.takes("--no_remove_unused_columns")  # HfArgumentParser's complement of a bool that defaults True
    assert parser.takes("--learning_r")  # argparse takes an abbreviation
    assert not parser.takes("--learnig_rate")
