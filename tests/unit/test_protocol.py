"""Protocol model: the frozen recipe, precision policy, file/line/field refusals, canonical JSON and its id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from protocolutil import BAGEL, bagel_variant, v1_text, with_recipes
from typer.testing import CliRunner

from orchestrator.cli.orch import app
from protocol.errors import RefusedError
from protocol.recipe import UPSTREAM_RECIPE
from protocol.schema import Protocol, canonical_json, load_protocol, protocol_id

runner = CliRunner()


def test_bagel_target_validates_and_its_command_carries_every_recipe_value() -> None:
    loaded = load_protocol(BAGEL)
    args = loaded.protocol.launcher.args
    assert loaded.protocol.launcher.nproc == 8 and loaded.protocol.launcher.script == "train/online_rl.py"
    for key, value in UPSTREAM_RECIPE.items():
        flag = f"--{key}"
        assert flag in args, flag
        given_value = args[args.index(flag) + 1]
        if isinstance(value, bool):
            assert given_value == str(value)
        else:
            assert float(given_value) == float(value), key


def test_changed_lr_is_refused_naming_key_line_and_both_values(tmp_path: Path) -> None:
    path = bagel_variant(tmp_path, "lr: 5.0e-6", "lr: 1.0e-5")
    with pytest.raises(RefusedError) as err:
        load_protocol(path)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith("lr:"))
    assert f"p.yaml:{line}:" in err.value.message
    assert "recipe.lr = 1e-05 (upstream 5e-06)" in err.value.message


def test_fp16_precision_is_refused_through_the_cli_with_exit_3(tmp_path: Path) -> None:
    path = bagel_variant(tmp_path, "precision: bf16", "precision: fp16")
    line = path.read_text().splitlines().index("precision: fp16") + 1
    result = runner.invoke(app, ["freeze", "--protocol", str(path)])
    # the whole output is the one refusal line: the words alone also occur in pytest's folder name for this test
    assert result.output == (
        f"orch: {path}:{line}: precision: precision 'fp16' is not allowed; use one of fp32, bf16; see `orch schema`\n"
    )
    assert result.exit_code == 3


def test_recipe_flag_that_disagrees_with_the_recipe_is_refused(tmp_path: Path) -> None:
    path = bagel_variant(tmp_path, '--beta1, "0.9"', '--beta1, "0.8"')
    with pytest.raises(RefusedError, match=r"--beta1 0.8 \(recipe beta1 = 0.9\)"):
        load_protocol(path)


@pytest.mark.parametrize(("old", "new", "named"), [
    # found by the attack battery: each passed pre-flight and the trainer's parser kept the later value
    ('--beta1, "0.9"', '--beta1, "0.9", --lr, "1e-5"', "launcher.args give --lr twice (the trainer keeps the last)"),
    ('--beta1, "0.9"', '--beta1, "0.9", "--eps=1e-6"', "launcher.args '--eps=1e-6' sets --eps"),
    ('--beta1, "0.9"', '--beta1, "0.9", --kl_weight_te, "0"', "launcher.args '--kl_weight_te' sets --kl_weight_text"),
    ("switches: {}", 'switches: {}\n    config: {kl_weight_text: "0"}',
     "arms.baseline.config.kl_weight_text sets the recipe's --kl_weight_text"),
])
def test_a_recipe_value_set_again_behind_its_checked_flag_is_refused(tmp_path: Path, old: str, new: str,
                                                                     named: str) -> None:
    path = bagel_variant(tmp_path, old, new)
    with pytest.raises(RefusedError) as err:
        load_protocol(path)
    assert named in err.value.message and "\n" not in err.value.message, err.value.message


def test_unknown_field_names_file_line_and_field(tmp_path: Path) -> None:
    path = bagel_variant(tmp_path, "precision: bf16", "precision: bf16\nturbo: true")
    with pytest.raises(RefusedError) as err:
        load_protocol(path)
    line = path.read_text().splitlines().index("turbo: true") + 1
    assert f"p.yaml:{line}: turbo:" in err.value.message


def test_several_recipe_differences_are_all_named(tmp_path: Path) -> None:
    path = bagel_variant(tmp_path, "  rounds: 2\n", "  rounds: 3\n")
    text = path.read_text().replace("  eps: 1.0e-8", "  eps: 1.0e-6")
    path.write_text(text)
    with pytest.raises(RefusedError) as err:
        load_protocol(path)
    assert "recipe.rounds = 3 (upstream 2)" in err.value.message
    assert "recipe.eps = 1e-06 (upstream 1e-08)" in err.value.message


def test_canonical_json_round_trips() -> None:
    p = load_protocol(BAGEL).protocol
    again = Protocol.model_validate_json(canonical_json(p))
    assert again == p and canonical_json(again) == canonical_json(p)


def _leaves(obj: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in _leaves(v, (*prefix, k))]
    if isinstance(obj, list):
        return [leaf for i, v in enumerate(obj) for leaf in _leaves(v, (*prefix, i))]
    return [prefix]


_BASE = yaml.safe_load(BAGEL.read_text())
_LITERALS = {("launcher", "backend"), ("launcher", "device")}
_PATHS = [p for p in _leaves(_BASE)
          if p[0] not in ("recipe", "precision", "schema") and "source" not in p and p not in _LITERALS]


@pytest.mark.parametrize("path", _PATHS, ids=lambda p: ".".join(map(str, p)))
def test_id_changes_when_any_field_changes(path: tuple[object, ...]) -> None:
    """Every leaf of the protocol (169 of them), not a sample: a sampled run once missed recipe_file.sha256."""
    base = Protocol.model_validate(_BASE)
    data = yaml.safe_load(BAGEL.read_text())
    node = data
    for key in path[:-1]:
        node = node[key]  # type: ignore[index]
    old = node[path[-1]]  # type: ignore[index]
    if isinstance(old, bool):
        new: object = not old
    elif isinstance(old, int):
        new = old + 1
    elif isinstance(old, float):
        new = old / 2
    elif path[-1] == "sha256":  # a digest stays 64 hex digits: change its last one
        new = f"{old[:-1]}{'0' if old[-1] != '0' else '1'}"  # type: ignore[index]
    else:
        new = f"{old}x"
    node[path[-1]] = new  # type: ignore[index]
    changed = Protocol.model_validate(data)
    assert protocol_id(changed) != protocol_id(base)


def _refusal(path: Path) -> str:
    """The CLI's answer to a protocol: exit 3 and exactly one line."""
    result = runner.invoke(app, ["freeze", "--protocol", str(path)])
    assert result.exit_code == 3, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def _line_of(path: Path, text: str, nth: int = 1) -> int:
    hits = [i for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip().startswith(text)]
    return hits[nth - 1]


