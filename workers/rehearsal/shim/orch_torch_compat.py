"""A torch compatibility shim for rehearsals only: FSDP2 unshards run outside inference mode (values unchanged).

Why: upstream R3 runs its reference forward as `with torch.inference_mode(): ref_model(...)`, the first use ever
of `ref_model` (a deepcopy wrapped by fully_shard with reshard_after_forward=False). When the FSDP shard group has
one rank (one GPU, or a (replicate, 1) mesh), FSDP2 (since pytorch/pytorch#160135, Aug 2025; not in 2.5.1) skips the
all-gather: `FSDPParamGroup.wait_for_unshard` allocates the all-gather output with torch.empty under the
caller's inference mode (an inference tensor, kept for the whole run) and then copies into it inside
`torch.autograd._unsafe_preserve_version_counter(tensor)`, whose __init__ reads `tensor._version`:
"RuntimeError: Inference tensors do not track version counter". The multi-rank path
(`foreach_all_gather_copy_out`) skips inference tensors there (pytorch/pytorch#146709), so eight GPUs never see it.

What: `FSDPParamGroup.wait_for_unshard` (the copy of sharded data into the unsharded parameters) runs under
`torch.inference_mode(False)` when called in inference mode; everything else (the forward's math) stays in
inference mode. A copy computes the same bits in every grad mode, and the unsharded parameters are then the
normal tensors they are when the first forward runs under no_grad: tests/e2e/test_torch_compat_fsdp.py checks outputs
bit for bit against a plain no_grad forward. It changes no upstream file, and torch only while it is imported.

How: `workers/rehearsal/shim` first on PYTHONPATH (orch rehearse puts it there for the trainer); its
`sitecustomize.py` installs this, lazily, when torch's FSDP2 module is imported, if ORCH_TORCH_COMPAT is unset
or lists fsdp_unshard_outside_inference_mode (orch rehearse sets it so); ORCH_TORCH_COMPAT=none turns it off.
The probe records what was applied in each rank's host_controls (`torch_compat`).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
from typing import Any

NAME = "fsdp_unshard_outside_inference_mode"
FSDP_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
_MARK = "_orch_torch_compat"
applied: dict[str, str] = {}  # NAME -> what was patched, once it is (the probe records it per rank)


def wanted() -> bool:
    """On when ORCH_TORCH_COMPAT is unset or lists NAME (comma list); `none` (or any list without it) is off."""
    value = os.environ.get("ORCH_TORCH_COMPAT")
    return value is None or NAME in value.split(",")


def patch(module: Any) -> bool:
    """Wrap module.FSDPParamGroup.wait_for_unshard; returns False when already wrapped or absent."""
    import torch

    cls = getattr(module, "FSDPParamGroup", None)
    original = getattr(cls, "wait_for_unshard", None)
    if cls is None or original is None or getattr(original, _MARK, False):
        return False

    @functools.wraps(original)
    def wait_for_unshard(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_inference_mode_enabled():
            return original(self, *args, **kwargs)
        with torch.inference_mode(False):  # unsharded parameters become normal tensors; the copy is the same
            return original(self, *args, **kwargs)

    setattr(wait_for_unshard, _MARK, True)
    cls.wait_for_unshard = wait_for_unshard
    applied[NAME] = f"FSDPParamGroup.wait_for_unshard outside inference mode (torch {torch.__version__})"
    return True


class _AfterFsdpImport(importlib.abc.MetaPathFinder):
    """Patches the FSDP2 param-group module right after it is first imported (torch is not imported early)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != FSDP_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Patch now if FSDP2 is already imported, else right after its import."""
    if not wanted():
        return
    module = sys.modules.get(FSDP_MODULE)
    if module is not None:
        patch(module)
    elif not any(isinstance(f, _AfterFsdpImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterFsdpImport())
