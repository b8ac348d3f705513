"""Digests of tensors' raw bytes (never a cast): SHA256 on CPU, the tx128 Triton kernel on CUDA.

Also the combined digest of a step. tx128 itself (constants, NumPy reference) is defined in workers/rank/tx128.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from workers.rank.tx128 import byte_view, local_tensor, tensor_header


def sha256_bytes_digest(buf: Any, dtype: str, shape: Iterable[int], nbytes: int) -> str:
    """CPU digest: SHA256 (first 128 bits) over the header and the buffer, hashed in place."""
    h = hashlib.sha256(tensor_header("sha256", dtype, shape, nbytes))
    h.update(buf)
    return "sha256:" + h.hexdigest()[:32]


def digest_cpu(t: Any) -> str:
    t = local_tensor(t)
    u8 = byte_view(t)
    if u8.device.type != "cpu":
        raise ValueError(f"digest_cpu needs a CPU tensor, got {u8.device}")
    return sha256_bytes_digest(memoryview(u8.numpy()), str(t.dtype), t.shape, u8.numel())


def digest_many(tensors: Mapping[str, Any]) -> dict[str, str]:
    """name -> digest; CUDA tensors through tx128 (launched while the walk goes on, one host copy per device),
    CPU ones through SHA256 while the device works."""
    cpu: list[tuple[str, Any]] = []
    batches: dict[int, tuple[Any, list[str]]] = {}  # CUDA device index -> (Tx128Batch, its rows' names)
    for name, t in tensors.items():
        to_local = getattr(t, "to_local", None)  # as fast as a type test (bench_digest.py --host-only)
        if to_local is not None:
            t = to_local()  # a DTensor's own shard (no autograd under no_grad)
        if t.is_cuda:
            dev = t.get_device()
            entry = batches.get(dev)
            if entry is None:
                from workers.rank.digest_triton import Tx128Batch

                entry = batches[dev] = (Tx128Batch(t.device, capacity=len(tensors)), [])
            entry[0].add(t)
            entry[1].append(name)
        else:
            cpu.append((name, t))
    for batch, _ in batches.values():
        batch.launch()  # the device reads while the host hashes the CPU tensors
    out = {name: digest_cpu(t) for name, t in cpu}
    if not out and len(batches) == 1:  # the probe's usual case: one device, names already in order
        batch, names = next(iter(batches.values()))
        return dict(zip(names, batch.finish(), strict=True))
    for batch, names in batches.values():
        out.update(zip(names, batch.finish(), strict=True))
    return {k: out[k] for k in tensors}


def combined_digest(digests: Mapping[str, str]) -> str:
    """SHA256 over sorted 'name=digest' lines: ranks and runs compare directly."""
    lines = "".join(f"{k}={digests[k]}\n" for k in sorted(digests))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
