"""The protocol schema's own rules (protocol.schema), one at a time on the shipped r3-mini protocol and small
variants of it: the launcher's scheduler rules, the timing windows, what enters the canonical JSON and the id, the
recipe's flags in the launcher's arguments, and each refusal of load_protocol with its file, line and words.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from protocol.errors import RefusedError
from protocol.recipe import v1_recipe
from protocol.recipe_rules import (
    _recipe_flag_named,
    _truthy,
    launch_flag_differences,
    recipe_differences,
    recipe_overrides,
    shrinking_flags,
)
from protocol.schema import Launcher, Measurement, Protocol, canonical_json, load_protocol, protocol_id

REPO = Path(__file__).resolve().parents[2]
MINI = REPO / "protocol" / "r3_mini.yaml"
R3 = v1_recipe().recipe  # R3's recipe file, the one every shipped protocol names
UPSTREAM = R3.values()
FLAGS = list(R3.flags().values())
RECIPE = "recipes/r3_tree_rl_bagel7b.yaml"
DEBUG_WHY = "upstream debug mode cuts the LLM to 1 layer, loads no weights and stubs the rewards"


def mini_data() -> dict[str, Any]:
    data = yaml.safe_load(MINI.read_text())
    assert isinstance(data, dict)
    return data


def mini(**changes: Any) -> Protocol:
    """The r3-mini protocol with top-level sections replaced or updated (a dict updates that section)."""
    data = mini_data()
    for key, value in changes.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    return Protocol.model_validate(data)


def with_recipes(root: Path) -> None:
    """The recipe files beside a copied protocol's base, as in the repository."""
    if not (root / "recipes").exists():
        shutil.copytree(REPO / "recipes", root / "recipes")


def variant(tmp_path: Path, old: str, new: str) -> Path:
    text = MINI.read_text()
    assert old in text
    path = tmp_path / "protocol" / "p.yaml"
    path.parent.mkdir(exist_ok=True)
    with_recipes(tmp_path)
    path.write_text(text.replace(old, new, 1))
    return path


def line_starting(path: Path, start: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith(start))


def refusal(path: Path) -> str:
    with pytest.raises(RefusedError) as err:
        load_protocol(path)
    assert "\n" not in err.value.message
    return err.value.message


LAUNCHER = {"nproc": 4, "backend": "nccl", "device": "cuda", "script": "train.py"}
SLURM = {"nodes": 3, "gpus_per_node": 4}


