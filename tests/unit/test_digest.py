"""Digests hash raw bytes (never a cast); tx128 is position-dependent, grid-independent, and the Triton kernel
equals the NumPy reference bit for bit (interpreter on CPU, compiled on CUDA)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.rank.digest import combined_digest, digest_cpu, digest_many
from workers.rank.tx128 import tensor_header, tx128_finalize, tx128_lanes_reference, tx128_reference

REPO = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_cpu_digest_is_sha256_of_header_and_raw_bytes() -> None:
    t = torch.arange(10, dtype=torch.float32)
    expect = hashlib.sha256(tensor_header("sha256", "torch.float32", (10,), 40) + t.numpy().tobytes()).hexdigest()
    assert digest_cpu(t) == "sha256:" + expect[:32]


def test_raw_bytes_not_values() -> None:
    assert digest_cpu(torch.tensor([0.0])) != digest_cpu(torch.tensor([-0.0]))  # equal values, different bits
    bits = torch.tensor([0x3C00], dtype=torch.int16)
    assert digest_cpu(bits.view(torch.bfloat16)) != digest_cpu(bits.view(torch.float16))  # dtype is hashed
    t = torch.arange(6, dtype=torch.int64)
    assert digest_cpu(t) != digest_cpu(t.reshape(2, 3))  # shape is hashed
    nan_a = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    nan_b = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert digest_cpu(nan_a) != digest_cpu(nan_b)  # NaN payloads count


def test_strided_tensor_hashes_its_logical_order() -> None:
    t = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    assert digest_cpu(t.t()) == digest_cpu(t.t().contiguous())
    assert digest_cpu(torch.tensor(3.0)) == digest_cpu(torch.tensor(3.0))  # 0-dim works


def test_combined_digest_ignores_insertion_order() -> None:
    a = {"x": "sha256:1", "y": "sha256:2"}
    assert combined_digest(a) == combined_digest({"y": "sha256:2", "x": "sha256:1"})
    assert combined_digest(a) != combined_digest({"x": "sha256:2", "y": "sha256:1"})


def test_digest_many_keeps_names() -> None:
    ts = {"b": torch.ones(3), "a": torch.zeros(2, dtype=torch.int64)}
    out = digest_many(ts)
    assert list(out) == ["b", "a"] and out["a"] == digest_cpu(ts["a"])


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=0, max_size=300), st.integers(min_value=0, max_value=20))
def test_tx128_lanes_add_over_chunk_splits(data: bytes, cut_chunk: int) -> None:
    """Any split at a chunk boundary, with its chunk offset, sums to the whole: block size and grid cannot matter."""
    arr = np.frombuffer(data, dtype=np.uint8)
    cut = min(cut_chunk * 16, (len(data) // 16) * 16)
    whole = tx128_lanes_reference(arr)
    left = tx128_lanes_reference(arr[:cut])
    right = tx128_lanes_reference(arr[cut:], chunk_offset=cut // 16)
    assert whole == tuple((a + b) % 2**64 for a, b in zip(left, right, strict=True))


@settings(max_examples=80, deadline=None)
@given(st.binary(min_size=1, max_size=200), st.data())
def test_tx128_single_byte_change_is_seen(data: bytes, draw: st.DataObject) -> None:
    i = draw.draw(st.integers(min_value=0, max_value=len(data) - 1))
    delta = draw.draw(st.integers(min_value=1, max_value=255))
    changed = bytearray(data)
    changed[i] = (changed[i] + delta) % 256
    a = tx128_lanes_reference(np.frombuffer(data, dtype=np.uint8))
    b = tx128_lanes_reference(np.frombuffer(bytes(changed), dtype=np.uint8))
    assert a != b


def test_tx128_position_dependent_and_length_bound() -> None:
    x = np.arange(64, dtype=np.uint8)
    swapped = np.concatenate([x[16:32], x[:16], x[32:]])
    assert tx128_reference(x, "torch.uint8", (64,)) != tx128_reference(swapped, "torch.uint8", (64,))
    zeros = np.zeros(4, dtype=np.uint8)
    # zero padding never merges lengths: the byte length is in the finalisation
    assert tx128_reference(zeros[:3], "torch.uint8", (3,)) != tx128_reference(zeros, "torch.uint8", (4,))
    assert tx128_finalize((1, 2), "torch.uint8", (3,), 3) != tx128_finalize((2, 1), "torch.uint8", (3,), 3)


_KERNEL_CHECK = r"""
import numpy as np, torch
from workers.rank.tx128 import tx128_reference
from workers.rank.digest_triton import tx128_cuda_many
dev = "{device}"
g = torch.Generator().manual_seed(0)
cases = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in {sizes}]
cases += [torch.randn(n, generator=g).to(dt) for n, dt in {typed}]
cases.append(torch.arange(7, dtype=torch.int64).reshape(7, 1))
cases.append(torch.randn(41, generator=g).to(torch.bfloat16)[1:])  # storage offset not 4-byte aligned
for t in cases:
    ref = tx128_reference(t.contiguous().view(torch.uint8).numpy(), str(t.dtype), t.shape)
    for block, programs in {configs}:
        got = tx128_cuda_many([t.to(dev)], block=block, programs=programs)[0]
        assert got == ref, (t.dtype, tuple(t.shape), block, programs, got, ref)
