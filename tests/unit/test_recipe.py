"""The recipe as data: the recipe file's model and its refusals, R3's file (the recipe of every shipped protocol and
of orch.protocol/1), a second trainer's recipe through the same rules, the flag rule (values worked out by hand)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from ledger.verdict.decide.evidence import _run_recipe
from ledger.verdict.decide.recipe_check import recipe_differences as observed_differences
from ledger.verdict.decide.recipe_check import recipe_doc
from protocol.errors import RefusedError
from protocol.recipe import (
    RUN_COPY,
    V1_RECIPE_PATH,
    V1_RECIPE_SHA256,
    ObserveFrozen,
    flag_value_equal,
    load_recipe,
    parse_recipe,
    recipe_flags,
    v1_recipe,
)
from protocol.results import ObservedRecipe, ParamGroup
from protocol.schema import Protocol, RecipeFileRef, load_protocol, protocol_id

REPO = Path(__file__).resolve().parents[2]
MINI = REPO / "protocol" / "r3_mini.yaml"
R3_VALUES = {"group_size": 16, "policy_group_size": 4, "rounds": 2, "global_seed": 4396, "data_seed": 42, "lr": 5e-6,
             "warmup_steps": 10, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0, "max_grad_norm": 1.0,
             "kl_weight_text": 0.001, "kl_weight_image": 0.001, "freeze_vit": True, "total_steps": 1000}
# a second trainer's recipe (TRL GRPO-like): other keys, other flags, a key with no flag, a parameter-group
# hyperparameter read by name, frozen embeddings by a name pattern
TINY = """\
schema: orch.recipe/1
name: tiny-grpo
trainer: a Hugging Face Trainer script
optimizer: AdamW
keys:
  learning_rate: {value: 1.0e-4, flag: --learning_rate, observe: {kind: optimizer, field: lr}}
  adam_beta2: {value: 0.99, flag: --adam_beta2, observe: {kind: optimizer, field: betas, index: 1}}
  amsgrad: {value: false, flag: --amsgrad, observe: {kind: optimizer, field: amsgrad}}
  max_grad_norm: {value: 1.0, flag: --max_grad_norm, observe: {kind: grad_clip}}
  warmup_steps: {value: 2, flag: --warmup_steps, observe: {kind: warmup}}
  num_generations: {value: 4, flag: --num_generations}
  seed: {value: 7, note: fixed in the committed script}
  freeze_embeddings:
    value: true
    flag: --freeze_embeddings
    observe: {kind: frozen, label: embeddings, patterns: ['^model\\.embed_tokens\\.']}
"""


def _write_tiny(root: Path, text: str = TINY) -> str:
    (root / "recipes").mkdir(parents=True, exist_ok=True)
    (root / "recipes" / "tiny.yaml").write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()


def _tiny_protocol(tmp_path: Path, values: str | None = None, args: str | None = None, sha: str | None = None) -> Path:
    """r3-mini's protocol naming the tiny recipe file: its values and flags (or those given)."""
    digest = _write_tiny(tmp_path)
    text = MINI.read_text()
    start, end = text.index("recipe_file:\n"), text.index("precision: fp32")
    values = values if values is not None else ("  learning_rate: 1.0e-4\n  adam_beta2: 0.99\n  amsgrad: false\n"
                                                "  max_grad_norm: 1.0\n  warmup_steps: 2\n  num_generations: 4\n"
                                                "  seed: 7\n  freeze_embeddings: true\n")
    ref = f"recipe_file:\n  path: recipes/tiny.yaml\n  sha256: {sha or digest}\nrecipe:\n{values}"
    text = text[:start] + ref + text[end:]
    a, b = text.index("  args: [\n"), text.index("    # debug skips")
    args = args if args is not None else ('    --learning_rate, "1e-4", --adam_beta2, "0.99", --amsgrad, "False",\n'
                                          '    --max_grad_norm, "1", --warmup_steps, "2", --num_generations, "4",\n'
                                          '    --freeze_embeddings, "True",\n')
    text = text[:a] + "  args: [\n" + args + text[b:]
    path = tmp_path / "protocol" / "tiny.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(RefusedError) as err:
        load_protocol(path)
    assert "\n" not in err.value.message
    return err.value.message


# --- R3's recipe file --------------------------------------------------------------------------------------------

