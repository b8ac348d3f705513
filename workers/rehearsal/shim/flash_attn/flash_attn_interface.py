"""flash_attn 2.5.8's attention functions as upstream R3 calls them, on torch scaled_dot_product_attention.

Rehearsal only (see the package docstring): same signatures, shapes, dtypes and masks; different numerics.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class StandInUnsupported(NotImplementedError):
    """An argument value the stand-in does not implement (it refuses rather than ignore it)."""


def _refuse(what: str) -> StandInUnsupported:
    return StandInUnsupported(
        f"flash_attn stand-in (rehearsal): {what} is not supported; use the real flash_attn for this call"
    )


def _check_common(
    dropout_p: float,
    window_size: tuple[int, int] | list[int],
    alibi_slopes: torch.Tensor | None,
    block_table: torch.Tensor | None,
) -> None:
    if dropout_p != 0.0:
        raise _refuse(f"dropout_p={dropout_p} (only 0.0)")
    if tuple(window_size) != (-1, -1):
        raise _refuse(f"window_size={tuple(window_size)} (only (-1, -1), no local attention)")
    if alibi_slopes is not None:
        raise _refuse("alibi_slopes")
    if block_table is not None:
        raise _refuse("block_table (paged KV cache)")


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, token_dims: int) -> None:
    """Dtypes, devices and the head layout that flash_attn requires (GQA: kv heads divide q heads)."""
    if q.dim() != token_dims + 2 or k.dim() != token_dims + 2 or v.dim() != token_dims + 2:
        raise ValueError(
            f"flash_attn stand-in: q, k, v must have {token_dims + 2} dims, got {q.dim()}, {k.dim()}, {v.dim()}"
        )
    if q.dtype not in _DTYPES:
        raise ValueError(f"flash_attn stand-in: dtype {q.dtype} is not supported (bfloat16, float16, float32)")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"flash_attn stand-in: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError("flash_attn stand-in: q, k, v must be on one device")
    if k.shape != v.shape:
        raise ValueError(f"flash_attn stand-in: k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"flash_attn stand-in: head dim of q ({q.shape[-1]}) and k ({k.shape[-1]}) differ")
    hq, hk = q.shape[-2], k.shape[-2]
    if hk == 0 or hq % hk != 0:
        raise ValueError(f"flash_attn stand-in: number of heads in q ({hq}) must be divisible by that of k ({hk})")


@contextmanager
def _backend(deterministic: bool) -> Iterator[None]:
    # deterministic=True asks for a reproducible backward: the math backend is plain aten ops.
    with sdpa_kernel([SDPBackend.MATH]) if deterministic else nullcontext():
        yield


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """Attention of q (N, Lq, Hq, D) over k, v (N, Lk, Hk, D), Lq, Lk >= 1, flash_attn's masks; -> (N, Lq, Hq, D).

    Causal is aligned bottom-right (query i sees keys j <= i + Lk - Lq); a query row that sees no key is zero.
    """
    n, lq, hq, d = q.shape
    lk, hk = k.shape[1], k.shape[2]
    if hk != hq:
        k = k.repeat_interleave(hq // hk, dim=2)
        v = v.repeat_interleave(hq // hk, dim=2)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if not causal:
        out = F.scaled_dot_product_attention(qt, kt, vt, scale=scale)
    elif lq > lk:
        # The first lq - lk query rows see no key (flash_attn writes zeros); the last lk rows form a square.
        tail = F.scaled_dot_product_attention(qt[:, :, lq - lk :], kt, vt, is_causal=True, scale=scale)
        out = torch.cat([tail.new_zeros(n, hq, lq - lk, d), tail], dim=2)
    elif lq == lk:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
    else:
        rows = torch.arange(lq, device=q.device).unsqueeze(1)
        cols = torch.arange(lk, device=q.device).unsqueeze(0)
        keep = cols <= rows + (lk - lq)
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=keep, scale=scale)
    # A fresh contiguous tensor (never a view of what SDPA saved for backward), as callers write into it.
    return out.transpose(1, 2).clone(memory_format=torch.contiguous_format)


def _zeros_like(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Zeros shaped like q that stay in the autograd graph of q, k, v (gradient exactly 0, never NaN)."""
    return q.new_zeros(q.shape) + (q.flatten()[:0].sum() + k.flatten()[:0].sum() + v.flatten()[:0].sum())


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """One sequence: q (Lq, Hq, D), k, v (Lk, Hk, D) -> (Lq, Hq, D); empty key sets give zeros."""
    if q.shape[0] == 0 or k.shape[0] == 0:
        return _zeros_like(q, k, v)
    return _sdpa(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), scale, causal).squeeze(0)


