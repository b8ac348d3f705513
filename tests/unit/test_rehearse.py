"""orch rehearse on CPU: the upstream snapshot is checked against the commitment, the derived protocol is valid."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from manifests.core import hash_tree
from orchestrator.cli.orch import app
from orchestrator.run.rehearse import check_upstream, derive_protocol
from protocol.errors import RefusedError
from protocol.rehearsal_inputs import RehearsalInputs
from protocol.schema import load_protocol

REPO = Path(__file__).resolve().parents[2]
BAGEL = REPO / "protocol" / "r3_bagel7b_8xh100.yaml"
INCLUDE = ["modeling/**/*.py", "train/**/*.py", "data/**/*.py"]
runner = CliRunner()


def _fake_upstream(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in tree laid out like upstream, its commitment, and the real protocol pointed at that commitment."""
    up = tmp_path / "R3"
    for rel in ("train/online_rl.py", "train/fsdp2_utils.py", "modeling/bagel/bagel.py", "data/data_utils.py"):
        (up / rel).parent.mkdir(parents=True, exist_ok=True)
        (up / rel).write_text(f"# {rel}\n")
    manifest = tmp_path / "manifests" / "upstream.json"
    manifest.parent.mkdir()
    manifest.write_text(hash_tree(up, INCLUDE).to_json())
    text = BAGEL.read_text().replace("commitment: manifests/r3_bagel7b_baseline.json", f"commitment: {manifest}")
    protocol = tmp_path / "protocol" / "p.yaml"
    protocol.parent.mkdir()
    protocol.write_text(text)
    shutil.copytree(REPO / "recipes", tmp_path / "recipes")  # the recipe file it names, beside its base
    return up, protocol


def _inputs() -> RehearsalInputs:
    model = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 526,
             "vit_layers": 3, "vit_layers_built": 2, "vit_hidden": 64, "vit_heads": 4, "vit_intermediate": 128,
             "layer_module": "Qwen2MoTDecoderLayer", "bagel_parameters": 1247424, "ae_parameters": 83819683,
             "ema_dtype": "bf16", "ema_tensors": 111, "all_zero_tensors": []}
    return RehearsalInputs.model_validate({
        "schema": "orch.rehearsal-inputs/1", "seed": 0, "sizes": {"layers": 2}, "model": model,
        "tokenizer": {"bpe_vocab": 512, "special_tokens": [], "length": 526, "ids": {}},
        "data": {"source": "data/rl_test/test_geneval++.jsonl", "source_sha256": "0" * 64, "train_lines": 48,
                 "val_lines": 1},
        "assumed_trainer_flags": {}, "files": [], "upstream_checks": [],
        "trainer_args": ["--llm_path", "model/llm_config.json", "--vit_path", "model/vit_config.json",
                         "--vae_path", "model/ae.safetensors", "--resume_from", "model",
                         "--train_data_path", "data/train.jsonl", "--val_data_path", "data/val.jsonl"],
    })


def test_the_unmodified_snapshot_passes_and_a_changed_byte_is_refused(tmp_path: Path) -> None:
    up, protocol = _fake_upstream(tmp_path)
    root = check_upstream(protocol, up)
    assert len(root) == 64
    (up / "train" / "online_rl.py").write_text("# patched\n")
    with pytest.raises(RefusedError) as err:
        check_upstream(protocol, up)
    assert "--upstream sources differ from upstream.json: 1 changed (train/online_rl.py); " in str(err.value)


