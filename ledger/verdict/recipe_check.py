"""The observed recipe against the frozen one: hyperparameters, the declared model, and the structure of each arm
(frozen and trainable parameters, optimizer groups, the frozen ViT). Each difference is one line naming both values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from protocol.plan import ROLES
from protocol.results import ObservedRecipe


def _close(a: float, b: float) -> bool:
    # the observed value is read back from the live optimizer: the same float, not an approximation
    return a == b or math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


def recipe_differences(observed: ObservedRecipe, recipe: Mapping[str, Any], label: str) -> list[str]:
    """Keys of the frozen recipe that the trainer did not use as frozen (observed at run time)."""
    diffs: list[str] = []

    def check(key: str, seen: float | int | None, frozen: Any) -> None:
        if frozen is None:
            return
        if seen is None:
            diffs.append(f"arm {label}: {key} not observed (frozen {frozen})")
        elif not _close(float(seen), float(frozen)):
            diffs.append(f"arm {label}: {key} observed {seen}, frozen {frozen}")

    check("lr", observed.lr, recipe.get("lr"))
    check("beta1", observed.betas[0], recipe.get("beta1"))
    check("beta2", observed.betas[1], recipe.get("beta2"))
    check("eps", observed.eps, recipe.get("eps"))
    check("weight_decay", observed.weight_decay, recipe.get("weight_decay"))
    check("max_grad_norm", observed.max_grad_norm, recipe.get("max_grad_norm"))
    check("warmup_steps", observed.warmup_steps, recipe.get("warmup_steps"))
    if recipe.get("freeze_vit"):
        vit_trainable = [n for n in observed.trainable if is_vit(n)]
        if vit_trainable:
            more = len(vit_trainable) - 3
            shown = ", ".join(vit_trainable[:3]) + (f" and {more} more" if more > 0 else "")
            diffs.append(f"arm {label}: freeze_vit is frozen true but {shown} trainable (requires_grad=True)")
        elif not any(is_vit(n) for n in observed.frozen) or observed.frozen_params <= 0:
            diffs.append(f"arm {label}: freeze_vit is frozen true but no frozen ViT was observed "
                         f"(frozen: {observed.frozen[:3]})")
    if "adamw" not in observed.optimizer.lower():
        diffs.append(f"arm {label}: optimizer {observed.optimizer}, frozen AdamW")
    return diffs


def model_differences(observed: ObservedRecipe, model: Mapping[str, Any], label: str) -> list[str]:
    """The declared model against the one the probe saw: a flag that shrinks the model is named here."""
    diffs: list[str] = []
    prefix, want = str(model["layer_prefix"]), int(model["layers"])
    seen = observed.layers.get(prefix)
    if seen is None:
        stacks = ", ".join(f"{k} {v}" for k, v in observed.layers.items()) or "none"
        diffs.append(f"arm {label}: declared {want} layers under {prefix}, the probe saw no such stack ({stacks})")
    elif seen != want:
        diffs.append(f"arm {label}: declared {want} layers under {prefix}, the trainer built {seen}")
    total = observed.trainable_params + observed.frozen_params
    if model.get("min_params") and total < int(model["min_params"]):
        diffs.append(f"arm {label}: {total:,} parameters, the declared model has at least {int(model['min_params']):,}")
    return diffs


_VIT = re.compile(r"(^|_)vit($|_|\d)", re.IGNORECASE)
# what the recipe fixes about the parameters and the optimizer: equal in every arm
STRUCTURE_FIELDS = ("frozen", "trainable", "frozen_params", "trainable_params", "optimizer_params", "param_groups")


def is_vit(name: str) -> bool:
    """A parameter or module path with a component named like the ViT (vit_model, vit, vit_pos_embed)."""
    return any(_VIT.search(part) for part in re.split(r"[.:#]", name))


def _listed(values: Sequence[str]) -> str:
    return "[" + ", ".join(values[:4]) + (f", ... {len(values) - 4} more" if len(values) > 4 else "") + "]"


def structure_differences(observed: Mapping[str, ObservedRecipe], reference: str = ROLES[0]) -> list[str]:
    """Frozen and trainable sets, parameter counts and optimizer groups of every arm against the baseline A's."""
    diffs: list[str] = []
    ref = observed[reference]
    for label, obs in observed.items():
        if label == reference:
            continue
        for name in STRUCTURE_FIELDS:
            mine, theirs = getattr(obs, name), getattr(ref, name)
            if mine == theirs:
                continue
            if name in ("frozen", "trainable"):
                extra = sorted(set(mine) - set(theirs))
                missing = sorted(set(theirs) - set(mine))
                detail = (f"{_listed(mine)} vs {_listed(theirs)}" if not (extra or missing) else
                          f"{_listed(extra)} only in arm {label}, {_listed(missing)} only in arm {reference}")
                diffs.append(f"arm {label}: {name} parameters differ from arm {reference}: {detail}")
            elif name == "param_groups":
                diffs.append(f"arm {label}: optimizer parameter groups differ from arm {reference}: "
                             + _groups_difference(obs.param_groups, ref.param_groups, label, reference))
            else:
                diffs.append(f"arm {label}: {name} {mine:,}, arm {reference} {theirs:,}")
    return diffs


def _groups_difference(mine: Sequence[Any], theirs: Sequence[Any], label: str, reference: str) -> str:
    if len(mine) != len(theirs):
        return f"{len(mine)} group(s) in arm {label}, {len(theirs)} in arm {reference}"
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if a.tensors != b.tensors or a.numel != b.numel:
            return (f"group {i}: {a.tensors} tensors / {a.numel:,} elements in arm {label}, "
                    f"{b.tensors} / {b.numel:,} in arm {reference}")
        for key in sorted(set(a.hyper) | set(b.hyper)):
            if a.hyper.get(key) != b.hyper.get(key):
                return f"group {i}: {key} {a.hyper.get(key)} in arm {label}, {b.hyper.get(key)} in arm {reference}"
    return "different"