batch = tx128_cuda_many([t.to(dev) for t in cases])
assert batch == [tx128_reference(t.contiguous().view(torch.uint8).numpy(), str(t.dtype), t.shape) for t in cases]
print("ok", len(cases))
"""


def _run_kernel_check(device: str, sizes: list[int], typed: str, configs: str, interpret: bool) -> None:
    code = _KERNEL_CHECK.format(device=device, sizes=sizes, typed=typed, configs=configs)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if interpret:
        env["TRITON_INTERPRET"] = "1"  # must be set before triton is imported: hence a fresh process
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok")


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed: the lead runs the kernel test on the GPU")
def test_triton_kernel_equals_reference_interpreted() -> None:
    typed = "[(33, torch.bfloat16), (40, torch.float32), (5, torch.float64), (9, torch.int32)]"
    _run_kernel_check("cpu", [0, 1, 15, 16, 17, 1000, 2053], typed, "[(16, 1), (32, 3), (64, None)]", True)


@pytest.mark.cuda
def test_triton_kernel_equals_reference_cuda() -> None:
    typed = "[(1 << 20 | 3, torch.bfloat16), ((1 << 22) + 1, torch.float32), (4099, torch.int64)]"
    sizes = [0, 1, 15, 16, 17, 4095, (1 << 24) + 7]
    configs = "[(256, 1), (1024, 7), (4096, None), (1024, None)]"
    _run_kernel_check("cuda", sizes, typed, configs, False)


_BATCH_CHECK = r"""
import torch
from workers.rank.tx128 import tx128_reference
from workers.rank.digest_triton import tx128_cuda_many
from workers.rank.digest_triton_compare import tx128_cuda_many_per_tensor, tx128_cuda_many_two_launch
dev = "{device}"
g = torch.Generator().manual_seed(1)
dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.uint8]
def make(nbytes, dtype):
    raw = torch.randint(0, 256, (nbytes + 16,), dtype=torch.uint8, generator=g)
    return raw[: nbytes // dtype.itemsize * dtype.itemsize].view(dtype)  # random bits, NaN payloads included
def cases():
    out = [make(n, dtypes[i % 4]) for i, n in enumerate({sizes})]
    out += [make(n, dtypes[i % 4]) for i, n in enumerate(torch.randint(0, 5001, ({n_random},), generator=g).tolist())]
    out.append(make(4 * 96, torch.float32).reshape(12, 8).t())  # not contiguous: hashed in logical order
    out.append(make(2 * 300, torch.bfloat16).reshape(20, 15)[:, ::2])
    out.append(make(4 * 1001, torch.float32)[1:])  # storage offset 4 bytes: aligned to 4, not 16
    out.append(make(2 * 1001, torch.bfloat16)[1:])  # storage offset 2 bytes: not aligned to 4
    out.append(make(2 * 9, torch.bfloat16)[3:])  # under 16 bytes at an odd offset: the tail path alone
    out.append(make(1003, torch.uint8)[5:])
    out.append(make(8 * 40, torch.int64)[7:].reshape(3, 11))
    return [t.to(dev) for t in out]
for rnd in range(2):  # the second round: same shapes (cached launch tables), new bytes and addresses
    ts = cases()
    ref = [tx128_reference(t.cpu().contiguous().view(torch.uint8).numpy(), str(t.dtype), t.shape) for t in ts]
    for block, programs in {configs} if rnd == 0 else [(None, None)]:
        got = tx128_cuda_many(ts, block=block, programs=programs)
        bad = [(i, ts[i].dtype, tuple(ts[i].shape)) for i in range(len(ts)) if got[i] != ref[i]]
        assert not bad, (block, programs, bad)
    if rnd:
        break
    assert tx128_cuda_many_per_tensor(ts) == ref
    assert tx128_cuda_many_two_launch(ts) == ref
    # launch groups of 1, 4, 16, ... tensors (or a few hundred bytes), an accumulator grown past its capacity
    few = list(range(0, len(ts), 3))
    for first_group, capacity in (((1, 1 << 40), None), ((1 << 20, 300), 1)):
        got = tx128_cuda_many([ts[i] for i in few], block=64, programs=3, first_group=first_group, capacity=capacity)
        assert got == [ref[i] for i in few], (first_group, capacity)
    assert tx128_cuda_many(ts[::-1]) == ref[::-1]  # order of the batch does not matter
    # the wide (int64) chunk arithmetic that only a tensor of 2^29 chunks (8 GiB) turns on, forced: same values
    import dataclasses
    import workers.rank.digest_triton as dt
    narrow = dt._group_table
    dt._group_table = lambda *a: None if narrow(*a) is None else dataclasses.replace(narrow(*a), wide=True)
    try:
        assert tx128_cuda_many(ts, block=16, programs=3, first_group=(4, 1 << 12)) == ref
    finally:
        dt._group_table = narrow
    steps = [t.reshape(-1)[:1].reshape(()).clone() for t in ts[:8] if t.numel()]  # 0-dim tensors: tails only
    assert tx128_cuda_many(steps, block=16, programs=2) == tx128_cuda_many_per_tensor(steps)
    empty = [t[:0] for t in ts[:5]]
    assert tx128_cuda_many(empty) == tx128_cuda_many_per_tensor(empty)  # nothing to launch: lanes stay zero
    # one allocation seen as other dtypes and shapes (same address, same length): cached tables and header plans
    # must follow the dtype and shape, never return the header of the view digested before
    raw = make(64, torch.uint8).to(dev)
    views = [raw, raw.view(torch.float32), raw.view(torch.int64).reshape(2, 4),
             raw.view(torch.bfloat16).reshape(4, 8), raw.view(torch.float32).reshape(16, 1)]
    assert len(set(v.data_ptr() for v in views)) == 1
    vref = [tx128_reference(v.cpu().view(torch.uint8).numpy(), str(v.dtype), v.shape) for v in views]
    assert len(set(vref)) == len(views)
    for _ in range(2):
        assert [tx128_cuda_many([v])[0] for v in views] == vref
        assert tx128_cuda_many(views) == vref and tx128_cuda_many(views[::-1]) == vref[::-1]
assert tx128_cuda_many([]) == []
print("ok", len(ts))
"""


def _run_batch_check(device: str, n_random: int, configs: str, interpret: bool) -> None:
    sizes = [0, 1, 2, 3, 4, 6, 8, 15, 16, 17, 31, 32, 33, 48, 100, 1000, 1026, 4096, 4097, 4999, 5000]
    code = _BATCH_CHECK.format(device=device, sizes=sizes, n_random=n_random, configs=configs)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok")


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed: the lead runs the kernel test on the GPU")
def test_tx128_batch_equals_reference_and_per_tensor_interpreted() -> None:
    """Many tensors in one batch: each digest equals the NumPy reference and the per-tensor launches."""
    _run_batch_check("cpu", 12, "[(16, 1), (32, 3), (64, None), (16, 1000)]", True)


@pytest.mark.cuda
def test_tx128_batch_equals_reference_and_per_tensor_cuda() -> None:
    _run_batch_check("cuda", 300, "[(16, 1), (64, 7), (256, None), (1024, None), (4096, 100000)]", False)


@pytest.mark.cuda
def test_digest_many_on_cuda_equals_per_tensor_and_sha256_of_cpu_tensors() -> None:
    """The probe's call: CUDA tensors (launch groups overlapped with the walk), CPU ones (SHA256) in one mapping."""
    from workers.rank.digest_triton_compare import tx128_cuda_many_per_tensor

    g = torch.Generator().manual_seed(3)
    cuda = {f"c{i}": torch.randn(int(n), generator=g).cuda() for i, n in enumerate(torch.randint(1, 1 << 20, (80,)))}
    cuda["big"] = torch.randn(3 << 24, generator=g).cuda()  # 192 MiB: a group of its own
    cuda["step"] = torch.tensor(7.0).cuda()
    cpu = {"s0": torch.tensor(3.0), "s1": torch.arange(5)}
    mixed = {**dict(list(cuda.items())[:40]), **cpu, **dict(list(cuda.items())[40:])}
    got = digest_many(mixed)
    assert list(got) == list(mixed)
    assert [got[k] for k in cuda] == tx128_cuda_many_per_tensor(list(cuda.values()))
    assert all(got[k] == digest_cpu(v) for k, v in cpu.items())
    only = digest_many(cuda)  # one device and no CPU tensor: the path that zips names with the batch's rows
    assert list(only) == list(cuda) and only == {k: got[k] for k in cuda}


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed: the lead runs the kernel test on the GPU")
def test_header_cache_follows_dtype_and_shape_at_the_same_address() -> None:
    """The header cache against tx128_finalize: views of one allocation (same address, same byte length) in any
    order and mix, each with its own header, on repeated calls (cached then)."""
    from workers.rank.digest_triton import finalize_rows, header_states

    raw = torch.arange(64, dtype=torch.uint8)
    views = [raw, raw.view(torch.float32), raw.view(torch.int64).reshape(2, 4), raw.view(torch.bfloat16).reshape(4, 8),
             raw.view(torch.float32).reshape(16, 1), raw.view(torch.int32).reshape(2, 2, 2, 2),
             raw.view(torch.float64).reshape(2, 1, 4, 1, 1), raw.view(torch.int16).reshape(32)]  # fmt: skip
    assert len({(v.data_ptr(), v.nbytes) for v in views}) == 1
    lanes = [(2**64 - 1 - 7 * i, 3**i) for i in range(len(views))]
    body = b"".join(a.to_bytes(8, "little") + b.to_bytes(8, "little") for a, b in lanes)

    def digests(ts: list[torch.Tensor], rows: list[int]) -> list[str]:
        return finalize_rows(header_states(ts), b"".join(body[16 * i : 16 * i + 16] for i in rows))

    expect = [tx128_finalize(lanes[i], str(v.dtype), v.shape, v.nbytes) for i, v in enumerate(views)]
    assert len(set(expect)) == len(views)  # the headers differ (the lanes alone would not tell them apart)
    for _ in range(2):  # the second round: every plan is cached
        for i, v in enumerate(views):
            assert digests([v], [i]) == [expect[i]]
        order = list(range(len(views)))[::-1]
        assert digests([views[i] for i in order], order) == [expect[i] for i in order]
        assert digests(views, list(range(len(views)))) == expect
    empty, step = raw[:0], raw.view(torch.float32)[:1].reshape(())  # 0 bytes and a 0-dim tensor: headers too
    assert digests([empty, step], [0, 1]) == [tx128_finalize(lanes[0], "torch.uint8", (0,), 0),
                                              tx128_finalize(lanes[1], "torch.float32", (), 4)]  # fmt: skip


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed: the lead runs the kernel test on the GPU")
@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3000), max_size=24), st.sampled_from([16, 32, 1024]),
       st.integers(min_value=1, max_value=40), st.integers(min_value=0, max_value=3))  # fmt: skip