def test_r3s_recipe_file_holds_the_frozen_values_under_their_flags_and_is_pinned() -> None:
    r3 = v1_recipe()
    assert r3.recipe.values() == R3_VALUES and list(r3.recipe.values()) == list(R3_VALUES)
    assert all(r3.recipe.keys[k].flag == f"--{k}" for k in R3_VALUES)
    assert r3.sha256 == V1_RECIPE_SHA256 == hashlib.sha256(V1_RECIPE_PATH.read_bytes()).hexdigest()
    # the audit's order of the observed keys is the order the checks had when they were code
    assert [k for k, _ in r3.recipe.observed_keys()] == [
        "lr", "beta1", "beta2", "eps", "weight_decay", "max_grad_norm", "warmup_steps", "freeze_vit"]
    assert r3.recipe.model_shrinking_flags == {
        "--debug": "upstream debug mode cuts the LLM to 1 layer, loads no weights and stubs the rewards"}


def test_an_edited_r3_recipe_file_is_refused_for_protocol_1(tmp_path: Path) -> None:
    copy = tmp_path / V1_RECIPE_PATH.name
    copy.write_bytes(V1_RECIPE_PATH.read_bytes().replace(b"value: 5.0e-6", b"value: 1.0e-5"))
    with pytest.raises(RefusedError, match=rf"sha256 [0-9a-f]{{64}} is not the protocol's recipe_file.sha256 "
                                           rf"{V1_RECIPE_SHA256}; the frozen recipe changed"):
        load_recipe(copy, copy.name, V1_RECIPE_SHA256)


def test_a_protocol_1_is_read_under_r3s_recipe_and_names_no_file(tmp_path: Path) -> None:
    from protocolutil import v1_text

    path = tmp_path / "protocol" / "v1.yaml"
    path.parent.mkdir()
    path.write_text(v1_text(MINI.read_text()))
    loaded = load_protocol(path)
    assert loaded.protocol.schema_ == "orch.protocol/1" and loaded.protocol.recipe_file is None
    assert loaded.recipe is not None and loaded.recipe.sha256 == V1_RECIPE_SHA256
    path.write_text(path.read_text().replace("  lr: 5.0e-6", "  lr: 1.0e-5"))
    assert "recipe.lr = 1e-05 (upstream 5e-06)" in _refusal(path)
    # schema and recipe_file go together
    path.write_text(MINI.read_text().replace("schema: orch.protocol/2", "schema: orch.protocol/1"))
    assert "recipe_file needs schema: orch.protocol/2" in _refusal(path)
    path.write_text(v1_text(MINI.read_text()).replace("schema: orch.protocol/1", "schema: orch.protocol/2"))
    assert "orch.protocol/2 names its frozen recipe file: add recipe_file (path, sha256)" in _refusal(path)


def test_recipe_values_written_as_another_kind_of_number_keep_the_id(tmp_path: Path) -> None:
    shutil.copytree(REPO / "recipes", tmp_path / "recipes")
    path = tmp_path / "protocol" / "p.yaml"
    path.parent.mkdir()
    path.write_text(MINI.read_text().replace("  weight_decay: 0.0", "  weight_decay: 0").replace(
        "  rounds: 2", "  rounds: 2.0"))
    assert load_protocol(path).id == load_protocol(MINI).id
    path.write_text(MINI.read_text().replace("  freeze_vit: true", "  freeze_vit: 1"))
    assert "recipe.freeze_vit = 1 (upstream True)" in _refusal(path)  # a number is not a truth value


# --- the recipe file's own refusals ----------------------------------------------------------------------------

@pytest.mark.parametrize(("old", "new", "line", "words"), [
    ("  num_generations: {value: 4, flag: --num_generations}", "  num_generations: {value: 4, flg: --n}", 11,
     "keys.num_generations.flg: Extra inputs are not permitted"),
    ("observe: {kind: warmup}", "observe: {kind: cosine}", 10, "keys.warmup_steps.observe: Input tag 'cosine'"),
    ("freeze_embeddings:\n    value: true", "freeze_embeddings:\n    value: 3", 14,
     "keys.freeze_embeddings: observe kind frozen needs a true/false value"),
    ("['^model\\.embed_tokens\\.']", "['(unclosed']", 16, "keys.freeze_embeddings.observe.patterns: pattern"),
    ("flag: --num_generations", "flag: --learning_rate", 6, "keys: flag --learning_rate carries two keys"),
    ("schema: orch.recipe/1", "schema: orch.recipe/9", 1, "schema: Input should be 'orch.recipe/1'"),
    ("  seed: {value: 7, note: fixed in the committed script}", "  seed: {value: [7]}", 12, "keys.seed.value"),
])
def test_a_bad_recipe_file_is_refused_naming_line_and_field(tmp_path: Path, old: str, new: str, line: int,
                                                             words: str) -> None:
    assert old in TINY
    path = tmp_path / "r.yaml"
    raw = TINY.replace(old, new).encode()
    with pytest.raises(RefusedError) as err:
        parse_recipe(path, raw, "r.yaml")
    assert err.value.message.startswith(f"{path}:{line}: {words}"), err.value.message
    assert err.value.message.endswith("; see docs/RECIPES.md")


