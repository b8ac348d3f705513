"""What the probe learns of the trained model, each rule with a model built by hand: the optimizer's groups as the
recipe fixes them, frozen and trainable names (collapsed by module), which live module is the trained one, the
tensors a digest covers, and the checkpoint's layout (orch.ckpt/1)."""

from __future__ import annotations

import gc
import hashlib
import zipfile
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from workers.rank import probe_model  # noqa: E402
from workers.rank.probe_model import collapse, discover, named_tensors, param_group, save_checkpoint  # noqa: E402

# a process's first optimizer imports torch's compiler stack (about 3 s here): done once, when the tests are collected
# (mutmut forks each mutant's run from a process that has collected them)
torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)


def _frozen(module: Any) -> Any:
    for p in module.parameters():
        p.requires_grad_(False)
    return module


class Net(torch.nn.Module):
    """scale (1, frozen), vit (6, frozen), head (3), mixed.0 (6, frozen), mixed.1 (6), layers.0/1 (4 each)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1), requires_grad=False)
        self.vit = _frozen(torch.nn.Linear(2, 2))
        self.head = torch.nn.Linear(2, 1)
        self.mixed = torch.nn.Sequential(_frozen(torch.nn.Linear(2, 2)), torch.nn.Linear(2, 2))
        self.layers = torch.nn.ModuleList([torch.nn.Linear(1, 2), torch.nn.Linear(1, 2)])


class Alpha(torch.nn.Linear):
    pass


class Beta(torch.nn.Linear):
    pass


def test_a_group_as_the_recipe_fixes_it() -> None:
    a, b = torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(4))
    group = {"params": [a, b], "lr": 0.5, "initial_lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0,
             "amsgrad": False, "foreach": None, "fused": None, "capturable": False, "differentiable": False,
             "name": "decay", "t": torch.tensor(3.0), "big": torch.zeros(2), "obj": object(), "mix": [1, "a"],
             "ints": [1, 2], "nothing": None}
    assert param_group(group) == {"tensors": 2, "numel": 10, "hyper": {
        "amsgrad": "False", "betas": "(0.9, 0.95)", "eps": "1e-08", "ints": "(1.0, 2.0)", "lr": "0.001",
        "name": "'decay'", "nothing": "None", "t": "3.0", "weight_decay": "0"}}
    assert param_group({"params": [a], "lr": 2}) == {"tensors": 1, "numel": 6, "hyper": {"lr": "2.0"}}


def test_frozen_and_trainable_names_collapse_by_module() -> None:
    net = Net()
    assert collapse(net, "") == ["scale", "vit", "mixed.0"]
    assert collapse(net, "", frozen=False) == ["head", "mixed.1", "layers"]
    assert collapse(net, "m.", frozen=False) == ["m.head", "m.mixed.1", "m.layers"]
    assert collapse(_frozen(torch.nn.Linear(2, 2)), "") == ["<all>"]
    assert collapse(_frozen(torch.nn.Linear(2, 2)), "vit.") == ["vit"]
    assert collapse(_frozen(torch.nn.Linear(2, 2)), "projX.") == ["projX"]  # only the one trailing dot goes
    # the trained module itself is named by its parts, never '<all>'
    assert collapse(torch.nn.Linear(2, 2), "", frozen=False) == ["weight", "bias"]
    assert collapse(torch.nn.Linear(2, 2), "") == []
    assert collapse(torch.nn.ReLU(), "x.") == [] and collapse(torch.nn.ReLU(), "x.", frozen=False) == []


def _live(monkeypatch: pytest.MonkeyPatch, objects: list[Any]) -> None:
    """The objects discovery walks: these, not every object of the test process."""
    monkeypatch.setattr(gc, "get_objects", lambda: list(objects))


def test_discovery_finds_the_trained_module_and_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    net = Net()
    ref, ref2 = torch.nn.Linear(3, 3), _frozen(torch.nn.Linear(1, 1))  # 12 elements (its 9 weights frozen), 2 frozen
    ref.weight.requires_grad_(False)
    ref3 = _frozen(torch.nn.Linear(2, 1))  # 3 frozen: a third Linear, between the two by size
    aux = torch.nn.Sequential(_frozen(torch.nn.Linear(2, 2)), torch.nn.Linear(2, 2))  # 6 frozen, 6 not
    wrapper = torch.nn.Sequential(net.vit, net.mixed)  # only the trained module's parameters; sorts before aux
    side = torch.nn.Linear(1, 1)  # trained too, in the second group: covers 2 of the optimized parameters
    helper = torch.nn.Linear(4, 4)  # live, trainable, not optimized: neither root nor frozen
    trained = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": trained, "lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-6,
                                    "weight_decay": 0.1},
                                   {"params": list(side.parameters()), "lr": 5e-4}])
    optimizer.param_groups[0]["initial_lr"] = 2e-3
    # every live module, the inner ones too, as gc lists them
    _live(monkeypatch, [helper, "a string", side, ref2, wrapper, aux, net, ref, ref3, *aux, *net.modules()])
    found = discover(optimizer, 1.0)
    assert found.root is net
    assert found.param_names == {id(p): n for n, p in net.named_parameters()}
    recipe = found.recipe
    groups = recipe.pop("param_groups")
    assert recipe == {
        "optimizer": "AdamW", "lr": 0.002, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1,
        "max_grad_norm": 1.0,
        "frozen": ["scale", "vit", "mixed.0", "Linear#0:weight", "Linear#1", "Linear#2", "Sequential#0:0"],
        "trainable_params": 3 + 6 + 8, "frozen_params": (1 + 6 + 6) + (9 + 3 + 2 + 6), "layers": {"layers": 2},
        "trainable": ["head", "mixed.1", "layers"], "optimizer_params": 17 + 2}
    assert [(g["tensors"], g["numel"], g["hyper"]["lr"]) for g in groups] == [(8, 17, "0.002"), (2, 2, "0.0005")]


class Plain(torch.optim.Optimizer):
    """An optimizer whose groups hold only a learning rate (no betas, eps or weight decay)."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    def step(self, closure: Any = None) -> None:
        return None


