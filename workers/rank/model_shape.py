"""The shape of the trained model as the probe sees it: decoder depth per layer stack, from parameter names.

A protocol that declares its model (`model.layers`) is checked against this, so a flag that shrinks the model
(upstream's `--debug True` builds a 1-layer LLM) cannot time a smaller model unnoticed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_LAYER = re.compile(r"^(?P<prefix>.*?\blayers)\.(?P<index>\d+)\.")
# wrapper segments that torch.compile, FSDP1 and activation checkpointing insert into parameter names
_WRAPPERS = re.compile(r"(?:^|\.)(?:_orig_mod|_fsdp_wrapped_module|_checkpoint_wrapped_module)(?=\.)")


def layer_counts(names: Iterable[str]) -> dict[str, int]:
    """'<prefix>.layers' -> number of distinct layer indices under it (wrapper segments left out of the prefix)."""
    seen: dict[str, set[int]] = {}
    for name in names:
        m = _LAYER.match(_WRAPPERS.sub("", name).lstrip("."))
        if m:
            seen.setdefault(m.group("prefix"), set()).add(int(m.group("index")))
    return {prefix: len(indices) for prefix, indices in sorted(seen.items())}
