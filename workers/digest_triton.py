"""The tx128 digest as a Triton kernel: one memory-bound pass, 16-byte loads, per-program lane partials.

Integer-exact and defined by workers/digest.py (tx128_lanes_reference); any BLOCK or grid gives the same value.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from workers.digest import GOLD, KAE, KAO, KBE, KBO, tx128_finalize

DEFAULT_BLOCK = 1024  # chunks (16 B each) per loop iteration of a program: 16 KiB in flight
DEFAULT_PROGRAMS_PER_SM = 8

# jit code reads only constexpr globals: the constants of workers/digest.py, split into scalars
_GOLD = tl.constexpr(GOLD)
_KAE0, _KAE1 = tl.constexpr(KAE[0]), tl.constexpr(KAE[1])
_KAO0, _KAO1 = tl.constexpr(KAO[0]), tl.constexpr(KAO[1])
_KBO0, _KBO1 = tl.constexpr(KBO[0]), tl.constexpr(KBO[1])
_KBE0, _KBE1 = tl.constexpr(KBE[0]), tl.constexpr(KBE[1])


@triton.jit
def _tx128_kernel(
    x_ptr,  # int32 words, 4 per chunk
    n_chunks,
    chunk_offset,
    out_ptr,  # int64 [num_programs, 2]: lane partials (uint64 bits)
    BLOCK: tl.constexpr,
    WIDE: tl.constexpr,  # int64 offsets for inputs of 2^31 words or more
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rows = tl.arange(0, BLOCK)
    cols = tl.arange(0, 4)
    slot = tl.arange(0, 2).to(tl.uint32)[None, :]
    k_ae = _KAE0 + slot * _KAE1
    k_ao = _KAO0 + slot * _KAO1
    k_bo = _KBO0 + slot * _KBO1
    k_be = _KBE0 + slot * _KBE1
    acc_a = tl.zeros([BLOCK, 2], dtype=tl.uint64)
    acc_b = tl.zeros([BLOCK, 2], dtype=tl.uint64)
    n_blocks = tl.cdiv(n_chunks, BLOCK)
    for blk in range(pid, n_blocks, nprog):
        if WIDE:
            c = blk.to(tl.int64) * BLOCK + rows
        else:
            c = blk * BLOCK + rows
        valid = c < n_chunks
        offs = c[:, None] * 4 + cols[None, :]
        w = tl.load(x_ptr + offs, mask=valid[:, None], other=0).to(tl.uint32, bitcast=True)
        even, odd = tl.split(tl.reshape(w, [BLOCK, 2, 2]))  # (w0, w2) and (w1, w3)
        base = ((c + chunk_offset).to(tl.uint32) * _GOLD)[:, None]
        va = (even + base + k_ae).to(tl.uint64)
        ma = ((odd + base + k_ao) | 1).to(tl.uint64)
        vb = (odd + base + k_bo).to(tl.uint64)
        mb = ((even + base + k_be) | 1).to(tl.uint64)
        keep = valid[:, None]
        acc_a += tl.where(keep, va * ma, 0)
        acc_b += tl.where(keep, vb * mb, 0)
    tl.store(out_ptr + pid * 2, tl.sum(tl.sum(acc_a, axis=1), axis=0).to(tl.int64, bitcast=True))
    tl.store(out_ptr + pid * 2 + 1, tl.sum(tl.sum(acc_b, axis=1), axis=0).to(tl.int64, bitcast=True))


def _max_programs(device: torch.device, programs_per_sm: int) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count * programs_per_sm
    return 4  # the interpreter on CPU: a few programs exercise the grid-stride loop


def tx128_partials(
    words: torch.Tensor,
    chunk_offset: int = 0,
    block: int = DEFAULT_BLOCK,
    programs: int | None = None,
    programs_per_sm: int = DEFAULT_PROGRAMS_PER_SM,
    num_warps: int = 8,
) -> torch.Tensor:
    """Launch on an int32 word tensor (length a multiple of 4); returns int64 [grid, 2] lane partials."""
    if words.dtype != torch.int32 or words.dim() != 1 or words.numel() % 4:
        raise ValueError("tx128_partials needs a flat int32 tensor of whole 16-byte chunks")
    n_chunks = words.numel() // 4
    if n_chunks + chunk_offset >= 2**32:
        raise ValueError("tx128 is defined for fewer than 2^32 chunks (64 GiB) per tensor")
    n_blocks = max(1, triton.cdiv(n_chunks, block))
    grid = min(n_blocks, programs or _max_programs(words.device, programs_per_sm))
    out = torch.empty((grid, 2), dtype=torch.int64, device=words.device)
    _tx128_kernel[(grid,)](
        words, n_chunks, chunk_offset, out, BLOCK=block, WIDE=words.numel() >= 2**31, num_warps=num_warps
    )
    return out


def _word_parts(t: torch.Tensor) -> tuple[list[tuple[torch.Tensor, int]], int]:
    """The tensor's bytes as (int32 words, chunk offset) parts: the whole chunks, then the zero-padded tail."""
    from workers.digest import byte_view

    u8 = byte_view(t)
    nbytes = u8.numel()
    main = nbytes // 16
    parts: list[tuple[torch.Tensor, int]] = []
    if main:
        body = u8[: main * 16]
        if body.storage_offset() % 4:
            body = body.clone()  # an int32 view needs 4-byte alignment
        parts.append((body.view(torch.int32), 0))
    tail = nbytes - main * 16
    if tail:
        pad = torch.zeros(16, dtype=torch.uint8, device=u8.device)
        pad[:tail] = u8[main * 16 :]
        parts.append((pad.view(torch.int32), main))
    return parts, nbytes


def tx128_cuda_many(tensors: list[Any], block: int | None = None, programs: int | None = None) -> list[str]:
    """tx128 digests of device tensors: every launch queued first, then one copy of all partials to the host."""
    block = block or int(os.environ.get("ORCH_TX128_BLOCK", DEFAULT_BLOCK))
    partials: list[torch.Tensor] = []
    spans: list[tuple[int, int]] = []
    metas: list[tuple[str, tuple[int, ...], int]] = []
    for t in tensors:
        parts, nbytes = _word_parts(t)
        first = len(partials)
        for words, off in parts:
            partials.append(tx128_partials(words, off, block=block, programs=programs))
        spans.append((first, len(partials)))
        metas.append((str(t.dtype), tuple(t.shape), nbytes))
    rows = np.cumsum([0] + [p.shape[0] for p in partials])
    host = torch.cat(partials).cpu().numpy().view(np.uint64) if partials else np.zeros((0, 2), np.uint64)
    out = []
    for (lo, hi), (dtype, shape, nbytes) in zip(spans, metas, strict=True):
        lanes = np.sum(host[rows[lo] : rows[hi]], axis=0, dtype=np.uint64)  # wraps mod 2^64
        out.append(tx128_finalize((int(lanes[0]), int(lanes[1])), dtype, shape, nbytes))
    return out


def tx128_tensor(t: Any, block: int | None = None, programs: int | None = None) -> str:
    from workers.digest import local_tensor

    return tx128_cuda_many([local_tensor(t)], block=block, programs=programs)[0]
