"""The tx128 kernels kept for comparison with the probe's path (workers/rank/digest_triton.py): the single-tensor kernel
(the bench's bandwidth figure), the per-tensor path (a launch per tensor part) and the former two-launch batched
path (segments + tails, tables rebuilt per call). Tests and bench_digest.py check the probe's digests against them.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from workers.rank.digest_triton import (  # jit globals
    _GOLD,
    _KAE0,
    _KAE1,
    _KAO0,
    _KAO1,
    _KBE0,
    _KBE1,
    _KBO0,
    _KBO1,
    DEFAULT_BLOCK,
    DEFAULT_PROGRAMS_PER_SM,
    _max_programs,
)
from workers.rank.tx128 import byte_view, tx128_finalize


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


def tx128_cuda_many_per_tensor(tensors: list[Any], block: int | None = None, programs: int | None = None) -> list[str]:
    """The former per-tensor path (launches per tensor part): kept as the comparison of tests and bench."""
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


@triton.jit
def _tx128_segments_kernel(
    anchor_ptr,  # int32: every segment's words are addressed relative to this tensor (one pointer argument)
    seg_byte_off,  # int64 [segments]: segment address - anchor address
    main_seg,  # int32 [M]: segment id of each segment that has whole chunks
    main_chunks,  # int64 [M]: its whole chunks
    main_first_block,  # int32 [M + 1]: its first block in the global block order, then the block total
    prog_first_block,  # int32 [programs + 1]: each program's contiguous block range, then the block total
    prog_first_main,  # int32 [programs]: index into main_* of the segment holding the program's first block
    acc_ptr,  # int64 [segments, 2]: lane sums (uint64 bits), wrapping atomic adds
    BLOCK: tl.constexpr,
    WIDE: tl.constexpr,  # int64 chunk arithmetic for a segment of 2^29 chunks or more
    UNIT: tl.constexpr,  # 16 when every segment starts on 16 bytes (vector loads), else 4
):
    pid = tl.program_id(0)
    lo = tl.load(prog_first_block + pid)
    hi = tl.load(prog_first_block + pid + 1)
    m = tl.load(prog_first_main + pid)
    rows = tl.arange(0, BLOCK)
    cols = tl.arange(0, 4)
    slot = tl.arange(0, 2).to(tl.uint32)[None, :]
    k_ae = _KAE0 + slot * _KAE1
    k_ao = _KAO0 + slot * _KAO1
    k_bo = _KBO0 + slot * _KBO1
    k_be = _KBE0 + slot * _KBE1
    acc_a = tl.zeros([BLOCK, 2], dtype=tl.uint64)
    acc_b = tl.zeros([BLOCK, 2], dtype=tl.uint64)
    # the current segment's facts travel with the loop; UNIT-byte offsets tell the compiler their alignment
    seg = tl.load(main_seg + m)
    first = tl.load(main_first_block + m)
    nxt = tl.load(main_first_block + m + 1)
    n_chunks = tl.load(main_chunks + m)
    unit_off = tl.load(seg_byte_off + seg) // UNIT
    for blk in range(lo, hi):
        if blk == nxt:  # the next segment starts: flush this one's sums
            tl.atomic_add(acc_ptr + seg * 2, tl.sum(tl.sum(acc_a, axis=1), axis=0).to(tl.int64, bitcast=True))
            tl.atomic_add(acc_ptr + seg * 2 + 1, tl.sum(tl.sum(acc_b, axis=1), axis=0).to(tl.int64, bitcast=True))
            acc_a = tl.zeros([BLOCK, 2], dtype=tl.uint64)
            acc_b = tl.zeros([BLOCK, 2], dtype=tl.uint64)
            m += 1
            seg = tl.load(main_seg + m)
            first = nxt
            nxt = tl.load(main_first_block + m + 1)
            n_chunks = tl.load(main_chunks + m)
            unit_off = tl.load(seg_byte_off + seg) // UNIT
        if WIDE:
            c = (blk - first).to(tl.int64) * BLOCK + rows
        else:
            c = (blk - first) * BLOCK + rows
        valid = c < n_chunks
        offs = c[:, None] * 4 + cols[None, :]
        src = anchor_ptr + unit_off * (UNIT // 4)  # the segment's first word
        w = tl.load(src + offs, mask=valid[:, None], other=0).to(tl.uint32, bitcast=True)
        even, odd = tl.split(tl.reshape(w, [BLOCK, 2, 2]))  # (w0, w2) and (w1, w3)
        base = (c.to(tl.uint32) * _GOLD)[:, None]  # the chunk index inside its own segment
        va = (even + base + k_ae).to(tl.uint64)
        ma = ((odd + base + k_ao) | 1).to(tl.uint64)
        vb = (odd + base + k_bo).to(tl.uint64)
        mb = ((even + base + k_be) | 1).to(tl.uint64)
        keep = valid[:, None]
        acc_a += tl.where(keep, va * ma, 0)
        acc_b += tl.where(keep, vb * mb, 0)
    if hi > lo:
        tl.atomic_add(acc_ptr + seg * 2, tl.sum(tl.sum(acc_a, axis=1), axis=0).to(tl.int64, bitcast=True))
        tl.atomic_add(acc_ptr + seg * 2 + 1, tl.sum(tl.sum(acc_b, axis=1), axis=0).to(tl.int64, bitcast=True))


@triton.jit
def _tx128_tails_kernel(
    anchor_ptr,  # uint8: byte addressing relative to this tensor
    seg_byte_off,  # int64 [segments]
    tail_seg,  # int32 [T]: segment id of each segment whose length is not a multiple of 16
    tail_chunk,  # int64 [T]: index of its last, partial chunk (= its whole chunks)
    tail_len,  # int32 [T]: bytes in that chunk (1..15); the rest is the zero padding
    acc_ptr,  # int64 [segments, 2]
):
    i = tl.program_id(0)
    seg = tl.load(tail_seg + i)
    chunk = tl.load(tail_chunk + i)
    b = tl.arange(0, 16)
    src = anchor_ptr + tl.load(seg_byte_off + seg) + chunk * 16
    x = tl.load(src + b, mask=b < tl.load(tail_len + i), other=0).to(tl.uint32)
    w = tl.sum(tl.reshape(x, [4, 4]) << (tl.arange(0, 4).to(tl.uint32) * 8)[None, :], axis=1)  # little-endian
    even, odd = tl.split(tl.reshape(w, [2, 2]))
    slot = tl.arange(0, 2).to(tl.uint32)
    base = chunk.to(tl.uint32) * _GOLD
    va = (even + base + (_KAE0 + slot * _KAE1)).to(tl.uint64)
    ma = ((odd + base + (_KAO0 + slot * _KAO1)) | 1).to(tl.uint64)
    vb = (odd + base + (_KBO0 + slot * _KBO1)).to(tl.uint64)
    mb = ((even + base + (_KBE0 + slot * _KBE1)) | 1).to(tl.uint64)
    tl.atomic_add(acc_ptr + seg * 2, tl.sum(va * ma, axis=0).to(tl.int64, bitcast=True))
    tl.atomic_add(acc_ptr + seg * 2 + 1, tl.sum(vb * mb, axis=0).to(tl.int64, bitcast=True))


@dataclass(frozen=True)
class _Layout:
    """Launch tables that depend only on the byte lengths (the same every step): built once, kept on the device."""

    main: tuple[torch.Tensor, ...]  # main_seg, main_chunks, main_first_block, prog_first_block, prog_first_main
    grid: int
    wide: bool
    main_ids: tuple[int, ...]  # segments with whole chunks (their start must be 4-byte aligned)
    tails: tuple[torch.Tensor, ...]  # tail_seg, tail_chunk, tail_len
    n_tails: int


@functools.lru_cache(maxsize=16)
def _layout(nbytes: tuple[int, ...], block: int, programs: int, device: torch.device) -> _Layout:
    nb = np.asarray(nbytes, dtype=np.int64).reshape(-1)
    whole = nb // 16
    if whole.size and int(whole.max()) >= 2**32:
        raise ValueError("tx128 is defined for fewer than 2^32 chunks (64 GiB) per tensor")
    main_ids = np.flatnonzero(whole > 0)
    main_chunks = whole[main_ids]
    first_block = np.concatenate([[0], np.cumsum(-(-main_chunks // block))])
    n_blocks = int(first_block[-1])
    grid = min(n_blocks, programs)
    prog_first = (np.arange(grid + 1, dtype=np.int64) * n_blocks) // max(grid, 1)  # contiguous, balanced ranges
    prog_main = np.searchsorted(first_block, prog_first[:-1], side="right") - 1
    tail_ids = np.flatnonzero(nb % 16)

    def dev(a: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(a, dtype=np.int64)).to(device=device, dtype=dtype)

    i32 = torch.int32
    return _Layout(
        main=(dev(main_ids, i32), dev(main_chunks, torch.int64), dev(first_block, i32), dev(prog_first, i32),
              dev(prog_main, i32)),
        grid=grid, wide=bool(main_chunks.size) and int(main_chunks.max()) * 4 >= 2**31,
        main_ids=tuple(int(i) for i in main_ids),
        tails=(dev(tail_ids, i32), dev(whole[tail_ids], torch.int64), dev(nb[tail_ids] % 16, i32)),
        n_tails=int(tail_ids.size),
    )  # fmt: skip


def tx128_cuda_many_two_launch(
    tensors: list[Any], block: int | None = None, programs: int | None = None
) -> list[str]:
    """The former batched path (segments + tails kernels, tables rebuilt per call): the bench's before figure."""
    if not tensors:
        return []
    block = block or int(os.environ.get("ORCH_TX128_BLOCK", DEFAULT_BLOCK))
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        raise ValueError("tx128_cuda_many_two_launch needs tensors on one device; call it once per device")
    flat: list[torch.Tensor] = []
    for t in tensors:
        flat.append(t if t.is_contiguous() else t.contiguous())  # a strided view: hash its logical order
    nbytes = tuple(t.numel() * t.element_size() for t in flat)
    lay = _layout(nbytes, block, programs or _max_programs(device, DEFAULT_PROGRAMS_PER_SM), device)
    for i in lay.main_ids:
        if flat[i].data_ptr() % 4:
            flat[i] = flat[i].clone()  # int32 loads need 4-byte alignment (a view at an odd offset)
    acc = torch.zeros((len(flat), 2), dtype=torch.int64, device=device)
    anchor = acc.data_ptr()  # addresses travel as offsets from one real pointer argument
    ptrs = [t.data_ptr() for t in flat]
    seg_off = torch.tensor([p - anchor if n else 0 for p, n in zip(ptrs, nbytes, strict=True)],
                           dtype=torch.int64).to(device)  # fmt: skip
    if lay.grid:
        unit = 16 if anchor % 16 == 0 and all(ptrs[i] % 16 == 0 for i in lay.main_ids) else 4
        _tx128_segments_kernel[(lay.grid,)](
            acc.view(torch.int32), seg_off, *lay.main, acc, BLOCK=block, WIDE=lay.wide, UNIT=unit, num_warps=8
        )
    if lay.n_tails:
        _tx128_tails_kernel[(lay.n_tails,)](acc.view(torch.uint8), seg_off, *lay.tails, acc, num_warps=1)
    lanes = acc.cpu().numpy().view(np.uint64)
    return [
        tx128_finalize((int(a), int(b)), str(t.dtype), tuple(t.shape), n)
        for (a, b), t, n in zip(lanes, tensors, nbytes, strict=True)
    ]
