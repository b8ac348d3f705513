"""FSDP2 (ZeRO-3) helpers of r3-mini (upstream `train/fsdp2_utils.py`): sharding per decoder layer and at the
root, the rollout context that gathers parameters once, grad clipping through torch's clip_grad_norm_."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


def apply_fsdp2(model: nn.Module, mesh, reshard_after_forward: bool = True) -> nn.Module:
    """fully_shard each MoT decoder layer, the ViT, then the root (the remaining params)."""
    for layer in model.language_model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model.vit_model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def fsdp2_lazy_init_root(model: nn.Module) -> None:
    if isinstance(model, FSDPModule):
        model._get_fsdp_state()._lazy_init()


def _fsdp_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _gather_and_detach_hooks(model: nn.Module) -> dict[int, dict[str, dict]]:
    """All-gathers every FSDP unit once and takes FSDP's forward hooks off, so forwards run on plain tensors."""
    modules = _fsdp_modules(model)
    handles = [m.unshard(async_op=True) for m in modules]
    for handle in handles:
        if handle is not None:
            handle.wait()
    saved: dict[int, dict[str, dict]] = {}
    for module in modules:
        saved[id(module)] = {}
        for attr in _HOOK_DICTS:
            hooks = getattr(module, attr, None)
            if hooks:
                saved[id(module)][attr] = dict(hooks)
                hooks.clear()
    return saved


@contextmanager
def fsdp2_rollout_context(model: nn.Module):
    """Rollouts on parameters gathered once (instead of one all-gather per layer per decode step), resharded after."""
    was_training = model.training
    prev_grad = torch.is_grad_enabled()
    model.eval()
    torch.set_grad_enabled(False)
    saved = _gather_and_detach_hooks(model)
    try:
        yield
    finally:
        modules = _fsdp_modules(model)
        for module in modules:
            for attr, hooks in saved.get(id(module), {}).items():
                getattr(module, attr).update(hooks)
        for module in reversed(modules):
            module.reshard()
        if torch.cuda.is_available() and next(model.parameters()).is_cuda:
            torch.cuda.empty_cache()
        torch.set_grad_enabled(prev_grad)
        model.train(was_training)


def gather_frozen_once(model: nn.Module) -> None:
    """For the frozen reference copy: its weights never change, so gather them once for the whole run."""
    _gather_and_detach_hooks(model)


def clip_grad_norm_fsdp2(parameters, max_norm: float) -> torch.Tensor:
    # looked up at call time: an external probe may wrap torch.nn.utils.clip_grad_norm_
    total_norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    if hasattr(total_norm, "full_tensor"):
        total_norm = total_norm.full_tensor()
    return total_norm