# --- a second trainer's recipe file ----------------------------------------------------------------------------

def test_a_protocol_names_another_trainers_recipe_file_and_its_digest(tmp_path: Path) -> None:
    path = _tiny_protocol(tmp_path)
    loaded = load_protocol(path)
    assert loaded.recipe is not None and loaded.recipe.named == "recipes/tiny.yaml"
    assert loaded.protocol.recipe["learning_rate"] == 1e-4 and "lr" not in loaded.protocol.recipe
    first = loaded.id
    # the file changes (its owner approved a new value): refused until the protocol commits to the new digest
    digest = _write_tiny(tmp_path, TINY.replace("value: 4, flag", "value: 8, flag"))
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if t.startswith("  sha256:"))
    assert _refusal(path).startswith(f"{path}:{line}: recipes/tiny.yaml: sha256 {digest} is not the protocol's "
                                     "recipe_file.sha256 ")
    path = _tiny_protocol(tmp_path, sha=digest)
    _write_tiny(tmp_path, TINY.replace("value: 4, flag", "value: 8, flag"))
    assert "recipe.num_generations = 4 (upstream 8)" in _refusal(path)
    (tmp_path / "recipes" / "tiny.yaml").unlink()
    assert "recipes/tiny.yaml: cannot read the recipe file" in _refusal(path)
    # the digest is part of the id: the same protocol committed to the new file is another protocol
    again = loaded.protocol.model_copy(update={"recipe_file": RecipeFileRef(path="recipes/tiny.yaml", sha256=digest)})
    assert protocol_id(again) != first == protocol_id(loaded.protocol)


def test_every_differing_key_of_another_recipe_is_named_in_one_line(tmp_path: Path) -> None:
    values = ("  learning_rate: 2.0e-4\n  adam_beta2: 0.99\n  amsgrad: true\n  max_grad_norm: 1.0\n"
              "  num_generations: 4\n  seed: 7\n  freeze_embeddings: true\n  lr: 1.0e-4\n")
    path = _tiny_protocol(tmp_path, values=values)
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if t.startswith("  learning_rate:"))
    assert _refusal(path) == (
        f"{path}:{line}: recipe differs from the frozen upstream recipe (recipes/tiny.yaml): recipe.learning_rate = "
        "0.0002 (upstream 0.0001), recipe.amsgrad = True (upstream False), recipe.warmup_steps missing (upstream 2), "
        "recipe.lr = 0.0001 is not a key of the frozen recipe; restore it")


def test_another_recipes_flags_are_checked_and_a_key_without_a_flag_is_not(tmp_path: Path) -> None:
    args = ('    --learning_rate, "1e-4", --adam_beta2, "0.999", --amsgrad, "False",\n'
            '    --max_grad_norm, "1", --warmup_steps, "2", --freeze_embeddings, "True",\n')
    assert _refusal(_tiny_protocol(tmp_path, args=args)).endswith(
        "launcher.args do not carry the recipe: --adam_beta2 0.999 (recipe adam_beta2 = 0.99); --num_generations "
        "missing (recipe num_generations = 4); pass every recipe value "
        "(or leave `recipe:` out: orch then renders every recipe flag)")
    twice = ('    --learning_rate, "1e-4", --adam_beta2, "0.99", --amsgrad, "False", --max_grad_norm, "1",\n'
             '    --warmup_steps, "2", --num_generations, "4", --freeze_embeddings, "True", --learning=1,\n')
    assert "launcher.args '--learning=1' sets --learning_rate" in _refusal(_tiny_protocol(tmp_path, args=twice))


# --- what the probe observed, checked by the recipe file's observation specs --------------------------------------

def _observed(**changes: object) -> ObservedRecipe:
    base = ObservedRecipe(
        optimizer="AdamW", lr=1e-4, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0, max_grad_norm=1.0, warmup_steps=2,
        frozen=["model.embed_tokens.weight"], trainable=["model.layers", "lm_head"], trainable_params=10,
        frozen_params=4, param_groups=[ParamGroup(tensors=2, numel=10, hyper={"lr": "0.0001", "amsgrad": "False",
                                                                               "betas": "(0.9, 0.99)"})])
    return base.model_copy(update=changes)


