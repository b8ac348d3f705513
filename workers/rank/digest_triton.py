"""The probe's tx128 digest path on CUDA: one table kernel per launch group (launched while the host walks on, 16-byte
loads), one host copy per batch, the SHA256 finalisation on the host.

Integer-exact and defined by workers/rank/tx128.py (tx128_lanes_reference); any BLOCK or grid gives the same value. The
kernels kept for comparison (single tensor, per tensor, two launches) are in workers/rank/digest_triton_compare.py.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from workers.rank.tx128 import GOLD, KAE, KAO, KBE, KBO, tensor_header

DEFAULT_BLOCK = 1024  # chunks (16 B each) per loop iteration of a program: 16 KiB in flight
DEFAULT_PROGRAMS_PER_SM = 8

# jit code reads only constexpr globals: the constants of workers/rank/tx128.py, split into scalars
_GOLD = tl.constexpr(GOLD)
_KAE0, _KAE1 = tl.constexpr(KAE[0]), tl.constexpr(KAE[1])
_KAO0, _KAO1 = tl.constexpr(KAO[0]), tl.constexpr(KAO[1])
_KBO0, _KBO1 = tl.constexpr(KBO[0]), tl.constexpr(KBO[1])
_KBE0, _KBE1 = tl.constexpr(KBE[0]), tl.constexpr(KBE[1])


def _max_programs(device: torch.device, programs_per_sm: int) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count * programs_per_sm
    return 4  # the interpreter on CPU: a few programs exercise the grid-stride loop


# -- the probe's path: one table kernel per launch group, launches overlapped with the host's walk, one host copy --


@triton.jit(do_not_specialize=["n_main", "n_tail"])
def _tx128_table_kernel(
    anchor32,  # int32 view of the anchor: every tensor's words are addressed relative to it
    anchor8,  # uint8 view of the same anchor (the partial last chunks are read byte by byte)
    tab,  # int64 launch table of this group, laid out as in _group_table
    acc_ptr,  # int64 [tensors, 2]: lane sums (uint64 bits) by row, wrapping atomic adds
    n_main,  # tensors of the group with whole chunks
    n_tail,  # tensors of the group whose length is not a multiple of 16
    BLOCK: tl.constexpr,
    WIDE: tl.constexpr,  # int64 chunk arithmetic for a tensor of 2^29 chunks or more
    UNIT: tl.constexpr,  # 16 when every tensor with whole chunks starts on 16 bytes (vector loads), else 4
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    o_chunks = n_main
    o_first = 2 * n_main
    o_row = 3 * n_main + 1
    o_prog = 4 * n_main + 1
    o_pseg = o_prog + nprog + 1
    o_tail = o_pseg + nprog
    lo = tl.load(tab + o_prog + pid).to(tl.int32)  # this program's contiguous range of the group's blocks
    hi = tl.load(tab + o_prog + pid + 1).to(tl.int32)
    rows = tl.arange(0, BLOCK)
    cols = tl.arange(0, 4)
    slot = tl.arange(0, 2).to(tl.uint32)[None, :]
    k_ae = _KAE0 + slot * _KAE1
    k_ao = _KAO0 + slot * _KAO1
    k_bo = _KBO0 + slot * _KBO1
    k_be = _KBE0 + slot * _KBE1
    if hi > lo:
        m = tl.load(tab + o_pseg + pid).to(tl.int32)  # the tensor holding the range's first block
        unit_off = tl.load(tab + m)
        n_chunks = tl.load(tab + o_chunks + m)
        if not WIDE:
            n_chunks = n_chunks.to(tl.int32)
        first = tl.load(tab + o_first + m).to(tl.int32)
        nxt = tl.load(tab + o_first + m + 1).to(tl.int32)
        row = tl.load(tab + o_row + m)
        acc_a = tl.zeros([BLOCK, 2], dtype=tl.uint64)
        acc_b = tl.zeros([BLOCK, 2], dtype=tl.uint64)
        for blk in range(lo, hi):
            if blk == nxt:  # the next tensor starts: flush this one's sums, then carry the next one's facts
                tl.atomic_add(acc_ptr + row * 2, tl.sum(tl.sum(acc_a, axis=1), axis=0).to(tl.int64, bitcast=True))
                tl.atomic_add(acc_ptr + row * 2 + 1, tl.sum(tl.sum(acc_b, axis=1), axis=0).to(tl.int64, bitcast=True))
                acc_a = tl.zeros([BLOCK, 2], dtype=tl.uint64)
                acc_b = tl.zeros([BLOCK, 2], dtype=tl.uint64)
                m += 1
                unit_off = tl.load(tab + m)
                n_chunks = tl.load(tab + o_chunks + m)
                if not WIDE:
                    n_chunks = n_chunks.to(tl.int32)
                first = nxt
                nxt = tl.load(tab + o_first + m + 1).to(tl.int32)
                row = tl.load(tab + o_row + m)
            if WIDE:
                c = (blk - first).to(tl.int64) * BLOCK + rows
            else:
                c = (blk - first) * BLOCK + rows
            valid = c < n_chunks
            offs = c[:, None] * 4 + cols[None, :]
            src = anchor32 + unit_off * (UNIT // 4)  # the tensor's first word; UNIT-byte offsets tell the alignment
            w = tl.load(src + offs, mask=valid[:, None], other=0).to(tl.uint32, bitcast=True)
            even, odd = tl.split(tl.reshape(w, [BLOCK, 2, 2]))  # (w0, w2) and (w1, w3)
            base = (c.to(tl.uint32) * _GOLD)[:, None]  # the chunk index inside its own tensor
            va = (even + base + k_ae).to(tl.uint64)
            ma = ((odd + base + k_ao) | 1).to(tl.uint64)
            vb = (odd + base + k_bo).to(tl.uint64)
            mb = ((even + base + k_be) | 1).to(tl.uint64)
            keep = valid[:, None]
            acc_a += tl.where(keep, va * ma, 0)
            acc_b += tl.where(keep, vb * mb, 0)
        tl.atomic_add(acc_ptr + row * 2, tl.sum(tl.sum(acc_a, axis=1), axis=0).to(tl.int64, bitcast=True))
        tl.atomic_add(acc_ptr + row * 2 + 1, tl.sum(tl.sum(acc_b, axis=1), axis=0).to(tl.int64, bitcast=True))
    b = tl.arange(0, 16)
    tslot = tl.arange(0, 2).to(tl.uint32)
    shift = (tl.arange(0, 4).to(tl.uint32) * 8)[None, :]
    for i in range(pid, n_tail, nprog):  # the partial last chunks (0-dim tensors among them), zero-padded
        byte_off = tl.load(tab + o_tail + i)
        chunk = tl.load(tab + o_tail + n_tail + i)
        length = tl.load(tab + o_tail + 2 * n_tail + i)
        trow = tl.load(tab + o_tail + 3 * n_tail + i)
        x = tl.load(anchor8 + byte_off + b, mask=b < length, other=0).to(tl.uint32)
        tw = tl.sum(tl.reshape(x, [4, 4]) << shift, axis=1)  # little-endian words
        t_even, t_odd = tl.split(tl.reshape(tw, [2, 2]))
        tbase = chunk.to(tl.uint32) * _GOLD
        ta = (t_even + tbase + (_KAE0 + tslot * _KAE1)).to(tl.uint64)
        tma = ((t_odd + tbase + (_KAO0 + tslot * _KAO1)) | 1).to(tl.uint64)
        tb = (t_odd + tbase + (_KBO0 + tslot * _KBO1)).to(tl.uint64)
        tmb = ((t_even + tbase + (_KBE0 + tslot * _KBE1)) | 1).to(tl.uint64)
        tl.atomic_add(acc_ptr + trow * 2, tl.sum(ta * tma, axis=0).to(tl.int64, bitcast=True))
        tl.atomic_add(acc_ptr + trow * 2 + 1, tl.sum(tb * tmb, axis=0).to(tl.int64, bitcast=True))


@dataclass(frozen=True)
class _Group:
    """One launch: its device table (a pure function of the tensors' addresses and lengths, so cached) and shape."""

    table: torch.Tensor  # int64, laid out as _group_table says
    host: np.ndarray  # its host copy, alive as long as the device one
    grid: int
    n_main: int
    n_tail: int
    wide: bool
    unit: int


@functools.lru_cache(maxsize=256)
def _group_table(key: tuple[int, ...], anchor: int, block: int, programs: int, device: torch.device) -> _Group | None:
    """key = (first row, ptr0, nbytes0, ptr1, nbytes1, ...). Table: unit offsets [M], whole chunks [M], first
    blocks [M + 1], rows [M], program first blocks [G + 1], program first tensor [G], then tail byte offsets [T],
    tail chunk index [T], tail length [T], tail rows [T] (M tensors with whole chunks, G programs, T tails)."""
    pn = np.asarray(key[1:], dtype=np.int64).reshape(-1, 2)
    ptr, nb = pn[:, 0], pn[:, 1]
    rows = key[0] + np.arange(pn.shape[0], dtype=np.int64)
    whole = nb // 16
    if whole.size and int(whole.max()) >= 2**32:
        raise ValueError("tx128 is defined for fewer than 2^32 chunks (64 GiB) per tensor")
    main = np.flatnonzero(whole > 0)
    tails = np.flatnonzero(nb % 16)
    unit = 16 if anchor % 16 == 0 and not np.any(ptr[main] % 16) else 4
    chunks = whole[main]
    first = np.concatenate([[0], np.cumsum(-(-chunks // block))]).astype(np.int64)
    n_blocks = int(first[-1])
    grid = min(programs, max(n_blocks, tails.size))
    if grid == 0:
        return None  # only empty tensors: their lanes stay zero
    prog_first = (np.arange(grid + 1, dtype=np.int64) * n_blocks) // grid  # contiguous, balanced ranges
    prog_seg = np.clip(np.searchsorted(first, prog_first[:-1], side="right") - 1, 0, max(main.size - 1, 0))
    table = np.concatenate([
        (ptr[main] - anchor) // unit, chunks, first, rows[main], prog_first, prog_seg,
        ptr[tails] + whole[tails] * 16 - anchor, whole[tails], nb[tails] % 16, rows[tails],
    ]).astype(np.int64)  # fmt: skip
    wide = bool(chunks.size) and (int(chunks.max()) + block) * 4 >= 2**31
    dev = torch.from_numpy(table).to(device, non_blocking=True)  # pageable source: staged before return
    return _Group(dev, table, grid, int(main.size), int(tails.size), wide, unit)


_ANCHORS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # int32 and uint8 views, one allocation
_SMS: dict[torch.device, int] = {}
_HEADERS: dict[tuple[Any, Any], Any] = {}  # (dtype, shape) -> SHA256 state over the tx128 header
# registers per thread of the table kernel at 8 warps: at block 1024 ptxas (Triton 3.6, sm_90a) needs 80 (3
# programs per SM), at 64 it spills nothing and 4 fit, as many as the single-tensor kernel's 59 allow
TABLE_MAXNREG = {1024: 64}
_FIRST_GROUP = (32, 64 << 20)  # tensors, bytes: the first launch starts the device early
_GROUP_GROWTH = 2  # each later group may hold twice as much: its walk (~0.5 us a tensor) stays shorter than
# the device's read of the group before (~2 us for a 7B shard's 9 MiB tensor at 4 TB/s)


class Tx128Batch:
    """tx128 digests of one device's tensors: add() them one by one; groups launch while the caller walks on, and
    finish() makes the batch's one host copy. Values equal tx128_lanes_reference's for any block size and grid."""

    def __init__(self, device: torch.device, block: int | None = None, programs: int | None = None,
                 capacity: int = 0, first_group: tuple[int, int] = _FIRST_GROUP, growth: int = _GROUP_GROWTH,
                 maxnreg: int | None = -1) -> None:  # fmt: skip
        self.device = device
        self.block = block or int(os.environ.get("ORCH_TX128_BLOCK", DEFAULT_BLOCK))
        self.maxnreg = TABLE_MAXNREG.get(self.block) if maxnreg == -1 else maxnreg  # -1: TABLE_MAXNREG's value
        if programs is None:
            if device not in _SMS:
                _SMS[device] = _max_programs(device, DEFAULT_PROGRAMS_PER_SM)
            programs = _SMS[device]
        self.programs = programs
        if device not in _ANCHORS:
            a = torch.zeros(4, dtype=torch.int32, device=device)  # lives as long as the process: tables stay valid
            _ANCHORS[device] = (a, a.view(torch.uint8))
        self.anchor, self.anchor8 = _ANCHORS[device]
        self.acc = torch.zeros((max(capacity, 1), 2), dtype=torch.int64, device=device)
        self.tensors: list[Any] = []  # as given: dtype and shape go into the finalisation
        self.keep: list[Any] = []  # contiguous or aligned copies, alive until the host copy
        self.pending: list[int] = []  # ptr, nbytes of the group not launched yet
        self.pending_bytes = 0
        self.group_start = 0
        self.limit = first_group  # tensors, bytes of the first launch group
        self.growth = growth
        self.next_count, self.next_bytes = 2 * first_group[0], first_group[1]  # pending entries, bytes: launch

    def add(self, t: Any) -> int:
        """Queue one tensor (on this batch's device); returns its index in finish()'s list."""
        tensors = self.tensors
        row = len(tensors)
        tensors.append(t)
        if not t.is_contiguous():
            t = t.contiguous()  # a strided view has no single byte string: hash its logical order
            self.keep.append(t)
        p = t.data_ptr()
        n = t.nbytes
        if p & 3 and n >= 16:
            t = t.clone()  # int32 loads need 4-byte alignment (a view at an odd offset)
            self.keep.append(t)
            p = t.data_ptr()
        pending = self.pending
        pending.append(p)
        pending.append(n)
        self.pending_bytes += n
        if len(pending) >= self.next_count or self.pending_bytes >= self.next_bytes:
            self.launch()
        return row

    def launch(self) -> None:
        """Launch the queued tensors now (finish() does it too)."""
        if not self.pending:
            return
        if len(self.tensors) > self.acc.shape[0]:  # more than the capacity: a larger accumulator, same rows
            acc = torch.zeros((max(len(self.tensors), 2 * self.acc.shape[0]), 2), dtype=torch.int64,
                              device=self.device)  # fmt: skip
            acc[: self.acc.shape[0]] = self.acc
            self.acc = acc
        key = (self.group_start, *self.pending)
        self.group_start = len(self.tensors)
        self.pending = []
        self.pending_bytes = 0
        self.limit = (self.limit[0] * self.growth, self.limit[1] * self.growth)
        self.next_count, self.next_bytes = 2 * self.limit[0], self.limit[1]
        g = _group_table(key, self.anchor.data_ptr(), self.block, self.programs, self.device)
        if g is None:
            return
        if self.device.type == "cuda" and self.device.index != torch.cuda.current_device():
            with torch.cuda.device(self.device):  # Triton launches on the current device
                self._launch(g)
        else:
            self._launch(g)

    def _launch(self, g: _Group) -> None:
        _tx128_table_kernel[(g.grid,)](
            self.anchor, self.anchor8, g.table, self.acc, g.n_main, g.n_tail,
            BLOCK=self.block, WIDE=g.wide, UNIT=g.unit, num_warps=8, maxnreg=self.maxnreg,
        )  # fmt: skip

    def finish(self) -> list[str]:
        """The digests in add() order: the last launch, the header states while the device works, one host copy,
        then only SHA256 over each row's 16 lane bytes."""
        self.launch()
        states = header_states(self.tensors)  # while the device reads the last group
        return finalize_rows(states, self.lanes())

    def lanes(self) -> bytes:
        """The batch's one host copy: every row's lanes A, B as 64-bit little-endian (tx128_finalize's body)."""
        body = self.acc[: len(self.tensors)].cpu().numpy().astype("<i8", copy=False).tobytes()
        self.keep = []
        return body


def finalize_rows(states: list[Any], body: bytes) -> list[str]:
    """Row i's digest: its header state updated with body[16 i : 16 i + 16] (the fastest CPython form measured by
    bench_digest.py --host-only: bytes slices, one loop, then one comprehension)."""
    for h, i in zip(states, range(0, 16 * len(states), 16), strict=True):
        h.update(body[i : i + 16])
    return ["tx128:" + h.hexdigest()[:32] for h in states]


def header_states(tensors: list[Any]) -> list[Any]:
    """Fresh SHA256 states over each tensor's tx128 header, for finalize_rows. Cached by (dtype, shape), all the header
    depends on (nbytes = numel * itemsize): a view at the same address with another dtype or shape gets its own. A
    plain loop: faster here than a plan cache keyed on the whole batch (bench_digest.py --host-only)."""
    if len(_HEADERS) > 1 << 16:
        _HEADERS.clear()
    states = []
    for t in tensors:
        key = (t.dtype, t.shape)
        h = _HEADERS.get(key)
        if h is None:
            h = _HEADERS[key] = hashlib.sha256(tensor_header("tx128", str(t.dtype), tuple(t.shape), t.nbytes))
        states.append(h.copy())
    return states


def tx128_cuda_many(
    tensors: list[Any], block: int | None = None, programs: int | None = None,
    first_group: tuple[int, int] = _FIRST_GROUP, capacity: int | None = None, growth: int = _GROUP_GROWTH,
) -> list[str]:  # fmt: skip
    """tx128 digests of one device's tensors, read in place: a few launches and one host copy for any count."""
    if not tensors:
        return []
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        raise ValueError("tx128_cuda_many needs tensors on one device; call it once per device")
    batch = Tx128Batch(device, block=block, programs=programs, first_group=first_group, growth=growth,
                       capacity=len(tensors) if capacity is None else capacity)  # fmt: skip
    for t in tensors:
        batch.add(t)
    return batch.finish()
