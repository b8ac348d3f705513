"""Temperature + top-k logits filter of the text sampler: the torch reference and a Triton fused kernel.
The kernel finds the k-th largest value by an exact radix select (order-independent), so it matches bit for bit."""

from __future__ import annotations

import torch

try:  # the Triton path exists only where Triton does (CUDA hosts; CPU only under TRITON_INTERPRET=1)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on hosts without Triton
    triton = None
    tl = None


def topk_filter_reference(logits: torch.Tensor, temperature: torch.Tensor, top_k: int) -> torch.Tensor:
    """logits [R, V] float32, temperature a 0-dim float32 tensor on the same device (true IEEE division)."""
    scaled = logits / temperature
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return scaled
    kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
    return scaled.masked_fill(scaled < kth, float("-inf"))


if triton is not None:

    @triton.jit
    def _topk_filter_kernel(x_ptr, out_ptr, temp_ptr, V, stride_x, stride_o, top_k, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        valid = offs < V
        x = tl.load(x_ptr + row * stride_x + offs, mask=valid, other=0.0)
        temp = tl.load(temp_ptr)
        s = tl.math.div_rn(x, temp)  # correctly rounded, like torch's tensor/tensor division
        bits = s.to(tl.int32, bitcast=True)
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # order-preserving integer key
        key = tl.where(s == 0.0, 0, key)  # -0.0 and +0.0 compare equal, as in torch
        ukey = key.to(tl.int64) + 2147483648
        ukey = tl.where(valid, ukey, -1)  # padding lanes are never counted
        res = tl.full((), 0, tl.int64)
        for b in tl.static_range(31, -1, -1):
            cand = res | (1 << b)
            count = tl.sum((ukey >= cand).to(tl.int32), axis=0)
            res = tl.where(count >= top_k, cand, res)
        # res is the key of the k-th largest value: keep everything not below it
        out = tl.where(ukey >= res, s, float("-inf"))
        tl.store(out_ptr + row * stride_o + offs, out, mask=valid)


def topk_filter_triton(logits: torch.Tensor, temperature: torch.Tensor, top_k: int) -> torch.Tensor:
    if triton is None:
        raise RuntimeError("R3_FUSE_TRITON_TOPK=1 needs Triton; install it or set R3_FUSE_TRITON_TOPK=0")
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits / temperature
    logits = logits.contiguous()
    rows, vocab = logits.shape
    out = torch.empty_like(logits)
    block = triton.next_power_of_2(vocab)
    _topk_filter_kernel[(rows,)](logits, out, temperature, vocab, logits.stride(0), out.stride(0), top_k, BLOCK=block)
    return out


def topk_filter(logits: torch.Tensor, temperature: torch.Tensor, top_k: int, use_triton: bool) -> torch.Tensor:
    if use_triton:
        return topk_filter_triton(logits, temperature, top_k)
    return topk_filter_reference(logits, temperature, top_k)