def test_launch_table_gives_every_block_of_every_tensor_to_one_program(
    nbytes: list[int], block: int, programs: int, row0: int
) -> None:
    """The table kernel's walk, replayed from its table: each program's contiguous range, the tensor switch at each
    first block, the tails; every whole chunk is read once, by the row of its tensor, whatever block and grid."""
    from workers.rank.digest_triton import _group_table

    anchor = 1 << 20
    ptrs, at = [], anchor + 4096
    for n in nbytes:
        ptrs.append(at)
        at += (n + 15) // 16 * 16 + 16 * (n % 3)  # 16-byte aligned, sometimes gaps
    key = (row0, *[v for pn in zip(ptrs, nbytes, strict=True) for v in pn])
    g = _group_table(key, anchor, block, programs, torch.device("cpu"))
    whole = [n // 16 for n in nbytes]
    if g is None:
        assert not any(nbytes)
        return
    t = g.host.tolist()
    m, grid, n_tail = g.n_main, g.grid, g.n_tail
    off, chunks, first, rows = t[:m], t[m : 2 * m], t[2 * m : 3 * m + 1], t[3 * m + 1 : 4 * m + 1]
    prog, pseg = t[4 * m + 1 : 4 * m + grid + 2], t[4 * m + grid + 2 : 4 * m + 2 * grid + 2]
    tails = t[4 * m + 2 * grid + 2 :]
    assert len(tails) == 4 * n_tail and grid <= programs and g.unit == 16
    seen: dict[int, list[int]] = {}
    for pid in range(grid):  # the kernel's loop, step by step
        lo, hi = prog[pid], prog[pid + 1]
        if hi <= lo:
            continue
        s = pseg[pid]
        for blk in range(lo, hi):
            if blk == first[s + 1]:
                s += 1
            for c in range((blk - first[s]) * block, min((blk - first[s] + 1) * block, chunks[s])):
                seen.setdefault(rows[s], []).append(c)
            assert ptrs[rows[s] - row0] - anchor == off[s] * 16
    expect = {row0 + i: list(range(w)) for i, w in enumerate(whole) if w}
    assert {r: sorted(c) for r, c in seen.items()} == expect
    tail_rows = tails[3 * n_tail :]
    assert tail_rows == [row0 + i for i, n in enumerate(nbytes) if n % 16]
    for j, r in enumerate(tail_rows):
        i = r - row0
        assert tails[j] == ptrs[i] + whole[i] * 16 - anchor and tails[n_tail + j] == whole[i]
        assert tails[2 * n_tail + j] == nbytes[i] % 16
