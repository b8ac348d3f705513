"""What the probe learns of the trained model at the first step: which module the optimizer trains, the recipe
as the trainer built it, the tensors a step's digest covers, and the checkpoint the reload package reads back.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.fileio import regular_sha256
from workers.rank.model_shape import layer_counts
from workers.rank.tx128 import local_tensor

_IMPLEMENTATION_FLAGS = ("params", "lr", "initial_lr", "foreach", "fused", "capturable", "differentiable")


def param_group(group: dict[str, Any]) -> dict[str, Any]:
    """An optimizer group as the recipe fixes it: tensor count, elements, hyperparameters (repr, base lr)."""
    import torch

    def shown(v: Any) -> str | None:
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            return repr(float(v))
        if isinstance(v, (bool, int, float, str)) or v is None:
            return repr(v)
        if isinstance(v, (tuple, list)) and all(isinstance(x, (int, float)) for x in v):
            return repr(tuple(float(x) for x in v))
        return None

    hyper = {k: r for k, v in sorted(group.items()) if k not in _IMPLEMENTATION_FLAGS and (r := shown(v)) is not None}
    hyper["lr"] = repr(float(group.get("initial_lr", group["lr"])))
    return {"tensors": len(group["params"]), "numel": int(sum(p.numel() for p in group["params"])), "hyper": hyper}


def is_module(obj: Any, module_type: type) -> bool:
    """By the object's real type: isinstance() reads `__class__`, which lazy proxies (weakref.proxy, openai's
    module client) compute, and computing it can raise or load a client."""
    return issubclass(type(obj), module_type)


def collapse(module: Any, prefix: str, frozen: bool = True) -> list[str]:
    """Names of frozen (or trainable) parameters, a module wholly so named once by its path ('<all>': all)."""
    params = list(module.parameters())
    # the trained module itself is never collapsed into '<all>' for trainable names: its parts are named
    if params and all(p.requires_grad != frozen for p in params) and (frozen or prefix):
        return [prefix.rstrip(".") or "<all>"]
    out = [prefix + n for n, p in module.named_parameters(recurse=False) if p.requires_grad != frozen]
    for name, child in module.named_children():
        out.extend(collapse(child, f"{prefix}{name}.", frozen))
    return out


@dataclass
class TrainedModel:
    """The module the optimizer trains (None: no live module holds its parameters), its parameters' names by id,
    and the recipe as the trainer built it (the warm-up is added at the end, from the learning rates seen)."""

    root: Any
    param_names: dict[int, str]
    recipe: dict[str, Any]


def discover(optimizer: Any, max_norm: float | None) -> TrainedModel:
    """Every live module, by its real type; the root is the top-level module that holds most optimized parameters."""
    import torch

    opt_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance on deprecated torch objects warns
        modules = [o for o in gc.get_objects() if is_module(o, torch.nn.Module)]
    inner: set[int] = set()
    for m in modules:
        inner.update(id(s) for s in m.modules() if s is not m)
    top = [m for m in modules if id(m) not in inner]

    def covered(m: Any) -> int:
        return sum(1 for p in m.parameters() if id(p) in opt_ids)

    roots = sorted((m for m in top if covered(m)), key=lambda m: (-covered(m), type(m).__name__))
    root = roots[0] if roots else None
    param_names: dict[int, str] = {}
    if root is not None:
        param_names = {id(p): n for n, p in root.named_parameters()}
    root_ids = set(param_names)
    frozen: list[str] = collapse(root, "") if root is not None else []
    frozen_n = sum(p.numel() for p in root.parameters() if not p.requires_grad) if root else 0
    trainable_n = sum(p.numel() for p in root.parameters() if p.requires_grad) if root else 0
    others = [m for m in top if m is not root and any(not p.requires_grad for p in m.parameters())]
    others.sort(key=lambda m: (type(m).__name__, -sum(p.numel() for p in m.parameters())))
    seen: dict[str, int] = {}
    for m in others:
        own = [p for p in m.parameters() if id(p) not in root_ids and not p.requires_grad]
        if not own:
            continue
        cls = type(m).__name__
        label = f"{cls}#{seen.get(cls, 0)}"
        seen[cls] = seen.get(cls, 0) + 1
        frozen.extend(label + ("" if n == "<all>" else f":{n}") for n in collapse(m, ""))
        frozen_n += sum(p.numel() for p in own)
    g0 = optimizer.param_groups[0]
    trainable: list[str] = collapse(root, "", frozen=False) if root is not None else []
    recipe = {
        "optimizer": type(optimizer).__name__,
        "lr": float(g0.get("initial_lr", g0["lr"])),
        "betas": [float(b) for b in g0.get("betas", (0.0, 0.0))],
        "eps": float(g0.get("eps", 0.0)),
        "weight_decay": float(g0.get("weight_decay", 0.0)),
        "max_grad_norm": max_norm,
        "frozen": frozen,
        "trainable_params": int(trainable_n),
        "frozen_params": int(frozen_n),
        "layers": layer_counts(param_names.values()),
        "trainable": trainable,
        "optimizer_params": int(sum(p.numel() for g in optimizer.param_groups for p in g["params"])),
        "param_groups": [param_group(g) for g in optimizer.param_groups],
    }
    return TrainedModel(root, param_names, recipe)


def warmup_steps(lrs: list[float], base: float) -> int | None:
    """Warm-up of a linear or constant warm-up schedule: the first step whose lr (group 0, as the step ran) is the
    base lr; None when no step reached it."""
    return next((i for i, lr in enumerate(lrs) if lr == base), None)


def named_tensors(root: Any, param_names: dict[int, str], optimizer: Any) -> dict[str, Any]:
    """param/<fqn> for every parameter of the trained module, optim/<fqn>/<key> for every state tensor."""
    import torch

    out: dict[str, Any] = {}
    if root is not None:
        for name, p in root.named_parameters():
            out[f"param/{name}"] = p
    for gi, group in enumerate(optimizer.param_groups):
        for pi, p in enumerate(group["params"]):
            fqn = param_names.get(id(p), f"<group{gi}.{pi}>")
            if fqn.startswith("<"):
                out[f"param/{fqn}"] = p
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    out[f"optim/{fqn}/{key}"] = value
    return out


def save_checkpoint(tensors: dict[str, Any], ckpt_dir: Path, rank: int, world_size: int,
                    zip_crc32: bool = False) -> tuple[str, str]:  # fmt: skip
    """This rank's local shards of parameters and optimizer state (orch.ckpt/1); (file name, its SHA256).

    Written without the zip records' CRC32 (torch.serialization.set_crc32_options, restored after) unless
    `zip_crc32`: the file's SHA256 is what orch records and checks, and computing the CRC of every record was about a
    quarter of a large checkpoint's save (bench/bench_checkpoint.py). torch.load reads it as before; a zip tool's CRC
    test fails.
    """
    import torch

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    params: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    optim: dict[str, dict[str, Any]] = {}
    devices: dict[str, str] = {}
    for name, t in tensors.items():
        local = local_tensor(t)
        devices[name] = local.device.type
        kind, _, rest = name.partition("/")
        if kind == "param":
            params[rest] = local.to("cpu", copy=True)
            placements = getattr(t, "placements", None)
            placement = "replicate"
            if placements is not None:
                placement = "shard0" if "Shard(dim=0)" in str(placements) else str(placements)
            meta[rest] = {"global_shape": list(t.shape), "placement": placement}
        else:
            fqn, _, key = rest.rpartition("/")
            optim.setdefault(fqn, {})[key] = local.to("cpu", copy=True)
    doc = {
        "schema": "orch.ckpt/1",
        "rank": rank,
        "world_size": world_size,
        "params": params,
        "param_meta": meta,
        "optim": optim,
        "devices": devices,
    }
    path = ckpt_dir / f"rank{rank}.pt"
    tmp = path.with_suffix(".pt.tmp")
    with _zip_crc32(zip_crc32):
        torch.save(doc, tmp)
    os.replace(tmp, path)
    return path.name, regular_sha256(path)


@contextlib.contextmanager
def _zip_crc32(on: bool) -> Iterator[None]:
    """torch.save computes each zip record's CRC32 or not, inside the block only (torch.serialization's
    set_crc32_options; a torch without it: as it always does)."""
    import torch.serialization as serialization

    get = getattr(serialization, "get_crc32_options", None)
    set_ = getattr(serialization, "set_crc32_options", None)
    if get is None or set_ is None:
        yield
        return
    before = get()
    set_(on)
    try:
        yield
    finally:
        set_(before)