def test_duplicate_keys_are_refused_naming_the_line_of_the_repeat(tmp_path: Path) -> None:
    path = bagel_variant(tmp_path, "precision: bf16", "precision: bf16\nname: another-name")
    line = _line_of(path, "name:", 2)
    assert f"p.yaml:{line}: duplicate key 'name' (first at line {_line_of(path, 'name:')})" in _refusal(path)
    # a repeated recipe value is named where it repeats, not where the first one stands
    path = bagel_variant(tmp_path, "  lr: 5.0e-6", "  lr: 5.0e-6\n  lr: 1.0e-5")
    assert f"p.yaml:{_line_of(path, 'lr:', 2)}: duplicate key 'lr'" in _refusal(path)


def test_protocol_over_1_mib_is_refused_before_parsing(tmp_path: Path) -> None:
    path = bagel_variant(tmp_path, "precision: bf16", "precision: bf16\n" + "# padding\n" * 110_000)
    assert path.stat().st_size > 1 << 20
    assert "larger than 1048576 bytes" in _refusal(path)


def test_non_utf8_protocol_is_refused_naming_line_and_byte(tmp_path: Path) -> None:
    path = bagel_variant(tmp_path, "precision: bf16", "precision: bf16")
    data = path.read_bytes().replace(b"name: r3-bagel7b-8xh100", b"name: r3-\xff\xfe")
    line = _line_of(path, "name:")
    path.write_bytes(data)
    assert f"p.yaml:{line}: not UTF-8 text (byte 0xff" in _refusal(path)
    binary = tmp_path / "protocol" / "binary.yaml"
    binary.write_bytes(bytes(range(256)) * 8)
    assert "not UTF-8 text" in _refusal(binary)


@pytest.mark.parametrize("value", ["-5", "0"])
def test_timeouts_must_be_positive(tmp_path: Path, value: str) -> None:
    path = bagel_variant(tmp_path, "train: 7200", f"train: {value}")
    line = _refusal(path)
    assert "timeouts.train" in line and "greater than 0" in line


def test_alias_expansion_is_bounded(tmp_path: Path) -> None:
    bomb = "bomb:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i, name in enumerate("bcdefg"):
        prev = "abcdefg"[i]
        bomb += f"  {name}: &{name} [{', '.join([f'*{prev}'] * 10)}]\n"
    path = bagel_variant(tmp_path, "precision: bf16", "precision: bf16\n" + bomb)
    assert "expands to more than 100000 YAML nodes" in _refusal(path)


