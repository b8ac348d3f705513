"""The frozen upstream R3 Tree-RL recipe of BAGEL-7B-MoT (PROTOCOL_NOTES.txt, DESIGN.md "recipe").

A protocol whose recipe differs from this constant is refused; no GPU time is spent on it.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

# Values of sen-ye/R3 scripts/train_rl.sh and the defaults of train/online_rl.py that it does not override.
UPSTREAM_RECIPE: Final = MappingProxyType(
    {
        "group_size": 16,
        "policy_group_size": 4,
        "rounds": 2,
        "global_seed": 4396,
        "data_seed": 42,
        "lr": 5e-6,
        "warmup_steps": 10,
        "beta1": 0.9,
        "beta2": 0.95,
        "eps": 1e-8,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "kl_weight_text": 0.001,
        "kl_weight_image": 0.001,
        "freeze_vit": True,
        "total_steps": 1000,
    }
)

ALLOWED_PRECISIONS: Final = ("fp32", "bf16")
FORBIDDEN_PRECISIONS: Final = ("fp16", "fp8", "int8")


def recipe_flags() -> list[str]:
    """The recipe as upstream-style trainer flags (`--lr 5e-06 ...`): one source for benches and tests."""
    return [x for key, value in UPSTREAM_RECIPE.items() for x in (f"--{key}", str(value))]


def flag_value_equal(expected: object, given: str) -> bool:
    """Whether a command-line flag value `given` denotes the recipe value `expected`."""
    if isinstance(expected, bool):
        return given.strip().lower() in (("true", "1") if expected else ("false", "0"))
    if isinstance(expected, int):
        try:
            return int(given) == expected
        except ValueError:
            try:
                return float(given) == float(expected)
            except ValueError:
                return False
    if isinstance(expected, float):
        try:
            return float(given) == expected
        except ValueError:
            return False
    return str(expected) == given