def _lengths(cu_seqlens: torch.Tensor, name: str, total: int, max_seqlen: int) -> list[int]:
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"flash_attn stand-in: {name} must be a 1-D int32 tensor of batch_size + 1 offsets")
    offsets = [int(x) for x in cu_seqlens.tolist()]
    lengths = [b - a for a, b in itertools.pairwise(offsets)]
    if offsets[0] != 0 or min(lengths) < 0:
        raise ValueError(f"flash_attn stand-in: {name} must start at 0 and not decrease, got {offsets}")
    if offsets[-1] != total:
        raise ValueError(f"flash_attn stand-in: {name} ends at {offsets[-1]} but the tensor holds {total} tokens")
    if max(lengths) > max_seqlen:
        raise ValueError(f"flash_attn stand-in: a sequence of {max(lengths)} tokens exceeds max_seqlen={max_seqlen}")
    return lengths


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
) -> torch.Tensor:
    """Packed variable-length attention: q (total_q, Hq, D), k, v (total_k, Hk, D) -> (total_q, Hq, D).

    Sequence b is q[cu_seqlens_q[b]:cu_seqlens_q[b+1]] over k, v[cu_seqlens_k[b]:cu_seqlens_k[b+1]];
    differentiable (training uses it).
    """
    _check_common(dropout_p, window_size, alibi_slopes, block_table)
    if return_attn_probs:
        raise _refuse("return_attn_probs=True")
    _check_qkv(q, k, v, token_dims=1)
    lq = _lengths(cu_seqlens_q, "cu_seqlens_q", q.shape[0], max_seqlen_q)
    lk = _lengths(cu_seqlens_k, "cu_seqlens_k", k.shape[0], max_seqlen_k)
    if len(lq) != len(lk):
        raise ValueError(f"flash_attn stand-in: cu_seqlens_q holds {len(lq)} sequences, cu_seqlens_k {len(lk)}")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    with _backend(deterministic):
        if len(set(lq)) == 1 and len(set(lk)) == 1 and lq[0] > 0 and lk[0] > 0:
            # All sequences alike: one batched call (same masks as the loop below).
            b, hq, d = len(lq), q.shape[1], q.shape[2]
            qb = q.reshape(b, lq[0], hq, d)
            kb = k.reshape(b, lk[0], k.shape[1], d)
            vb = v.reshape(b, lk[0], v.shape[1], d)
            return _sdpa(qb, kb, vb, scale, causal).reshape(q.shape)
        qs, ks, vs = q.split(lq), k.split(lk), v.split(lk)
        return torch.cat([_attend(qi, ki, vi, scale, causal) for qi, ki, vi in zip(qs, ks, vs, strict=True)])


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> torch.Tensor:
    """Batched attention: q (B, Lq, Hq, D), k, v (B, Lk, Hk, D) -> (B, Lq, Hq, D); differentiable.

    Upstream R3 never calls it; transformers imports it once it sees flash_attn installed.
    """
    _check_common(dropout_p, window_size, alibi_slopes, None)
    if return_attn_probs:
        raise _refuse("return_attn_probs=True")
    _check_qkv(q, k, v, token_dims=2)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"flash_attn stand-in: batch of q ({q.shape[0]}) and k ({k.shape[0]}) differ")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    if q.shape[0] == 0 or q.shape[1] == 0 or k.shape[1] == 0:
        return _zeros_like(q, k, v)
    with _backend(deterministic):
        return _sdpa(q, k, v, scale, causal)


def _per_batch(
    value: int | torch.Tensor | None, name: str, batch: int, device: torch.device
) -> torch.Tensor | None:
    if value is None:
        return None
    if isinstance(value, int):
        return torch.full((batch,), value, dtype=torch.int32, device=device)
    if value.dtype != torch.int32 or value.shape != (batch,):
        raise ValueError(f"flash_attn stand-in: {name} must be an int32 tensor of shape ({batch},)")
    return value