def test_protocol_is_parsed_once_with_the_c_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    import protocol.protocol_yaml as protocol_yaml

    assert yaml.__with_libyaml__ and protocol_yaml._LOADER is yaml.CSafeLoader  # libyaml ships in PyYAML's wheels
    made: list[object] = []

    class Counting(protocol_yaml._LOADER):  # type: ignore[misc, name-defined]
        def __init__(self, stream: str) -> None:
            made.append(stream)
            super().__init__(stream)

    monkeypatch.setattr(protocol_yaml, "_LOADER", Counting)
    monkeypatch.setattr(yaml, "compose", None)  # the old second parse: must not be called
    monkeypatch.setattr(yaml, "safe_load", None)
    load_protocol(BAGEL)
    assert len([s for s in made if "name: r3-bagel7b-8xh100" in str(s)]) == 1  # the protocol; its recipe file apart
def test_published_protocol_ids_do_not_change_with_measurement_repeats(tmp_path: Path) -> None:
    """repeats is absent from the canonical JSON at its default: the ids behind docs/validation still match the
    shipped protocols' orch.protocol/1 form (published before protocols named their recipe file)."""
    repo = BAGEL.parents[1]
    for evidence, shipped in (("h200x1_null.json", "r3_mini_cuda1_null.yaml"), ("h200x2.json", "r3_mini_cuda2.yaml")):
        published = json.loads((repo / "docs" / "validation" / evidence).read_text())["protocol_id"]
        loaded = load_protocol(repo / "protocol" / shipped)
        assert loaded.protocol.measurement.repeats == 1 and b"repeats" not in canonical_json(loaded.protocol)
        v1 = tmp_path / "protocol" / shipped
        v1.parent.mkdir(exist_ok=True)
        v1.write_text(v1_text((repo / "protocol" / shipped).read_text()))
        old = load_protocol(v1)
        assert old.id == published != loaded.id, shipped
        assert old.protocol == loaded.protocol.model_copy(update={"schema_": "orch.protocol/1", "recipe_file": None})


def test_repeats_one_is_the_same_protocol_and_two_is_another(tmp_path: Path) -> None:
    text = (BAGEL.parent / "r3_mini.yaml").read_text()
    old = "measurement: {steps: 16, warmup: 10, window: 2, drift_bound: 0.02, digest_first: 0, digest_last: 13}"
    assert old in text
    ids = {}
    with_recipes(tmp_path)
    for repeats in (None, 1, 2):
        path = tmp_path / "protocol" / f"r{repeats}.yaml"
        path.parent.mkdir(exist_ok=True)
        extra = "" if repeats is None else f", repeats: {repeats}"
        path.write_text(text.replace(old, old[:-1] + extra + "}"))
        ids[repeats] = load_protocol(path)
    assert ids[None].id == ids[1].id != ids[2].id
    assert ids[2].protocol.measurement.repeats == 2 and b'"repeats":2' in canonical_json(ids[2].protocol)
    bad = tmp_path / "protocol" / "r0.yaml"
    bad.write_text(text.replace(old, old[:-1] + ", repeats: 0}"))
    with pytest.raises(RefusedError, match=r"measurement\.repeats"):
        load_protocol(bad)


def test_prime_steps_left_out_is_the_same_protocol_and_is_checked_when_given(tmp_path: Path) -> None:
    """measurement.prime_steps (the prime runs that many steps): absent from the canonical JSON when not given, so
    every published id stands; at most the launch's steps, and only where a prime runs."""
    text = (BAGEL.parent / "r3_mini.yaml").read_text()
    old = "measurement: {steps: 16, warmup: 10, window: 2, drift_bound: 0.02, digest_first: 0, digest_last: 13}"
    assert old in text
    with_recipes(tmp_path)
    loaded = {}
    for extra in ("", ", prime_steps: 2", ", prime_steps: 16"):
        path = tmp_path / "protocol" / f"p{len(loaded)}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text.replace(old, old[:-1] + extra + "}"))
        loaded[extra] = load_protocol(path)
    assert loaded[""].id == load_protocol(BAGEL.parent / "r3_mini.yaml").id
    assert b"prime_steps" not in canonical_json(loaded[""].protocol)
    assert loaded[""].protocol.measurement.primed_steps == 16
    assert len({p.id for p in loaded.values()}) == 3
    assert loaded[", prime_steps: 2"].protocol.measurement.primed_steps == 2
    for extra, said in ((", prime_steps: 17", "prime_steps 17 is more than the 16 steps a launch runs"),
                        (", prime_steps: 0", "greater than or equal to 1"),
                        (", compile: none, prime_steps: 2", "prime_steps applies only to compile: prime")):
        path = tmp_path / "protocol" / "bad.yaml"
        path.write_text(text.replace(old, old[:-1] + extra + "}"))
        with pytest.raises(RefusedError) as err:
            load_protocol(path)
        assert said in err.value.message, err.value.message
