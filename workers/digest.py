"""Digests of tensors' raw bytes (never a cast): SHA256 on CPU, the tx128 Triton kernel on CUDA.

Also the combined digest of a step. tx128 itself (constants, NumPy reference) is defined in workers/tx128.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from workers.tx128 import byte_view, local_tensor, tensor_header


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
    out: dict[str, str] = {}
    cpu: list[tuple[str, Any]] = []
    batches: dict[int, Any] = {}  # CUDA device index -> Tx128Batch
    rows: list[tuple[str, Any, int]] = []
    for name, t in tensors.items():
        to_local = getattr(t, "to_local", None)
        lt = to_local() if to_local is not None else t  # a DTensor's own shard (no autograd under no_grad)
        if lt.is_cuda:
            dev = lt.get_device()
            batch = batches.get(dev)
            if batch is None:
                from workers.digest_triton import Tx128Batch

                batch = batches[dev] = Tx128Batch(lt.device, capacity=len(tensors))
            rows.append((name, dev, batch.add(lt)))
        else:
            cpu.append((name, lt))
    for batch in batches.values():
        batch.launch()  # the device reads while the host hashes the CPU tensors
    for name, lt in cpu:
        out[name] = digest_cpu(lt)
    done = {dev: batch.finish() for dev, batch in batches.items()}
    for name, dev, row in rows:
        out[name] = done[dev][row]
    return {k: out[k] for k in tensors}



def combined_digest(digests: Mapping[str, str]) -> str:
    """SHA256 over sorted 'name=digest' lines: ranks and runs compare directly."""
    lines = "".join(f"{k}={digests[k]}\n" for k in sorted(digests))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
