"""A stand-in for the `flash_attn` package (2.5.8 API) on torch scaled_dot_product_attention, for rehearsals only.

It lets unmodified upstream R3 run where flash_attn has no wheel: the rehearsal puts `workers/rehearsal/shim`
first on the trainer's PYTHONPATH; nothing else can import it as `flash_attn`. It supplies what upstream and
transformers 4.49 import: flash_attn_varlen_func, flash_attn_with_kvcache, flash_attn_func and bert_padding,
with flash_attn 2.x semantics (varlen packing, bottom-right causal masks, GQA/MQA, default scale 1/sqrt(d),
in-place KV-cache writes at cache_seqlens / cache_batch_idx). Argument values it does not implement (dropout,
local windows, ALiBi, paged or rotary caches, attention probabilities) raise StandInUnsupported, never ignored.
Numerics differ from the real kernels: a rehearsal compares arms with each other, all on this stand-in, and
says nothing about flash_attn's own bits. The dist-info beside this package reports version 2.5.8+rehearsal.sdpa
so that transformers' availability checks pass and the stand-in is visible in package listings.
"""

from __future__ import annotations

from flash_attn.flash_attn_interface import (
    StandInUnsupported,
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
)

__version__ = "2.5.8+rehearsal.sdpa"
STAND_IN = True

__all__ = [
    "STAND_IN",
    "StandInUnsupported",
    "__version__",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
]
