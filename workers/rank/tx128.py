"""The tx128 digest's definition: its constants, the header it covers and the NumPy reference implementation.

Both digest paths import it (workers/rank/digest.py on CPU, the Triton kernels of workers/rank/digest_triton.py on
CUDA).

tx128 of a byte string of length L: zero-pad to a multiple of 16 bytes; chunk c (c = 0, 1, ...) holds
four little-endian uint32 words w0..w3, with even pair E = (w0, w2) and odd pair O = (w1, w3). With
base = (c * GOLD) mod 2^32 and, for pair slot p in {0, 1}, keys K(p) = (K0 + p * KD) mod 2^32:
    lane A = sum over c, p of u64(E[p] + base + KAE(p)) * u64((O[p] + base + KAO(p)) | 1)   mod 2^64
    lane B = sum over c, p of u64(O[p] + base + KBO(p)) * u64((E[p] + base + KBE(p)) | 1)   mod 2^64
(32-bit additions wrap). Each term is injective in its first word (odd multiplier), so any single-word
change moves lane A (even words) or lane B (odd words); sums make the result independent of block size
and grid. The 128-bit value (A, B) is finalised with the dtype, shape and byte length through SHA256.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np

GOLD = 0x9E3779B1
KAE = (0x85EBCA77, 0x2C1B3C6D)  # lane A, even words: (K0, KD)
KAO = (0xC2B2AE3D, 0x297A2D39)  # lane A, odd words
KBO = (0x27D4EB2F, 0x61C88647)  # lane B, odd words
KBE = (0x165667B1, 0x5BD1E995)  # lane B, even words
M32 = 0xFFFFFFFF
_REF_CHUNKS = 1 << 22  # chunks per NumPy slice (64 MiB of input) to bound temporary memory


def tensor_header(algo: str, dtype: str, shape: Iterable[int], nbytes: int) -> bytes:
    """What a digest covers besides the bytes: a different dtype, shape or length is a different digest."""
    return f"{algo}|{dtype}|{tuple(int(s) for s in shape)}|{nbytes}|".encode()


def tx128_lanes_reference(data: np.ndarray, chunk_offset: int = 0) -> tuple[int, int]:
    """Lane sums (A, B) of the bytes in `data` (uint8, any length; zero-padded), chunks numbered from offset."""
    u8 = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    pad = (-u8.size) % 16
    if pad:
        u8 = np.concatenate([u8, np.zeros(pad, dtype=np.uint8)])
    words = u8.view("<u4").reshape(-1, 4)
    slot = np.arange(2, dtype=np.uint64)
    keys = {
        name: ((k0 + slot * kd) & M32).astype(np.uint32)[None, :]
        for name, (k0, kd) in (("ae", KAE), ("ao", KAO), ("bo", KBO), ("be", KBE))
    }
    lane_a = np.uint64(0)
    lane_b = np.uint64(0)
    with np.errstate(over="ignore"):
        for start in range(0, words.shape[0], _REF_CHUNKS):
            w = words[start : start + _REF_CHUNKS]
            c = np.arange(chunk_offset + start, chunk_offset + start + w.shape[0], dtype=np.uint64)
            base = ((c * np.uint64(GOLD)) & np.uint64(M32)).astype(np.uint32)[:, None]
            even = w[:, 0::2]
            odd = w[:, 1::2]
            va = (even + base + keys["ae"]).astype(np.uint64)
            ma = ((odd + base + keys["ao"]) | np.uint32(1)).astype(np.uint64)
            vb = (odd + base + keys["bo"]).astype(np.uint64)
            mb = ((even + base + keys["be"]) | np.uint32(1)).astype(np.uint64)
            lane_a = lane_a + np.sum(va * ma, dtype=np.uint64)
            lane_b = lane_b + np.sum(vb * mb, dtype=np.uint64)
    return int(lane_a), int(lane_b)


def tx128_finalize(lanes: tuple[int, int], dtype: str, shape: Iterable[int], nbytes: int) -> str:
    """The printable digest: 128 bits of SHA256 over the header and the two 64-bit lanes."""
    body = (lanes[0] & (2**64 - 1)).to_bytes(8, "little") + (lanes[1] & (2**64 - 1)).to_bytes(8, "little")
    return "tx128:" + hashlib.sha256(tensor_header("tx128", dtype, shape, nbytes) + body).hexdigest()[:32]


def tx128_reference(data: np.ndarray, dtype: str, shape: Iterable[int]) -> str:
    """NumPy tx128 of raw bytes: the value the Triton kernel must reproduce exactly."""
    u8 = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return tx128_finalize(tx128_lanes_reference(u8), dtype, shape, int(u8.size))


# ---------------------------------------------------------------- the bytes a digest covers


def local_tensor(t: Any) -> Any:
    """The rank's own bytes: a DTensor's local shard, detached."""
    to_local = getattr(t, "to_local", None)
    if to_local is not None:
        t = to_local()
    return t.detach()


def byte_view(t: Any) -> Any:
    """A flat uint8 view of a tensor's bytes (a copy only when the tensor is not contiguous)."""
    import torch

    if not t.is_contiguous():
        t = t.contiguous()  # a strided view has no single byte string: hash its logical order
    return t.reshape(-1).view(torch.uint8)