# --- the launcher ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "message"), [
    ({"scheduler": "slurm"},
     "scheduler slurm needs a launcher.slurm section (nodes, gpus_per_node, partition, time_limit)"),
    ({"slurm": SLURM}, "launcher.slurm is given but launcher.scheduler is not slurm; set scheduler: slurm"),
    ({"scheduler": "slurm", "slurm": {**SLURM, "gpus_per_node": 3}},
     "launcher.nproc 4 ranks per node need launcher.slurm.gpus_per_node >= 4 on a cuda protocol"),
])
def test_the_launchers_scheduler_rules_refuse_saying_what_to_set(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        Launcher.model_validate({**LAUNCHER, **fields})
    assert err.value.errors()[0]["msg"] == f"Value error, {message}"


def test_slurm_ranks_fit_the_gpus_per_node_and_a_cpu_protocol_needs_none() -> None:
    assert Launcher.model_validate({**LAUNCHER, "scheduler": "slurm", "slurm": SLURM}).slurm is not None  # 4 >= 4
    cpu = {**LAUNCHER, "backend": "gloo", "device": "cpu", "scheduler": "slurm", "slurm": {"nodes": 2}}
    assert Launcher.model_validate(cpu).slurm.gpus_per_node == 0  # type: ignore[union-attr]


def test_the_world_size_is_the_ranks_per_node_times_the_nodes() -> None:
    assert Launcher.model_validate(LAUNCHER).world_size == 4
    assert Launcher.model_validate({**LAUNCHER, "scheduler": "slurm", "slurm": SLURM}).world_size == 12


# --- measurement, precision ----------------------------------------------------------------------------------------

def test_the_windows_are_consecutive_step_ranges_after_the_warm_up() -> None:
    assert Measurement().windows == [(10, 11), (12, 13), (14, 15)]
    assert Measurement(steps=19, warmup=4, window=5).windows == [(4, 8), (9, 13), (14, 18)]
    assert Measurement(steps=12, warmup=11, window=1).windows == [(11, 11)]


def test_only_fp32_and_bf16_are_allowed_precisions() -> None:
    assert mini(precision="bf16").precision == "bf16"
    for bad in ("fp16", "FP32", "fp8"):
        with pytest.raises(ValidationError) as err:
            mini(precision=bad)
        assert err.value.errors()[0]["msg"] == f"Value error, precision {bad!r} is not allowed; use one of fp32, bf16"


# --- canonical JSON and id -------------------------------------------------------------------------------------------

def test_the_id_is_the_sha256_of_the_canonical_json() -> None:
    p = mini()
    assert protocol_id(p) == hashlib.sha256(canonical_json(p)).hexdigest()
    assert load_protocol(MINI).id == protocol_id(p)
    text = canonical_json(mini(name="r3-mini-é")).decode()
    assert '"name":"r3-mini-é"' in text and '"schema":"orch.protocol/2"' in text and "schema_" not in text
    assert f'"recipe_file":{{"path":"{RECIPE}","sha256":"{v1_recipe().sha256}"}}' in text


def test_later_fields_enter_the_canonical_json_only_when_set() -> None:
    import json

    base = json.loads(canonical_json(mini()))
    assert "model" not in base and "rehearsal" not in base
    assert "repeats" not in base["measurement"] and "scheduler" not in base["launcher"]
    assert "slurm" not in base["launcher"]
    assert base["measurement"]["steps"] == 16 and base["launcher"]["nproc"] == 2  # other keys stay
    model = json.loads(canonical_json(mini(model={"layers": 2})))
    assert model["model"] == {"layers": 2, "layer_prefix": "language_model.model.layers", "min_params": None}
    rehearsal = json.loads(canonical_json(mini(rehearsal={"upstream": "abc"})))
    assert rehearsal["rehearsal"] == {"upstream": "abc", "recipe_overrides": {}, "reason": ""}
    assert json.loads(canonical_json(mini(measurement={"repeats": 2})))["measurement"]["repeats"] == 2
    slurm = json.loads(canonical_json(mini(launcher={"scheduler": "slurm", "slurm": {"nodes": 2}})))["launcher"]
    assert slurm["scheduler"] == "slurm"
    assert slurm["slurm"] == {"nodes": 2, "gpus_per_node": 0, "partition": None, "time_limit": None}
    assert len({protocol_id(mini()), protocol_id(mini(measurement={"repeats": 2})),
                protocol_id(mini(model={"layers": 2}))}) == 3


# --- the recipe and the launcher's arguments -------------------------------------------------------------------------

def test_recipe_differences_name_key_given_and_upstream_value_or_the_override() -> None:
    upstream = dict(UPSTREAM)
    assert recipe_differences(upstream, R3) == []
    changed = {**upstream, "lr": 1e-5, "rounds": 3}
    assert recipe_differences(changed, R3) == [("rounds", 3, 2), ("lr", 1e-5, 5e-6)]
    two = {**upstream, "policy_group_size": 2}
    assert recipe_differences(two, R3, {"policy_group_size": 2}) == []
    assert recipe_differences(upstream, R3, {"policy_group_size": 2}) == [("policy_group_size", 4, 2)]
    assert recipe_differences(two, R3, None) == [("policy_group_size", 2, 4)]
    # a bool is not a number, a missing key and a key the file lacks are named
    assert recipe_differences({**upstream, "freeze_vit": 1}, R3) == [("freeze_vit", 1, True)]
    missing = {k: v for k, v in upstream.items() if k != "eps"}
    assert [(k, f) for k, _, f in recipe_differences({**missing, "turbo": 1}, R3)] == [("eps", 1e-8), ("turbo", None)]


@pytest.mark.parametrize(("value", "truth"), [
    ("1", True), ("true", True), (" True ", True), ("YES", True), ("y", True), ("t", True), ("on", True),
    ("0", False), ("false", False), ("no", False), ("off", False), ("", False), ("2", False),
])
def test_a_flag_value_is_true_the_way_the_trainer_reads_it(value: str, truth: bool) -> None:
    assert _truthy(value) is truth


def _args(*extra: str) -> list[str]:
    return [x for key, value in UPSTREAM.items() for x in (f"--{key}", str(value))] + list(extra)


@pytest.mark.parametrize(("extra", "found"), [
    (("--debug", "True"), [f"--debug True ({DEBUG_WHY})"]),
    (("--debug=1",), [f"--debug 1 ({DEBUG_WHY})"]),
    (("--debug",), [f"--debug 1 ({DEBUG_WHY})"]),                     # a bare flag at the end: store_true
    (("--debug", "--eval_freq", "5"), [f"--debug 1 ({DEBUG_WHY})"]),  # followed by another flag
    (("--debug", "False"), []),
    (("--debug=no",), []),
    (("--debugger", "1"), []),
    (("--log", "--debug"), [f"--debug 1 ({DEBUG_WHY})"]),
])
def test_a_shrinking_flag_is_found_with_its_value_in_each_form(extra: tuple[str, ...], found: list[str]) -> None:
    assert shrinking_flags(_args(*extra), R3) == found


def _flag_differences(args: list[str]) -> list[str]:
    return launch_flag_differences(args, UPSTREAM, R3)


def test_every_recipe_key_must_be_passed_with_its_value() -> None:
    assert _flag_differences(mini().launcher.args) == []
    args = _args()
    i = args.index("--lr")
    missing = args[:i] + args[i + 2:]
    assert _flag_differences(missing) == ["--lr missing (recipe lr = 5e-06)"]
    last = args[:-1]  # --total_steps with no value after it
    assert _flag_differences(last) == ["--total_steps missing (recipe total_steps = 1000)"]
    j = missing.index("--eps")
    two = missing[:j] + missing[j + 2:]
    assert _flag_differences(two) == ["--lr missing (recipe lr = 5e-06)", "--eps missing (recipe eps = 1e-08)"]
    other = [*args[: i + 1], "1e-5", *args[i + 2:]]
    assert _flag_differences(other) == ["--lr 1e-5 (recipe lr = 5e-06)"]


@pytest.mark.parametrize(("token", "flag"), [
    ("--lr", "--lr"), ("--lr=1", "--lr"), ("--l", "--lr"), ("--group", "--group_size"),
    ("--k", None), ("--kl_weight", None),  # ambiguous: argparse refuses it, no recipe value is set
    ("--", None), ("-l", None), ("lr", None), ("--x", None), ("--lrx", None),
])
def test_a_token_names_a_recipe_flag_the_way_argparse_reads_it(token: str, flag: str | None) -> None:
    assert _recipe_flag_named(token, FLAGS) == flag


def _again(p: Protocol) -> list[str]:
    return recipe_overrides(p.launcher.args, {a: getattr(p.arms, a).config for a in ("baseline", "candidate")}, R3)


def test_a_recipe_value_set_a_second_time_is_named_in_each_way() -> None:
    p = mini(launcher={"args": _args("--lr=1", "--group", "8", "--rounds", "2", "--eval_freq", "5")})
    assert _again(p) == [
        "launcher.args '--lr=1' sets --lr (write it once as `--lr VALUE`)",
        "launcher.args '--group' sets --group_size (write it once as `--group_size VALUE`)",
        "launcher.args give --rounds twice (the trainer keeps the last)",
    ]
    arms = mini_data()["arms"]
    arms["candidate"]["config"] = {"lr": "1", "reward_url": "http://x", "kl": "0"}
    arms["baseline"]["config"] = {"beta": "1"}  # --beta: beta1 or beta2, ambiguous
    assert _again(mini(arms=arms)) == [
        "arms.candidate.config.lr sets the recipe's --lr after the launcher's arguments"]
    assert _again(mini()) == []


# --- load_protocol's refusals ----------------------------------------------------------------------------------------

def test_a_protocol_that_is_not_a_mapping_is_refused_at_line_1(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("- a\n- b\n")
    assert refusal(path) == f"{path}:1: a protocol is a YAML mapping; see `orch schema`"


def test_a_schema_error_names_line_field_and_how_many_more(tmp_path: Path) -> None:
    path = variant(tmp_path, "precision: fp32", "precision: fp16")
    line = line_starting(path, "precision:")
    assert refusal(path) == (f"{path}:{line}: precision: precision 'fp16' is not allowed; use one of fp32, bf16; "
                             "see `orch schema`")
    path.write_text(path.read_text().replace("name: r3-mini-cpu2", "name: r3-mini-cpu2\nturbo: 1"))
    assert refusal(path).endswith(" (+1 more); see `orch schema`")
    path.write_text(path.read_text().replace("turbo: 1", "turbo: 1\nfast: 2"))
    assert refusal(path).endswith(" (+2 more); see `orch schema`")


def _rehearsal(tmp_path: Path, overrides: str, policy: str = "4") -> Path:
    path = variant(tmp_path, "precision: fp32", f"precision: fp32\nrehearsal:\n  upstream: abc\n"
                                                f"  recipe_overrides: {overrides}")
    text = path.read_text().replace("  policy_group_size: 4", f"  policy_group_size: {policy}")
    path.write_text(text.replace('--policy_group_size, "4"', f'--policy_group_size, "{policy}"'))
    return path


def test_a_rehearsal_may_override_only_the_policy_group_size_and_it_must_divide_the_ranks(tmp_path: Path) -> None:
    path = _rehearsal(tmp_path, "{rounds: 1, lr: 1}")
    line = line_starting(path, "recipe_overrides:")
    assert refusal(path) == (f"{path}:{line}: rehearsal.recipe_overrides: lr, rounds may not be overridden "
                             "(only policy_group_size); remove it")
    path = _rehearsal(tmp_path, "{policy_group_size: 3}", "3")
    assert refusal(path) == (f"{path}:{line}: rehearsal.recipe_overrides.policy_group_size must divide "
                             "launcher.nproc")
    for size in ("1", "2"):
        loaded = load_protocol(_rehearsal(tmp_path, f"{{policy_group_size: {size}}}", size))
        assert loaded.protocol.recipe["policy_group_size"] == int(size)
    path = _rehearsal(tmp_path, "{policy_group_size: 2}")  # the recipe still says 4: it must be the override
    assert refusal(path) == (f"{path}:{line_starting(path, 'policy_group_size:')}: recipe differs from the frozen "
                             f"upstream recipe ({RECIPE}): recipe.policy_group_size = 4 (upstream 2); restore it")


def test_a_recipe_value_missing_from_the_arguments_is_refused_at_the_args_line(tmp_path: Path) -> None:
    path = variant(tmp_path, '    --lr, "5e-6",\n', "")
    assert refusal(path) == (f"{path}:{line_starting(path, 'args:')}: launcher.args do not carry the recipe: "
                             "--lr missing (recipe lr = 5e-06); pass every recipe value "
        "(or leave `recipe:` out: orch then renders every recipe flag)")
    path = variant(tmp_path, '    --lr, "5e-6",\n', '    --lr, "5e-6", "--lr=1",\n')
    assert refusal(path) == (f"{path}:{line_starting(path, 'args:')}: the recipe is set again behind its checked "
                             "flag: launcher.args '--lr=1' sets --lr (write it once as `--lr VALUE`); remove the "
                             "extra setting (the recipe is frozen)")


def test_a_declared_model_refuses_the_debug_flag_and_an_undeclared_one_allows_it(tmp_path: Path) -> None:
    assert load_protocol(MINI).protocol.model is None  # r3-mini passes --debug True and declares no model
    path = variant(tmp_path, "precision: fp32", "precision: fp32\nmodel: {layers: 2}")
    assert refusal(path) == (f"{path}:{line_starting(path, 'args:')}: launcher.args shrink the declared model "
                             f"(2 layers): --debug True ({DEBUG_WHY}); remove the flag (blinding covers the "
                             "trainer's step-0 evaluation)")


@pytest.mark.parametrize(("measurement", "ok"), [
    ("{steps: 16, warmup: 10, window: 2, digest_first: 0, digest_last: 15}", True),
    ("{steps: 16, warmup: 10, window: 2, digest_first: 0, digest_last: 16}", False),
    ("{steps: 16, warmup: 15, window: 1, digest_first: 13, digest_last: 13}", True),
    ("{steps: 16, warmup: 16, window: 2}", False),
    ("{steps: 16, warmup: 10, window: 0}", False),
    ("{steps: 16, warmup: 10, window: 2, digest_first: 14, digest_last: 13}", False),
    ("{steps: 16, warmup: 10, window: 2, digest_first: 13, digest_last: 13}", True),
    ("{steps: 16, warmup: 10, window: 2, digest_first: -1}", False),
])
def test_the_measurement_must_fit_its_steps(tmp_path: Path, measurement: str, ok: bool) -> None:
    old = "measurement: {steps: 16, warmup: 10, window: 2, drift_bound: 0.02, digest_first: 0, digest_last: 13}"
    path = variant(tmp_path, old, f"measurement: {measurement}")
    if ok:
        assert load_protocol(path).protocol.measurement.steps == 16
    else:
        assert refusal(path) == (f"{path}:{line_starting(path, 'measurement:')}: measurement: inconsistent "
                                 "steps/warm-up/windows/digest range")


def test_a_loaded_protocol_knows_its_file_and_resolves_against_its_base(tmp_path: Path) -> None:
    path = variant(tmp_path, 'base: ".."', 'base: "../src"')
    with_recipes(tmp_path / "src")
    loaded = load_protocol(path)
    assert loaded.path == path.resolve() and loaded.base == (tmp_path / "src").resolve()
    assert loaded.resolve("train/x.py") == (tmp_path / "src" / "train" / "x.py").resolve()


def test_the_published_json_schema_names_fields_as_a_protocol_file_writes_them() -> None:
    from protocol.schema import json_schema

    doc = json_schema()
    assert doc["properties"]["schema"]["enum"] == ["orch.protocol/1", "orch.protocol/2"]
    assert "schema_" not in doc["properties"] and "recipe_file" in doc["properties"]
    assert {"name", "precision", "sources", "arms", "launcher", "scorer"} <= set(doc["required"])
    assert "recipe" not in doc["required"]  # the short form (issue 33) leaves it out


def test_several_problems_of_one_kind_are_listed_in_one_line(tmp_path: Path) -> None:
    path = variant(tmp_path, "  rounds: 2\n", "  rounds: 3\n")
    path.write_text(path.read_text().replace("  eps: 1.0e-8", "  eps: 1.0e-6"))
    assert refusal(path) == (f"{path}:{line_starting(path, 'rounds:')}: recipe differs from the frozen upstream "
                             f"recipe ({RECIPE}): recipe.rounds = 3 (upstream 2), recipe.eps = 1e-06 (upstream 1e-08); "
                             "restore it")
    path = variant(tmp_path, '    --lr, "5e-6",\n', "")
    path.write_text(path.read_text().replace('    --eps, "1e-8",\n', ""))
    args = line_starting(path, "args:")
    assert refusal(path) == (f"{path}:{args}: launcher.args do not carry the recipe: --lr missing (recipe lr = "
                             "5e-06); --eps missing (recipe eps = 1e-08); pass every recipe value "
        "(or leave `recipe:` out: orch then renders every recipe flag)")
    path = variant(tmp_path, '    --lr, "5e-6",\n', '    --lr, "5e-6", "--lr=1", --lr, "5e-6",\n')
    assert refusal(path) == (f"{path}:{args}: the recipe is set again behind its checked flag: launcher.args "
                             "'--lr=1' sets --lr (write it once as `--lr VALUE`); launcher.args give --lr twice (the "
                             "trainer keeps the last); remove the extra setting (the recipe is frozen)")
    path = variant(tmp_path, "precision: fp32", "precision: fp32\nmodel: {layers: 2}")
    path.write_text(path.read_text().replace('    --eval_freq, "50",', '    --eval_freq, "50", "--debug=yes",'))
    assert refusal(path) == (f"{path}:{line_starting(path, 'args:')}: launcher.args shrink the declared model "
                             "(2 layers): --debug True "
                             f"({DEBUG_WHY}); --debug yes ({DEBUG_WHY}); remove the flag (blinding covers the "
                             "trainer's step-0 evaluation)")