def test_of_two_modules_covering_as_many_parameters_the_first_by_class_name_is_the_root(
        monkeypatch: pytest.MonkeyPatch) -> None:
    beta, alpha = Beta(2, 2), Alpha(2, 2)
    optimizer = Plain([*beta.parameters(), *alpha.parameters()], lr=0.1)
    _live(monkeypatch, [beta, alpha])
    found = discover(optimizer, None)
    assert found.root is alpha and found.recipe["trainable"] == ["weight", "bias"]
    assert (found.recipe["betas"], found.recipe["eps"], found.recipe["weight_decay"]) == ([0.0, 0.0], 0.0, 0.0)
    assert found.recipe["max_grad_norm"] is None and found.recipe["lr"] == 0.1
    assert found.recipe["optimizer"] == "Plain"


def test_without_a_live_module_holding_the_parameters_there_is_no_root(monkeypatch: pytest.MonkeyPatch) -> None:
    loose = torch.nn.Parameter(torch.zeros(3))
    ref = _frozen(torch.nn.Linear(2, 2))
    optimizer = torch.optim.SGD([loose], lr=0.1, weight_decay=0.01)
    _live(monkeypatch, [ref, torch.nn.Linear(5, 5)])
    found = discover(optimizer, None)
    assert found.root is None and found.param_names == {}
    recipe = found.recipe
    assert (recipe["frozen"], recipe["trainable"], recipe["frozen_params"], recipe["trainable_params"]) == (
        ["Linear#0"], [], 6, 0)
    assert (recipe["layers"], recipe["optimizer_params"], recipe["weight_decay"]) == ({}, 3, 0.01)


def test_the_tensors_of_a_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(2, 1), _frozen(torch.nn.Linear(1, 1)))
    loose, idle = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(1))  # idle: no grad, no state
    optimizer = torch.optim.SGD([{"params": list(net[0].parameters()), "momentum": 0.9},
                                 {"params": [loose, idle], "momentum": 0.9}], lr=0.1)
    net(torch.ones(1, 2)).sum().backward()
    loose.grad = torch.ones(2)
    optimizer.step()
    optimizer.state[loose]["count"] = 3  # not a tensor: not digested
    names = {id(p): n for n, p in net.named_parameters()}
    out = named_tensors(net, names, optimizer)
    assert list(out) == ["param/0.weight", "param/0.bias", "param/1.weight", "param/1.bias",
                         "optim/0.weight/momentum_buffer", "optim/0.bias/momentum_buffer",
                         "param/<group1.0>", "optim/<group1.0>/momentum_buffer", "param/<group1.1>"]
    assert out["param/1.weight"] is net[1].weight and out["param/<group1.0>"] is loose
    assert out["optim/<group1.0>/momentum_buffer"] is optimizer.state[loose]["momentum_buffer"]
    assert list(named_tensors(None, {}, optimizer)) == [
        "param/<group0.0>", "optim/<group0.0>/momentum_buffer", "param/<group0.1>",
        "optim/<group0.1>/momentum_buffer", "param/<group1.0>", "optim/<group1.0>/momentum_buffer",
        "param/<group1.1>"]


