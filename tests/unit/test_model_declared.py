"""The real target's protocol declares its model: a flag that shrinks it is refused, a shrunk model is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from protocolutil import BAGEL, bagel_variant
from typer.testing import CliRunner

from ledger.verdict.decide.recipe_check import model_differences
from orchestrator.cli.orch import app
from protocol.errors import RefusedError
from protocol.results import ObservedRecipe
from protocol.schema import canonical_json, load_protocol
from workers.rank.model_shape import layer_counts

runner = CliRunner()


def test_shipped_bagel_protocol_runs_the_full_model() -> None:
    p = load_protocol(BAGEL).protocol
    args = p.launcher.args
    assert "--debug" not in args  # upstream debug mode times a 1-layer random model with stub rewards
    assert p.model is not None and p.model.layers == 28
    assert "{trainer_dir}" in args[args.index("--log_dir") + 1]  # the trainer's HTML/images stay in scratch
    assert "data/**/*.py" in p.sources.include  # online_rl.py imports data.data_utils and data.transforms


@pytest.mark.parametrize("flag", ['--debug, "True",', '--debug, "1",', '"--debug=true",'])
def test_a_shrinking_flag_is_refused_naming_it(tmp_path: Path, flag: str) -> None:
    path = bagel_variant(tmp_path, "--log_dir,", f"{flag} --log_dir,")
    with pytest.raises(RefusedError) as err:
        load_protocol(path)
    msg = str(err.value)
    assert "shrink the declared model (28 layers)" in msg and "--debug" in msg and "1 layer" in msg
    result = runner.invoke(app, ["launch", str(path), "--home", str(tmp_path / "home")])
    assert result.exit_code == 3
    assert "shrink the declared model" in result.output
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())


def test_debug_false_is_not_a_shrinking_flag(tmp_path: Path) -> None:
    path = bagel_variant(tmp_path, "--log_dir,", '--debug, "False", --log_dir,')
    assert load_protocol(path).protocol.model is not None


def test_declared_model_enters_the_id_but_older_protocols_keep_theirs(tmp_path: Path) -> None:
    without = bagel_variant(tmp_path, "model: {layers: 28, layer_prefix: language_model.model.layers}\n", "")
    a, b = load_protocol(BAGEL), load_protocol(without)
    assert "model" not in json.loads(canonical_json(b.protocol)) and "model" in json.loads(canonical_json(a.protocol))
    assert a.id != b.id
    deeper = bagel_variant(tmp_path, "model: {layers: 28,", "model: {layers: 29,")
    assert load_protocol(deeper).id != a.id


def test_layer_counts_from_parameter_names() -> None:
    names = [
        "_orig_mod.language_model.model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight",
        "language_model.model.layers.1.self_attn.q_proj.weight",
        "language_model.model.layers.1.self_attn.k_proj.weight",
        "language_model.model.layers.10.mlp.down_proj.weight",
        "vit_model.vision_model.encoder.layers.0.mlp.fc1.weight",
        "language_model.model.embed_tokens.weight",
    ]
    assert layer_counts(names) == {"language_model.model.layers": 3, "vit_model.vision_model.encoder.layers": 1}
    assert layer_counts(["lm_head.weight"]) == {}


def _observed(layers: dict[str, int], trainable: int = 1000, frozen: int = 10) -> ObservedRecipe:
    return ObservedRecipe(optimizer="AdamW", lr=5e-6, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                          trainable_params=trainable, frozen_params=frozen, layers=layers)


def test_a_shrunk_model_is_named_against_the_declaration() -> None:
    declared = {"layers": 28, "layer_prefix": "language_model.model.layers", "min_params": None}
    assert model_differences(_observed({"language_model.model.layers": 28}), declared, "A") == []
    [one] = model_differences(_observed({"language_model.model.layers": 1}), declared, "C")
    assert one == "arm C: declared 28 layers under language_model.model.layers, the trainer built 1"
    [none] = model_differences(_observed({"model.layers": 28}), declared, "B")
    assert "the probe saw no such stack (model.layers 28)" in none
    sized = {**declared, "min_params": 5000}
    [small] = model_differences(_observed({"language_model.model.layers": 28}), sized, "A")
    assert small == "arm A: 1,010 parameters, the declared model has at least 5,000"
