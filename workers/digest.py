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
    """name -> digest; CUDA tensors go through tx128 in one batch (one host sync), CPU ones through SHA256."""
    out: dict[str, str] = {}
    cuda: dict[str, Any] = {}
    for name, t in tensors.items():
        lt = local_tensor(t)
        if lt.device.type == "cuda":
            cuda[name] = lt
        else:
            out[name] = digest_cpu(lt)
    if cuda:
        from workers.digest_triton import tx128_cuda_many

        out.update(zip(cuda, tx128_cuda_many(list(cuda.values())), strict=True))
    return {k: out[k] for k in tensors}


def digest_tensor(t: Any) -> str:
    return digest_many({"t": t})["t"]


def combined_digest(digests: Mapping[str, str]) -> str:
    """SHA256 over sorted 'name=digest' lines: ranks and runs compare directly."""
    lines = "".join(f"{k}={digests[k]}\n" for k in sorted(digests))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