class _Sharded:
    """Stands for a DTensor: its global shape, its placements, and its local shard."""

    def __init__(self, local: Any, shape: tuple[int, ...], placements: Any) -> None:
        self.local, self.shape, self.placements = local, shape, placements

    def to_local(self) -> Any:
        return self.local


def test_a_checkpoint_holds_each_ranks_local_shards_and_their_layout(tmp_path: Path) -> None:
    w = torch.arange(6.0).reshape(3, 2)
    tensors = {
        "param/w": w,
        "param/emb": _Sharded(torch.ones(2, 4), (4, 4), ("Shard(dim=0)",)),
        "param/col": _Sharded(torch.zeros(4, 2), (4, 4), ("Shard(dim=1)",)),
        "optim/w/exp_avg": torch.full((3, 2), 0.5),
        "optim/<group1.0>/step": torch.tensor(7.0),
        "optim/odd/name/exp_avg": torch.zeros(1),  # a name with a '/' in it: the key is what follows the last one
        "param/view": torch.arange(1000.0)[10:12],  # views into a larger buffer (as a flat parameter's are)
        "optim/view/exp_avg": torch.arange(1000.0)[:3],
    }
    folder = tmp_path / "a" / "ckpt"
    name, sha = save_checkpoint(tensors, folder, 1, 2)
    path = folder / "rank1.pt"
    assert name == "rank1.pt" and sha == hashlib.sha256(path.read_bytes()).hexdigest()
    assert sorted(p.name for p in folder.iterdir()) == ["rank1.pt"]
    assert save_checkpoint({"param/w": w}, folder, 0, 2)[0] == "rank0.pt"  # the folder exists now: no error
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.pt", "rank1.pt"]
    doc = torch.load(path)
    assert (doc["schema"], doc["rank"], doc["world_size"]) == ("orch.ckpt/1", 1, 2)
    assert doc["param_meta"] == {"w": {"global_shape": [3, 2], "placement": "replicate"},
                                 "view": {"global_shape": [2], "placement": "replicate"},
                                 "emb": {"global_shape": [4, 4], "placement": "shard0"},
                                 "col": {"global_shape": [4, 4], "placement": "('Shard(dim=1)',)"}}
    assert torch.equal(doc["params"]["w"], w) and torch.equal(doc["params"]["emb"], torch.ones(2, 4))
    assert list(doc["params"]) == ["w", "emb", "col", "view"]
    assert list(doc["optim"]) == ["w", "<group1.0>", "odd/name", "view"]
    assert list(doc["optim"]["odd/name"]) == ["exp_avg"]
    # a view is saved as its own elements, not the buffer under it: 2 and 3 float32 values
    assert torch.equal(doc["params"]["view"], torch.tensor([10.0, 11.0]))
    assert doc["params"]["view"].untyped_storage().nbytes() == 8
    assert doc["optim"]["view"]["exp_avg"].untyped_storage().nbytes() == 12
    assert torch.equal(doc["optim"]["w"]["exp_avg"], torch.full((3, 2), 0.5))
    assert torch.equal(doc["optim"]["<group1.0>"]["step"], torch.tensor(7.0))
    assert doc["devices"] == dict.fromkeys(tensors, "cpu")


def test_is_module_reads_the_real_type() -> None:
    assert probe_model.is_module(torch.nn.Linear(1, 1), torch.nn.Module)
    assert not probe_model.is_module(object(), torch.nn.Module)


class Tiny(torch.nn.Module):
    """A Hugging Face-style causal LM in miniature: model.embed_tokens (frozen), model.layers.0, lm_head."""

    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = _frozen(torch.nn.Embedding(5, 2))
        self.model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
        self.lm_head = torch.nn.Linear(2, 5)