def test_the_observed_recipe_is_checked_key_by_key_by_the_files_specs(tmp_path: Path) -> None:
    tiny = parse_recipe(tmp_path / "t.yaml", TINY.encode(), "recipes/tiny.yaml").recipe
    values = tiny.values()
    assert observed_differences(_observed(), values, "A", tiny) == []
    groups = [ParamGroup(tensors=2, numel=10, hyper={"lr": "0.0001", "amsgrad": "True"})]
    assert observed_differences(
        _observed(lr=2e-4, betas=(0.9, 0.999), warmup_steps=0, max_grad_norm=None, param_groups=groups,
                  optimizer="SGD"), values, "C", tiny) == [
        "arm C: learning_rate observed 0.0002, frozen 0.0001",
        "arm C: adam_beta2 observed 0.999, frozen 0.99",
        "arm C: amsgrad observed True, frozen False",
        "arm C: max_grad_norm not observed (frozen 1.0)",
        "arm C: warmup_steps observed 0, frozen 2",
        "arm C: optimizer SGD, frozen AdamW",
    ]
    assert observed_differences(_observed(param_groups=[]), values, "B", tiny) == [
        "arm B: amsgrad not observed (frozen False)"]
    assert observed_differences(_observed(trainable=["model.embed_tokens.weight"], frozen=[]), values, "B", tiny) == [
        "arm B: freeze_embeddings is frozen true but model.embed_tokens.weight trainable (requires_grad=True)"]
    assert observed_differences(_observed(frozen=["lm_head"]), values, "B", tiny) == [
        "arm B: freeze_embeddings is frozen true but no frozen embeddings was observed (frozen: ['lm_head'])"]
    assert observed_differences(_observed(frozen=[], frozen_params=0), {**values, "freeze_embeddings": False},
                                "B", tiny) == []  # nothing frozen by the recipe: nothing to observe


def test_r3s_checks_give_the_answers_they_gave_as_code() -> None:
    r3 = ObservedRecipe(optimizer="AdamW", lr=5e-6, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                        max_grad_norm=1.0, warmup_steps=10, frozen=["vit_model"], trainable=["language_model"],
                        trainable_params=10, frozen_params=5)
    assert observed_differences(r3, R3_VALUES, "A") == []
    cheat = r3.model_copy(update={"eps": 1e-6, "frozen": [], "frozen_params": 0,
                                  "trainable": ["language_model", "vit_model"]})
    assert observed_differences(cheat, R3_VALUES, "C") == [
        "arm C: eps observed 1e-06, frozen 1e-08",
        "arm C: freeze_vit is frozen true but vit_model trainable (requires_grad=True)"]
    assert observed_differences(r3.model_copy(update={"frozen": ["connector"]}), R3_VALUES, "B") == [
        "arm B: freeze_vit is frozen true but no frozen ViT was observed (frozen: ['connector'])"]
    vit = v1_recipe().recipe.keys["freeze_vit"].observe
    assert isinstance(vit, ObserveFrozen) and vit.matches("Bagel#0:vit_pos_embed.pos_embed")


def test_the_run_folders_recipe_copy_must_be_the_one_the_protocol_names(tmp_path: Path) -> None:
    path = _tiny_protocol(tmp_path)
    protocol = Protocol.model_validate_json(load_protocol(path).protocol.model_dump_json(by_alias=True))
    problems: list[str] = []
    assert _run_recipe(tmp_path, protocol, problems) is None
    assert problems == [f"{RUN_COPY}: missing (the copy of the protocol's recipe file recipes/tiny.yaml)"]
    (tmp_path / RUN_COPY).write_text(TINY)
    found = _run_recipe(tmp_path, protocol, problems)
    assert found is not None and found.recipe.name == "tiny-grpo" and len(problems) == 1
    doc = recipe_doc(found)
    assert doc is not None and doc["file"] == "recipes/tiny.yaml" and doc["sha256"] == found.sha256
    assert doc["observed_keys"] == ["learning_rate", "adam_beta2", "amsgrad", "max_grad_norm", "warmup_steps",
                                    "freeze_embeddings"]
    assert doc["flag_only_keys"] == ["num_generations", "seed"]
    (tmp_path / RUN_COPY).write_text(TINY.replace("0.99", "0.98"))
    assert _run_recipe(tmp_path, protocol, problems) is None
    assert problems[-1] == (f"{RUN_COPY}: its sha256 is not protocol.json's recipe_file.sha256 (the recipe copy was "
                            "altered)")


# --- the flag rule ------------------------------------------------------------------------------------------------

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
    assert len(flags) == 2 * len(R3_VALUES) == 32
    pairs = dict(zip(flags[::2], flags[1::2], strict=True))
    assert pairs["--lr"] == "5e-06" and pairs["--eps"] == "1e-08" and pairs["--freeze_vit"] == "True"
    assert pairs["--beta2"] == "0.95" and pairs["--global_seed"] == "4396" and pairs["--data_seed"] == "42"
    tiny = parse_recipe(Path("t.yaml"), TINY.encode(), "t.yaml").recipe
    assert recipe_flags(tiny)[:4] == ["--learning_rate", "0.0001", "--adam_beta2", "0.99"]
    assert "--seed" not in recipe_flags(tiny)  # a key without a flag is not passed
