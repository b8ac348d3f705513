"""orch init (issue 33): drafts of a recipe file and a short-form protocol from a training script, read statically.

TRL's GRPOConfig fields come from the real workers.arg_fields where trl is importable, else from its recorded output
(tests/fixtures/init/, trl 1.16.0 with transformers 5.24.0): orch itself never imports them.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.init.draft import InitOptions, classify, init_command
from orchestrator.init.script_args import read_script
from protocol.errors import UsageError
from protocol.recipe import load_recipe, v1_recipe
from protocol.schema import load_protocol

REPO = Path(__file__).resolve().parents[2]
RECORDED = json.loads((REPO / "tests" / "fixtures" / "init" / "grpo_config_trl1.16.0.json").read_text())
# the documented edits (docs/GUIDE.md, docs/REFERENCE.md "orch init") that make the TRL example's draft its recipe
TRL_EDITS = ["learning_rate=1e-5", "warmup_steps=10", "beta=0.04", "num_generations=4", "max_completion_length=16",
             "per_device_train_batch_size=16", "max_steps=1000", "layers=4", "hidden_size=512"]


def recorded(specs: Sequence[str]) -> dict[str, Any]:
    return {s: RECORDED.get(s, {"error": "ModuleNotFoundError: not recorded"}) for s in specs}


def _project(tmp_path: Path, example: str) -> Path:
    shutil.copytree(REPO / "examples" / example, tmp_path / "examples" / example,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_trl_draft_is_the_shipped_recipe_after_the_documented_edits(tmp_path: Path) -> None:
    root = _project(tmp_path, "trl_grpo")
    opts = InitOptions(script=root / "examples/trl_grpo/train_grpo.py", device="cpu", name="trl-grpo-tiny",
                       sets=TRL_EDITS, drops=["gradient_accumulation_steps"], root=root)
    doc = init_command(opts, recorded)
    drafted = load_recipe(root / doc["recipe_file"], doc["recipe_file"], None).recipe
    shipped = load_recipe(REPO / "recipes/trl_grpo_tiny.yaml", "recipes/trl_grpo_tiny.yaml", None).recipe
    assert drafted == shipped
    assert list(drafted.keys) == list(shipped.keys)  # the same order too
    assert doc["trainer"] == "TRL GRPOTrainer" and doc["versions"] == {"transformers": "5.24.0", "trl": "1.16.0"}
    assert set(doc["observed"]) == {"learning_rate", "warmup_steps", "adam_beta1", "adam_beta2", "adam_epsilon",
                                    "weight_decay", "max_grad_norm"}
    # nothing is guessed silently: every field is a key, a run setting or listed, and the list is in the file
    names = {u["name"] for u in doc["unclassified"]}
    assert {"top_p", "loss_type", "optim", "num_train_epochs"} <= names
    assert len(drafted.keys) + len(doc["run_settings"]) + len(names) == 191 + 4 - 1  # GRPOConfig, TaskArguments
    text = (root / doc["recipe_file"]).read_text()
    assert "#   top_p: 1.0  # a field of GRPOConfig" in text and "#   optim: adamw_torch_fused" in text
    # the protocol draft is the short form and loads against the recipe draft
    protocol = load_protocol(root / doc["protocol"])
    assert protocol.protocol.launcher.args[:2] == ["--learning_rate", "1e-05"]
    assert protocol.protocol.launcher.device == "cpu" and protocol.protocol.precision == "fp32"
    assert "\nrecipe:" not in (root / doc["protocol"]).read_text()


def test_the_trl_draft_with_the_real_trl_when_it_is_importable(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from orchestrator.init.draft import default_python, introspect_subprocess

    root = _project(tmp_path, "trl_grpo")
    draft = classify(root / "examples/trl_grpo/train_grpo.py", introspect_subprocess(default_python()))
    assert not draft.problems and draft.trainer == "TRL GRPOTrainer" and "learning_rate" in draft.keys


def test_r3_minis_copy_of_the_upstream_arguments_is_recognised_as_r3(tmp_path: Path) -> None:
    root = _project(tmp_path, "r3_mini")
    script = root / "examples/r3_mini/train/online_rl.py"
    assert set(read_script(script).library) == set()  # r3-mini's own dataclasses, read statically
    doc = init_command(InitOptions(script=script, gpus=1, device="cuda", name="r3", root=root), recorded)
    drafted = load_recipe(root / doc["recipe_file"], doc["recipe_file"], None).recipe
    r3 = v1_recipe().recipe
    assert doc["trainer"] == "R3 online_rl.py"
    assert list(drafted.keys)[: len(r3.keys)] == list(r3.keys)  # R3's recipe keys first, in its order
    for key, spec in r3.keys.items():  # each with its flag and observation (values: r3-mini's defaults)
        assert (drafted.keys[key].flag, drafted.keys[key].observe) == (spec.flag, spec.observe), key
    assert {"log_dir", "device", "precision", "debug", "eval_freq", "resume_from"} <= set(doc["run_settings"]) | {
        u["name"] for u in doc["unclassified"]}
    unclassified = {u["name"]: u["why"] for u in doc["unclassified"]}
    assert unclassified["tune_text_cot"] == "the script's own bool argument"
    data = yaml.safe_load((root / doc["protocol"]).read_text())
    assert data["launcher"]["device"] == "cuda" and data["precision"] == "bf16" and data["launcher"]["nproc"] == 1
    assert data["launcher"]["args"][:4] == ["--log_dir", "{trainer_dir}", "--device", "cuda"][:0] + data[
        "launcher"]["args"][:4]
    assert {"--device", "--precision", "--log_dir"} <= set(data["launcher"]["args"])


SFT = '''
import argparse
from dataclasses import dataclass, field
from transformers import Trainer, TrainingArguments, HfArgumentParser

@dataclass
class ScriptArguments:
    model_name: str = "gpt2"
    max_length: int = 512
    dataset_path: str = field(default="data.jsonl")
    lora_rank: int = field(default=8)
    packing: bool = False

def main():
    script_args, training_args = HfArgumentParser((ScriptArguments, TrainingArguments)).parse_args_into_dataclasses()
    Trainer(model=None, args=training_args).train()

if __name__ == "__main__":
    main()
'''


def _hf_only(specs: Sequence[str]) -> dict[str, Any]:
    """transformers' TrainingArguments: GRPOConfig's recorded fields that TrainingArguments declares."""
    grpo = RECORDED["trl:GRPOConfig"]
    fields = [f for f in grpo["fields"] if f["defined_in"] == "transformers.training_args.TrainingArguments"]
    doc = {"spec": "transformers:TrainingArguments", "class": "transformers.training_args.TrainingArguments",
           "mro": ["transformers.training_args.TrainingArguments"], "versions": {"transformers": "5.24.0"},
           "fields": fields}
    return {s: doc for s in specs if s == "transformers:TrainingArguments"}


def test_a_plain_transformers_sft_script_gets_the_trainers_keys_and_its_own_numbers(tmp_path: Path) -> None:
    (tmp_path / "sft.py").write_text(SFT)
    doc = init_command(InitOptions(script=tmp_path / "sft.py", gpus=2, device="cuda", root=tmp_path), _hf_only)
    assert doc["trainer"] == "Hugging Face Trainer"
    assert list(doc["keys"])[:8] == ["learning_rate", "warmup_steps", "lr_scheduler_type", "adam_beta1",
                                     "adam_beta2", "adam_epsilon", "weight_decay", "max_grad_norm"]
    assert doc["keys"]["max_length"] == doc["keys"]["lora_rank"] == "a number the script defines itself"
    assert "beta" not in doc["keys"]  # a TRL key, not the Trainer's
    assert {"model_name", "dataset_path"} <= set(doc["run_settings"])
    assert {"packing": "the script's own bool argument"}.items() <= {
        u["name"]: u["why"] for u in doc["unclassified"]}.items()
    data = yaml.safe_load((tmp_path / doc["protocol"]).read_text())
    assert data["launcher"]["nproc"] == 2 and data["launcher"]["args"][:2] == ["--bf16", "True"]


def test_argparse_scripts_and_what_init_refuses(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr', type=float, default=3e-4)\n"
        "p.add_argument('--data', required=True)\np.add_argument('--fused', action='store_true')\n"
        "p.add_argument('--steps', type=int, default=100)\n")
    doc = init_command(InitOptions(script=tmp_path / "t.py", device="cpu", root=tmp_path), recorded)
    assert doc["trainer"] == "not recognised" and list(doc["keys"]) == ["lr", "steps"]
    assert {u["name"]: u["why"] for u in doc["unclassified"]} == {"data": "no default value to freeze",
                                                                  "fused": "the script's own switch argument"}
    assert "EDIT_ME" in (tmp_path / doc["protocol"]).read_text()  # the required --data is left for the user
    with pytest.raises(Exception, match="exists; orch init never overwrites"):
        init_command(InitOptions(script=tmp_path / "t.py", device="cpu", root=tmp_path), recorded)
    with pytest.raises(UsageError, match="--set nope: not an argument of the script"):
        init_command(InitOptions(script=tmp_path / "t.py", device="cpu", root=tmp_path, sets=["nope=1"],
                                 force=True), recorded)


def test_orch_init_on_the_command_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.orch import app

    (tmp_path / "train.py").write_text("import argparse\np = argparse.ArgumentParser()\n"
                                       "p.add_argument('--lr', type=float, default=3e-4)\n")
    runner = CliRunner()
    done = runner.invoke(app, ["init", str(tmp_path / "train.py"), "--gpus", "1", "--root", str(tmp_path),
                               "--set", "lr=1e-3", "--candidate-switch", "FUSED=1", "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["keys"] == {"lr": "a number the script defines itself"}
    data = yaml.safe_load((tmp_path / "protocol" / "train_cuda1.yaml").read_text())
    assert data["arms"]["candidate"]["switches"] == {"FUSED": "1"} and data["name"] == "train-cuda1"
    assert "value: 0.001" in (tmp_path / "recipes" / "train.yaml").read_text()
    assert runner.invoke(app, ["init", str(tmp_path / "train.py")]).exit_code == 2  # neither --device nor --gpus


def test_the_drafts_say_what_they_are_and_protocol_only_keeps_the_candidate(tmp_path: Path) -> None:
    (tmp_path / "sft.py").write_text(SFT)  # issue 53: the header, the candidate across --protocol-only, the list
    first = InitOptions(script=tmp_path / "sft.py", device="cpu", root=tmp_path,
                        config={"gradient_checkpointing": "True"})
    doc = init_command(first, _hf_only)
    text = (tmp_path / doc["protocol"]).read_text()
    assert "the baseline with --gradient_checkpointing True" in text
    assert "a null" not in text and "EDIT_ME" not in text  # the script has no required argument
    why = {u["name"]: u["why"] for u in doc["unclassified"]}
    assert why["num_train_epochs"].startswith("a field of TrainingArguments; it may matter: with max_steps -1")
    assert "it may matter: which optimizer" in why["optim"]
    recipe = (tmp_path / doc["recipe_file"]).read_text()
    assert "#   num_train_epochs: 3.0  # a field of TrainingArguments; it may matter: with max_steps -1" in recipe
    again = InitOptions(script=tmp_path / "sft.py", device="cpu", root=tmp_path, protocol_only=True, force=True)
    init_command(again, _hf_only)  # the candidate is not given again: it stays, never silently a null
    data = yaml.safe_load((tmp_path / doc["protocol"]).read_text())
    assert data["arms"]["candidate"]["config"] == {"gradient_checkpointing": "True"}
    init_command(InitOptions(script=tmp_path / "sft.py", device="cpu", root=tmp_path, protocol_only=True, force=True,
                             switches={"FUSED": "1"}), _hf_only)  # a candidate given now replaces it
    data = yaml.safe_load((tmp_path / doc["protocol"]).read_text())
    assert data["arms"]["candidate"] == {"commitment": "manifests/sft.json", "source": "tree",
                                         "switches": {"FUSED": "1"}}
    assert "a null" not in (tmp_path / doc["protocol"]).read_text()