def test_an_adamw_with_a_linear_warm_up_is_observed_by_a_second_recipes_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The optimizer a Hugging Face Trainer builds (AdamW, a decay and a no-decay group, LambdaLR linear warm-up),
    observed by the probe's discovery and warm-up rule and checked by the observation specs of a recipe file."""
    from ledger.verdict.decide.recipe_check import recipe_differences
    from protocol.recipe import parse_recipe
    from protocol.results import ObservedRecipe
    from workers.rank.probe_model import warmup_steps

    net = Tiny()
    decay = [p for n, p in net.named_parameters() if p.requires_grad and n.endswith("weight")]
    no_decay = [p for n, p in net.named_parameters() if p.requires_grad and n.endswith("bias")]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-4, betas=(0.9, 0.99), eps=1e-8)
    warm, total = 2, 8
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: s / max(1, warm) if s < warm else max(0.0, (total - s) / max(1, total - warm)))
    lrs = []
    for _ in range(4):  # the lr each step runs with, as the probe reads it at the step's optimizer hook
        lrs.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        scheduler.step()
    _live(monkeypatch, [net, *net.modules()])
    found = discover(optimizer, 1.0)
    observed = ObservedRecipe.model_validate({**found.recipe, "warmup_steps": warmup_steps(lrs, found.recipe["lr"])})
    assert observed.frozen == ["model.embed_tokens"] and observed.warmup_steps == warm and lrs[:3] == [0.0, 5e-5, 1e-4]
    recipe = parse_recipe(Path("r.yaml"), b"""\
schema: orch.recipe/1
name: hf-tiny
trainer: a Hugging Face Trainer script
optimizer: AdamW
keys:
  learning_rate: {value: 1.0e-4, flag: --learning_rate, observe: {kind: optimizer, field: lr}}
  adam_beta2: {value: 0.99, flag: --adam_beta2, observe: {kind: optimizer, field: betas, index: 1}}
  adam_epsilon: {value: 1.0e-8, flag: --adam_epsilon, observe: {kind: optimizer, field: eps}}
  weight_decay: {value: 0.01, flag: --weight_decay, observe: {kind: optimizer, field: weight_decay}}
  no_decay_weight_decay: {value: 0.0, observe: {kind: optimizer, field: weight_decay, group: 1}}
  warmup_steps: {value: 2, flag: --warmup_steps, observe: {kind: warmup}}
  max_grad_norm: {value: 1.0, flag: --max_grad_norm, observe: {kind: grad_clip}}
  freeze_embeddings: {value: true, observe: {kind: frozen, label: embeddings, patterns: ['embed_tokens']}}
""", "r.yaml").recipe
    assert recipe_differences(observed, recipe.values(), "A", recipe) == []
    assert recipe_differences(observed, {**recipe.values(), "weight_decay": 0.1, "warmup_steps": 0}, "C", recipe) == [
        "arm C: weight_decay observed 0.01, frozen 0.1", "arm C: warmup_steps observed 2, frozen 0"]
    net.model.embed_tokens.weight.requires_grad_(True)  # unfrozen in code: named
    found = discover(optimizer, 1.0)
    unfrozen = ObservedRecipe.model_validate({**found.recipe, "warmup_steps": 2})
    assert recipe_differences(unfrozen, recipe.values(), "C", recipe) == [
        "arm C: freeze_embeddings is frozen true but no frozen embeddings was observed (frozen: [])"]
    assert warmup_steps([1e-4, 1e-4], 1e-4) == 0 and warmup_steps([0.0, 5e-5], 1e-4) is None  # constant; never reached


def test_a_checkpoint_is_written_without_zip_crcs_and_torchs_setting_is_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's SHA256 is the checkpoint's integrity record; the zip records' CRC32 is not computed (most of a large
    save), unless asked, and torch's process-wide setting is what it was afterwards, even when the save fails."""
    w = torch.arange(6.0)
    for crc in (False, True):  # without the argument: no CRC
        asked = {"zip_crc32": True} if crc else {}
        name, sha = save_checkpoint({"param/w": w}, tmp_path / str(crc), 0, 1, **asked)
        path = tmp_path / str(crc) / name
        assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
        with zipfile.ZipFile(path) as z:
            assert all((i.CRC != 0) == crc for i in z.infolist() if i.file_size)
        assert torch.equal(torch.load(path, weights_only=True)["params"]["w"], w)
        assert torch.serialization.get_crc32_options() is True
    torch.serialization.set_crc32_options(False)  # a trainer that turned it off finds it off after the save
    try:
        save_checkpoint({"param/w": w}, tmp_path / "kept", 0, 1, zip_crc32=True)
        assert torch.serialization.get_crc32_options() is False
        seen = []

        def full_disk(obj: Any, f: Any) -> None:
            seen.append(torch.serialization.get_crc32_options())
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(torch, "save", full_disk)
        with pytest.raises(OSError, match="No space"):
            save_checkpoint({"param/w": w}, tmp_path / "bad", 0, 1, zip_crc32=True)
        assert seen == [True] and torch.serialization.get_crc32_options() is False
    finally:
        torch.serialization.set_crc32_options(True)