@torch.no_grad()
def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Decoding attention over a KV cache: q (B, Lq, Hq, D), caches (B_cache, S, Hk, D) -> (B, Lq, Hq, D).

    Row b uses cache row i = cache_batch_idx[b] (default b) holding s = cache_seqlens[b] tokens (default S).
    Given k, v (B, L_new, Hk, D), they are first written in place at cache[i, s : s + L_new], then q attends
    to cache[i, : s + L_new]; causal is aligned bottom-right. No backward (as flash_attn). With
    return_softmax_lse, also the float32 logsumexp of the scaled scores (B, Hq, Lq), +inf where a row sees no
    key. num_splits only tunes flash_attn's kernel; it has no meaning here.
    """
    _check_common(0.0, window_size, alibi_slopes, block_table)
    if rotary_cos is not None or rotary_sin is not None:
        raise _refuse("rotary_cos / rotary_sin (rotary embedding inside the kernel)")
    if num_splits < 0:
        raise ValueError(f"flash_attn stand-in: num_splits must be >= 0, got {num_splits}")
    _check_qkv(q, k_cache, v_cache, token_dims=2)
    if (k is None) != (v is None):
        raise ValueError("flash_attn stand-in: pass both k and v, or neither")
    batch, lq, hq = q.shape[0], q.shape[1], q.shape[2]
    cache_rows, cache_len, hk = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    seqlens = _per_batch(cache_seqlens, "cache_seqlens", batch, q.device)
    index = _per_batch(cache_batch_idx, "cache_batch_idx", batch, q.device)
    if index is None and batch > cache_rows:
        raise ValueError(f"flash_attn stand-in: batch {batch} exceeds the cache's {cache_rows} rows")
    rows = list(range(batch)) if index is None else [int(i) for i in index.tolist()]
    if rows and (min(rows) < 0 or max(rows) >= cache_rows):
        raise ValueError(f"flash_attn stand-in: cache_batch_idx {rows} outside the cache's {cache_rows} rows")
    if seqlens is None and k is not None:
        raise _refuse("new k, v without cache_seqlens")
    starts = [cache_len] * batch if seqlens is None else [int(s) for s in seqlens.tolist()]
    new = 0
    if k is not None and v is not None:
        _check_qkv(q, k, v, token_dims=2)
        if k.shape[0] != batch or k.shape[2] != hk:
            raise ValueError(f"flash_attn stand-in: k shape {tuple(k.shape)} does not fit q and the cache")
        new = k.shape[1]
    if min(starts) < 0 or max(starts) + new > cache_len:
        raise ValueError(
            f"flash_attn stand-in: cache_seqlens {starts} plus {new} new tokens exceed the cache ({cache_len})"
        )
    if k is not None and v is not None:
        for b, (row, s) in enumerate(zip(rows, starts, strict=True)):
            k_cache[row, s : s + new] = k[b]
            v_cache[row, s : s + new] = v[b]
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    outs, lses = [], []
    for b, (row, s) in enumerate(zip(rows, starts, strict=True)):
        keys, values = k_cache[row, : s + new], v_cache[row, : s + new]
        outs.append(_attend(q[b], keys, values, scale, causal))
        if return_softmax_lse:
            lses.append(_logsumexp(q[b], keys, scale, causal))
    out = torch.stack(outs) if outs else q.new_zeros(q.shape)
    if not return_softmax_lse:
        return out
    lse = torch.stack(lses) if lses else torch.zeros(batch, hq, lq, dtype=torch.float32, device=q.device)
    return out, lse


def _logsumexp(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """float32 logsumexp over keys of the scaled scores of one sequence -> (Hq, Lq); +inf for rows with no key."""
    lq, hq, lk = q.shape[0], q.shape[1], k.shape[0]
    if lk == 0:
        return torch.full((hq, lq), math.inf, dtype=torch.float32, device=q.device)
    kf = k.float().repeat_interleave(hq // k.shape[1], dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    if causal:
        keep = torch.arange(lk, device=q.device)[None, :] <= torch.arange(lq, device=q.device)[:, None] + (lk - lq)
        scores = scores.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