def test_the_derived_protocol_is_a_valid_declared_null_rehearsal(tmp_path: Path) -> None:
    up, protocol = _fake_upstream(tmp_path)
    inputs_dir = tmp_path / "inputs"
    for rel in ("model/llm_config.json", "model/vit_config.json", "model/ae.safetensors", "data/train.jsonl",
                "data/val.jsonl"):
        (inputs_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (inputs_dir / rel).write_text("{}")
    data = derive_protocol(protocol, up, inputs_dir, _inputs(), 1, [18008, 18009], "f" * 64, ["python", "s.py"])
    path = tmp_path / "rehearsal.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    p = load_protocol(path).protocol
    args = p.launcher.args
    assert p.launcher.nproc == 1 and p.recipe["policy_group_size"] == 1
    assert p.rehearsal is not None and p.rehearsal.recipe_overrides == {"policy_group_size": 1}
    assert p.model is not None and p.model.layers == 2  # the tiny model's depth is declared and checked
    assert args[args.index("--llm_path") + 1] == str(inputs_dir / "model/llm_config.json")
    assert args[args.index("--resume_from") + 1] == str(inputs_dir / "model")
    assert args[args.index("--reward_server_port") + 1] == "18008,18009"
    assert "--debug" not in args and args[args.index("--log_dir") + 1] == "{trainer_dir}"
    assert p.arms.baseline == p.arms.candidate  # a null rehearsal: exactness on real code is the question
    assert p.launcher.env["PYTHONPATH"].split(":")[-1] == "."
    assert p.launcher.env["PYTHONPATH"].split(":")[0].endswith("workers/rehearsal/shim")  # with its torch shim
    assert p.launcher.env["ORCH_TORCH_COMPAT"] == "fsdp_unshard_outside_inference_mode"
    # every recipe value other than the declared override is still the frozen one
    frozen = load_protocol(BAGEL).protocol.recipe
    assert {k: v for k, v in p.recipe.items() if v != frozen[k]} == {"policy_group_size": 1}
    # the derived protocol names the same recipe file, by its absolute path (base "/"), and its digest
    assert p.recipe_file is not None and p.recipe_file.path == str(tmp_path / "recipes" / "r3_tree_rl_bagel7b.yaml")
    assert p.recipe_file.sha256 == load_protocol(BAGEL).protocol.recipe_file.sha256  # type: ignore[union-attr]
    assert p.rehearsal.reason == "1 GPU(s): policy_group_size must divide the ranks"


def test_an_override_of_anything_but_policy_groups_is_refused(tmp_path: Path) -> None:
    up, protocol = _fake_upstream(tmp_path)
    inputs_dir = tmp_path / "inputs"
    inputs_dir.mkdir()
    data = derive_protocol(protocol, up, inputs_dir, _inputs(), 1, [1, 2], "f" * 64, ["python", "s.py"])
    data["rehearsal"]["recipe_overrides"]["lr"] = 1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(RefusedError, match="lr may not be overridden"):
        load_protocol(path)


def test_rehearse_refuses_a_tree_that_is_not_upstream_in_one_line(tmp_path: Path) -> None:
    not_upstream = tmp_path / "elsewhere"
    shutil.copytree(REPO / "examples" / "r3_mini" / "modeling", not_upstream / "modeling")
    result = runner.invoke(app, ["rehearse", str(BAGEL), "--upstream", str(not_upstream), "--home",
                                 str(tmp_path / "h")])
    assert result.exit_code == 3
    assert "no train/online_rl.py" in result.output and len(result.output.strip().splitlines()) == 1


def test_calibrate_runs_orch_calibrate_on_the_derived_protocol_with_the_judge_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`orch rehearse --calibrate K`: the derived protocol goes to `orch calibrate` (K A/A launches) instead of one
    launch, while the loopback judge serves; the rehearsal's record names the calibration's runs."""
    from types import SimpleNamespace

    from orchestrator.run import rehearse as mod

    up, protocol = _fake_upstream(tmp_path)
    judge_up: list[bool] = []
    seen: dict[str, object] = {}

    def inputs(upstream: Path, out: Path, size_args: object = ()) -> RehearsalInputs:
        for rel in ("model/llm_config.json", "model/vit_config.json", "model/ae.safetensors", "data/train.jsonl",
                    "data/val.jsonl"):
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text("{}")
        return _inputs()

    def calibrate(path: Path, k: int, home: Path, say: object, lock_timeout: object) -> tuple[object, object]:
        seen.update(path=path, k=k, home=home, judge=list(judge_up))
        return SimpleNamespace(run_id="r3"), SimpleNamespace(run_ids=["r1", "r2", "r3"])

    def no_launch(*args: object, **kwargs: object) -> None:
        raise AssertionError("a calibrating rehearsal launched")

    monkeypatch.setattr(mod, "make_inputs", inputs)
    monkeypatch.setattr(mod, "_start_judge", lambda work, ports: judge_up.append(True))
    monkeypatch.setattr(mod, "_stop_judge", lambda proc, work: judge_up.append(False) or {"stopped": True})
    monkeypatch.setattr(mod, "calibrate", calibrate)
    monkeypatch.setattr(mod, "launch", no_launch)
    home = tmp_path / "home"
    result = mod.rehearse(protocol, up, 1, home, say=lambda _: None, calibrate_repeats=3)
    assert seen == {"path": result.work / "protocol.yaml", "k": 3, "home": home, "judge": [True]}
    assert judge_up == [True, False] and result.judge == {"stopped": True}
    record = json.loads((result.work / "rehearsal.json").read_text())
    assert record["run_id"] == "r3" and record["calibration_run_ids"] == ["r1", "r2", "r3"]


def test_calibrate_with_fewer_than_two_launches_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    up, protocol = _fake_upstream(tmp_path)
    home = tmp_path / "home"
    out = runner.invoke(app, ["rehearse", str(protocol), "--upstream", str(up), "--home", str(home),
                              "--calibrate", "1"])  # fmt: skip
    assert out.exit_code == 2, out.output
    assert "--calibrate 1: an A/A calibration needs at least 2 launches" in out.output
    assert not (home / "rehearsals").exists()
