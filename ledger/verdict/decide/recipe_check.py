"""The observed recipe against the frozen one: the keys its recipe file marks as observed (optimizer hyperparameters,
gradient clipping, warm-up, frozen parameters), the declared model, and the structure of each arm (frozen and
trainable parameters, optimizer groups). Each difference is one line naming both values.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from typing import Any

from protocol.plan import ROLES
from protocol.recipe import (
    LoadedRecipe,
    ObserveFrozen,
    ObserveGradClip,
    ObserveOptimizer,
    ObserveWarmup,
    RecipeFile,
    v1_recipe,
)
from protocol.results import ObservedRecipe


def _close(a: float, b: float) -> bool:
    # the observed value is read back from the live optimizer: the same float, not an approximation
    return a == b or math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


def _hyper(observed: ObservedRecipe, spec: ObserveOptimizer) -> Any:
    """A parameter-group hyperparameter as the probe recorded it (the typed fields of group 0, else its repr)."""
    if spec.group == 0 and spec.field in ("lr", "betas", "eps", "weight_decay"):
        value: Any = getattr(observed, spec.field)
    else:
        groups = observed.param_groups
        shown = groups[spec.group].hyper.get(spec.field) if spec.group < len(groups) else None
        if shown is None:
            return None
        try:
            value = ast.literal_eval(shown)
        except (ValueError, SyntaxError):
            value = shown
    if spec.index is not None:
        if not isinstance(value, (tuple, list)) or spec.index >= len(value):
            return None
        value = value[spec.index]
    return value


def observed_value(observed: ObservedRecipe, spec: ObserveOptimizer | ObserveGradClip | ObserveWarmup) -> Any:
    """What the probe saw of one recipe key, by its observation spec (None: not observed)."""
    if isinstance(spec, ObserveOptimizer):
        return _hyper(observed, spec)
    if isinstance(spec, ObserveGradClip):
        return observed.max_grad_norm
    return observed.warmup_steps


def _equal(seen: Any, frozen: Any) -> bool:
    if isinstance(frozen, bool) or isinstance(seen, bool):
        return seen is frozen
    if isinstance(frozen, (int, float)) and isinstance(seen, (int, float)):
        return _close(float(seen), float(frozen))
    return bool(seen == frozen)


def _frozen_differences(observed: ObservedRecipe, key: str, spec: ObserveFrozen, label: str) -> list[str]:
    trainable = [n for n in observed.trainable if spec.matches(n)]
    if trainable:
        more = len(trainable) - 3
        shown = ", ".join(trainable[:3]) + (f" and {more} more" if more > 0 else "")
        return [f"arm {label}: {key} is frozen true but {shown} trainable (requires_grad=True)"]
    if not any(spec.matches(n) for n in observed.frozen) or observed.frozen_params <= 0:
        return [f"arm {label}: {key} is frozen true but no frozen {spec.label} was observed "
                f"(frozen: {observed.frozen[:3]})"]
    return []


def recipe_differences(
    observed: ObservedRecipe, recipe: Mapping[str, Any], label: str, recipe_file: RecipeFile | None = None
) -> list[str]:
    """Keys of the frozen recipe that the trainer did not use as frozen (observed at run time), by the observation
    specs of its recipe file (default: R3's, the recipe of every orch.protocol/1 run)."""
    spec_file = recipe_file if recipe_file is not None else v1_recipe().recipe
    diffs: list[str] = []
    for key, spec in spec_file.observed_keys():
        frozen = recipe.get(key)
        if frozen is None or spec.observe is None:
            continue
        if isinstance(spec.observe, ObserveFrozen):
            if frozen is True:
                diffs += _frozen_differences(observed, key, spec.observe, label)
            continue
        seen = observed_value(observed, spec.observe)
        if seen is None:
            diffs.append(f"arm {label}: {key} not observed (frozen {frozen})")
        elif not _equal(seen, frozen):
            diffs.append(f"arm {label}: {key} observed {seen}, frozen {frozen}")
    wanted = spec_file.optimizer
    if wanted is not None and wanted.lower() not in observed.optimizer.lower():
        diffs.append(f"arm {label}: optimizer {observed.optimizer}, frozen {wanted}")
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


# what the recipe fixes about the parameters and the optimizer: equal in every arm
STRUCTURE_FIELDS = ("frozen", "trainable", "frozen_params", "trainable_params", "optimizer_params", "param_groups")


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


def recipe_doc(recipe: LoadedRecipe | None) -> dict[str, Any] | None:
    """The audit's recipe section: the frozen recipe file (as the protocol names it) and its SHA256, and which of its
    keys the probe observed at run time (the others reach the trainer only through their checked flags)."""
    if recipe is None:
        return None
    observed = [k for k, _ in recipe.recipe.observed_keys()]
    return {
        "file": recipe.named,
        "sha256": recipe.sha256,
        "name": recipe.recipe.name,
        "trainer": recipe.recipe.trainer,
        "observed_keys": observed,
        "flag_only_keys": [k for k in recipe.recipe.keys if k not in observed],
    }
