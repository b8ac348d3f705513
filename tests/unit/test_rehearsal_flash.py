"""The flash_attn stand-in of the rehearsal against a plain float64 reference (loops, explicit masks).

The stand-in is imported from workers/rehearsal/shim, put on sys.path by a fixture of this module only.
"""

from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SHIM = Path(__file__).resolve().parents[2] / "workers" / "rehearsal" / "shim"
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
DTYPES = st.sampled_from([torch.float32, torch.bfloat16])


@pytest.fixture(scope="module")
def fa() -> Iterator[ModuleType]:
    sys.path.insert(0, str(SHIM))
    try:
        import flash_attn

        assert Path(flash_attn.__file__).resolve().is_relative_to(SHIM)
        yield flash_attn
    finally:
        sys.path.remove(str(SHIM))
        for name in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
            del sys.modules[name]


# ---- the reference: one sequence, float64, a loop over heads and an explicit mask -------------------------


def ref_mask(lq: int, lk: int, causal: bool) -> list[list[bool]]:
    """flash_attn >= 2.1: causal is aligned bottom-right, query i sees key j iff j <= i + lk - lq."""
    return [[(not causal) or j <= i + lk - lq for j in range(lk)] for i in range(lq)]


def ref_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """q (Lq, Hq, D), k, v (Lk, Hk, D) -> out (Lq, Hq, D) and logsumexp (Hq, Lq), in float64."""
    lq, hq, d = q.shape
    lk, hk = k.shape[0], k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    keep = torch.tensor(ref_mask(lq, lk, causal), dtype=torch.bool).reshape(lq, lk)
    q, k, v = q.double(), k.double(), v.double()
    outs, lses = [], []
    for h in range(hq):
        g = h // (hq // hk)  # q heads [g * hq/hk, (g + 1) * hq/hk) share kv head g
        scores = (q[:, h] @ k[:, g].T) * scale
        scores = scores.masked_fill(~keep, -math.inf)
        rows = []
        lse_rows = []
        for i in range(lq):
            if not bool(keep[i].any()):
                rows.append(torch.zeros(d, dtype=torch.float64))
                lse_rows.append(torch.tensor(math.inf, dtype=torch.float64))
                continue
            weights = torch.softmax(scores[i], dim=0)
            rows.append(weights @ v[:, g])
            lse_rows.append(torch.logsumexp(scores[i], dim=0))
        outs.append(torch.stack(rows) if rows else torch.zeros(0, d, dtype=torch.float64))
        lses.append(torch.stack(lse_rows) if lse_rows else torch.zeros(0, dtype=torch.float64))
    return torch.stack(outs, dim=1), torch.stack(lses)


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.shape == want.shape
    assert torch.isfinite(got.double()).all()
    err = (got.double() - want).abs().max().item() if want.numel() else 0.0
    bound = TOL[dtype] * (1.0 + (want.abs().max().item() if want.numel() else 0.0))
    assert err <= bound, f"max abs error {err:.3g} > {bound:.3g} ({dtype})"


def cu(lengths: list[int]) -> torch.Tensor:
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32)


@st.composite
def varlen_case(draw: st.DrawFn) -> dict[str, object]:
    n = draw(st.integers(1, 4))
    hk = draw(st.sampled_from([1, 2]))
    return {
        "lq": draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)),
        "lk": draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)),
        "hk": hk,
        "hq": hk * draw(st.sampled_from([1, 2, 3])),
        "d": draw(st.sampled_from([4, 8, 16])),
        "causal": draw(st.booleans()),
        "dtype": draw(DTYPES),
        "seed": draw(st.integers(0, 2**16)),
    }


def make_varlen(case: dict[str, object], same_k: bool = False) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(int(case["seed"]))  # type: ignore[call-overload]
    lq, lk = list(case["lq"]), list(case["lq"] if same_k else case["lk"])  # type: ignore[call-overload]
    hq, hk, d, dtype = case["hq"], case["hk"], case["d"], case["dtype"]
    q = torch.randn(sum(lq), hq, d, generator=gen).to(dtype)  # type: ignore[call-overload]
    k = torch.randn(sum(lk), hk, d, generator=gen).to(dtype)  # type: ignore[call-overload]
    v = torch.randn(sum(lk), hk, d, generator=gen).to(dtype)  # type: ignore[call-overload]
    return q, k, v, lq, lk  # type: ignore[return-value]


def ref_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lq: list[int], lk: list[int], causal: bool):  # type: ignore[no-untyped-def]
    outs = []
    for qi, ki, vi in zip(q.split(lq), k.split(lk), v.split(lk), strict=True):
        outs.append(ref_attention(qi, ki, vi, causal)[0])
    return torch.cat(outs)


# ---- varlen ---------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(case=varlen_case())
def test_varlen_matches_reference_on_random_packs(fa: ModuleType, case: dict[str, object]) -> None:
    q, k, v, lq, lk = make_varlen(case)
    out = fa.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu(lq), cu_seqlens_k=cu(lk), max_seqlen_q=max(lq), max_seqlen_k=max(lk),
        causal=case["causal"],
    )
    assert out.dtype == q.dtype and out.shape == q.shape and out.is_contiguous()
    assert_close(out, ref_varlen(q, k, v, lq, lk, bool(case["causal"])), q.dtype)


@settings(max_examples=20, deadline=None)
@given(case=varlen_case())
def test_varlen_same_lengths_and_scale(fa: ModuleType, case: dict[str, object]) -> None:
    # Equal lengths take the batched path of the stand-in; the ViT calls it with q and k of one pack.
    case = dict(case, lq=[max(1, case["lq"][0])] * len(case["lq"]))  # type: ignore[index]
    q, k, v, lq, lk = make_varlen(case, same_k=True)
    out = fa.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk), softmax_scale=0.3,
                                    causal=case["causal"])
    want = torch.cat([ref_attention(a, b, c, bool(case["causal"]), 0.3)[0]
                      for a, b, c in zip(q.split(lq), k.split(lk), v.split(lk), strict=True)])
    assert_close(out, want, q.dtype)


@settings(max_examples=15, deadline=None)
@given(case=varlen_case())
def test_varlen_gradients_match_reference(fa: ModuleType, case: dict[str, object]) -> None:
    case = dict(case, dtype=torch.float32)
    q, k, v, lq, lk = make_varlen(case)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref_leaves = [t.double().clone().requires_grad_(True) for t in (q, k, v)]
    out = fa.flash_attn_varlen_func(*leaves, cu(lq), cu(lk), max(lq), max(lk), causal=case["causal"])
    want = ref_varlen(*ref_leaves, lq, lk, bool(case["causal"]))
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert out.requires_grad
    (out.double() * weight).sum().backward()
    if want.requires_grad:
        (want * weight).sum().backward()
    for got, ref in zip(leaves, ref_leaves, strict=True):
        assert got.grad is not None
        assert_close(got.grad, ref.grad if ref.grad is not None else torch.zeros_like(ref), torch.float32)


def test_causal_mask_is_bottom_right_as_documented(fa: ModuleType) -> None:
    # flash_attn's docstring: seqlen_q=2, seqlen_k=5 keeps [1 1 1 1 0; 1 1 1 1 1]; seqlen_q=5, seqlen_k=2 keeps
    # [0 0; 0 0; 0 0; 1 0; 1 1], and a row that keeps nothing is zero. Equal scores + one-hot values read it back.
    for lq, lk, keep in [
        (2, 5, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
        (5, 2, [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]),
    ]:
        q = torch.zeros(lq, 1, lk)
        k = torch.zeros(lk, 1, lk)
        v = torch.eye(lk).reshape(lk, 1, lk)
        out = fa.flash_attn_varlen_func(q, k, v, cu([lq]), cu([lk]), lq, lk, causal=True)[:, 0]
        mask = torch.tensor(keep, dtype=torch.float32)
        want = mask / mask.sum(dim=1, keepdim=True).clamp(min=1)
        assert torch.allclose(out, want, atol=1e-6), (lq, lk, out)


def test_gqa_maps_consecutive_q_heads_to_one_kv_head(fa: ModuleType) -> None:
    # 6 q heads over 2 kv heads: heads 0-2 read kv head 0, heads 3-5 kv head 1 (flash_attn's docstring).
    v = torch.stack([torch.full((3, 4), 1.0), torch.full((3, 4), 2.0)], dim=1)
    out = fa.flash_attn_varlen_func(torch.randn(3, 6, 4), torch.randn(3, 2, 4), v, cu([3]), cu([3]), 3, 3)
    assert torch.allclose(out[:, :3], torch.ones(3, 3, 4)) and torch.allclose(out[:, 3:], torch.full((3, 3, 4), 2.0))


def test_several_sequences_do_not_see_each_other(fa: ModuleType) -> None:
    # Sequence 1's values are huge: any leak into sequence 0 or 2 would show.
    lq, lk = [3, 1, 4], [5, 1, 4]
    k = torch.randn(sum(lk), 2, 8)
    v = torch.randn(sum(lk), 2, 8)
    v[5:6] = 1e4
    out = fa.flash_attn_varlen_func(torch.randn(sum(lq), 2, 8), k, v, cu(lq), cu(lk), 4, 5, causal=True)
    assert out[:3].abs().max() < 10 and out[4:].abs().max() < 10 and out[3].abs().min() > 1e3


# ---- flash_attn_with_kvcache ----------------------------------------------------------------------------


@st.composite
def cache_case(draw: st.DrawFn) -> dict[str, object]:
    rows = draw(st.integers(1, 5))
    batch = draw(st.integers(1, rows))
    hk = draw(st.sampled_from([1, 2]))
    return {
        "rows": rows,
        "batch": batch,
        "cache_len": draw(st.integers(4, 12)),
        "lnew": draw(st.integers(0, 4)),
        "hk": hk,
        "hq": hk * draw(st.sampled_from([1, 2, 4])),
        "d": draw(st.sampled_from([4, 8])),
        "causal": draw(st.booleans()),
        "dtype": draw(DTYPES),
        "use_index": draw(st.booleans()),
        "perm": draw(st.permutations(list(range(rows)))),
        "fill": draw(st.lists(st.integers(0, 12), min_size=batch, max_size=batch)),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=60, deadline=None)
@given(case=cache_case())
def test_kvcache_writes_in_place_and_attends(fa: ModuleType, case: dict[str, object]) -> None:
    rows, batch, cache_len = int(case["rows"]), int(case["batch"]), int(case["cache_len"])  # type: ignore[call-overload]
    lnew, hq, hk, d = int(case["lnew"]), int(case["hq"]), int(case["hk"]), int(case["d"])  # type: ignore[call-overload]
    dtype, causal = case["dtype"], bool(case["causal"])
    gen = torch.Generator().manual_seed(int(case["seed"]))  # type: ignore[call-overload]
    k_cache = torch.randn(rows, cache_len, hk, d, generator=gen).to(dtype)  # type: ignore[call-overload]
    v_cache = torch.randn(rows, cache_len, hk, d, generator=gen).to(dtype)  # type: ignore[call-overload]
    q = torch.randn(batch, max(lnew, 1), hq, d, generator=gen).to(dtype)  # type: ignore[call-overload]
    k_new = torch.randn(batch, lnew, hk, d, generator=gen).to(dtype)  # type: ignore[call-overload]
    v_new = torch.randn(batch, lnew, hk, d, generator=gen).to(dtype)  # type: ignore[call-overload]
    idx = list(case["perm"])[:batch] if case["use_index"] else list(range(batch))  # type: ignore[call-overload]
    seqlens = [min(f, cache_len - lnew) for f in case["fill"]]  # type: ignore[attr-defined]
    before_k, before_v = k_cache.clone(), v_cache.clone()
    out = fa.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k_new, v=v_new,
        cache_seqlens=torch.tensor(seqlens, dtype=torch.int32),
        cache_batch_idx=torch.tensor(idx, dtype=torch.int32) if case["use_index"] else None,
        causal=causal,
    )
    assert out.shape == q.shape and out.dtype == dtype
    expect_k, expect_v = before_k.clone(), before_v.clone()
    for b, (row, s) in enumerate(zip(idx, seqlens, strict=True)):
        expect_k[row, s : s + lnew] = k_new[b]
        expect_v[row, s : s + lnew] = v_new[b]
    # The new tokens sit exactly at cache_seqlens; every other cache entry is untouched, bit for bit.
    assert torch.equal(k_cache, expect_k) and torch.equal(v_cache, expect_v)
    for b, (row, s) in enumerate(zip(idx, seqlens, strict=True)):
        keys = torch.cat([before_k[row, :s], k_new[b]])
        values = torch.cat([before_v[row, :s], v_new[b]])
        assert_close(out[b], ref_attention(q[b], keys, values, causal)[0], dtype)  # type: ignore[arg-type]


@settings(max_examples=30, deadline=None)
@given(case=cache_case())
def test_kvcache_read_only_and_softmax_lse(fa: ModuleType, case: dict[str, object]) -> None:
    rows, batch, cache_len = int(case["rows"]), int(case["batch"]), int(case["cache_len"])  # type: ignore[call-overload]
    hq, hk, d, causal = int(case["hq"]), int(case["hk"]), int(case["d"]), bool(case["causal"])  # type: ignore[call-overload]
    gen = torch.Generator().manual_seed(int(case["seed"]))  # type: ignore[call-overload]
    k_cache = torch.randn(rows, cache_len, hk, d, generator=gen)
    v_cache = torch.randn(rows, cache_len, hk, d, generator=gen)
    q = torch.randn(batch, 3, hq, d, generator=gen)
    seqlens = [min(f, cache_len) for f in case["fill"]]  # type: ignore[attr-defined]
    before = k_cache.clone()
    out, lse = fa.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(seqlens, dtype=torch.int32), causal=causal,
        return_softmax_lse=True,
    )
    assert torch.equal(k_cache, before)
    assert lse.shape == (batch, hq, 3) and lse.dtype == torch.float32
    for b, s in enumerate(seqlens):
        want, want_lse = ref_attention(q[b], k_cache[b, :s], v_cache[b, :s], causal)
        assert_close(out[b], want, torch.float32)
        finite = torch.isfinite(want_lse)
        assert torch.equal(torch.isfinite(lse[b]), finite)
        assert torch.allclose(lse[b][finite].double(), want_lse[finite], atol=1e-4)


def test_kvcache_int_seqlens_and_default_full_cache(fa: ModuleType) -> None:
    k_cache, v_cache = torch.randn(2, 6, 1, 4), torch.randn(2, 6, 1, 4)
    q = torch.randn(2, 1, 2, 4)
    full = fa.flash_attn_with_kvcache(q, k_cache, v_cache)
    as_int = fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=6)
    assert torch.equal(full, as_int)
    for b in range(2):
        assert_close(full[b], ref_attention(q[b], k_cache[b], v_cache[b], False)[0], torch.float32)


def test_kvcache_under_inference_mode_and_no_grad(fa: ModuleType) -> None:
    with torch.inference_mode():
        k_cache, v_cache = torch.zeros(1, 4, 1, 4), torch.zeros(1, 4, 1, 4)
        fa.flash_attn_with_kvcache(torch.randn(1, 1, 1, 4), k_cache, v_cache, k=torch.ones(1, 1, 1, 4),
                                   v=torch.ones(1, 1, 1, 4), cache_seqlens=torch.tensor([2], dtype=torch.int32))
        assert k_cache[0, 2].eq(1).all() and k_cache[0, :2].eq(0).all() and k_cache[0, 3].eq(0).all()
    q = torch.randn(1, 1, 1, 4, requires_grad=True)
    out = fa.flash_attn_with_kvcache(q, torch.randn(1, 4, 1, 4), torch.randn(1, 4, 1, 4), causal=True)
    assert not out.requires_grad  # flash_attn_with_kvcache has no backward


# ---- refusals and the surface ---------------------------------------------------------------------------


def _varlen_args() -> tuple[torch.Tensor, ...]:
    return torch.randn(4, 2, 8), torch.randn(4, 2, 8), torch.randn(4, 2, 8), cu([4]), cu([4])


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"dropout_p": 0.1}, "dropout_p=0.1"),
        ({"window_size": (4, 0)}, "window_size=(4, 0)"),
        ({"alibi_slopes": torch.ones(2)}, "alibi_slopes"),
        ({"return_attn_probs": True}, "return_attn_probs"),
        ({"block_table": torch.zeros(1, 1, dtype=torch.int32)}, "block_table"),
    ],
)
def test_varlen_refuses_what_it_does_not_implement(fa: ModuleType, kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(fa.StandInUnsupported, match=r"stand-in \(rehearsal\): .*" + words.replace("(", r"\(")
                       .replace(")", r"\)")) as err:
        fa.flash_attn_varlen_func(*_varlen_args(), 4, 4, **kwargs)
    assert "\n" not in str(err.value)
    with pytest.raises(fa.StandInUnsupported):
        fa.flash_attn_func(torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8),
                           **{k: v for k, v in kwargs.items() if k != "block_table"} or {"dropout_p": 0.5})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rotary_cos": torch.ones(4, 2), "rotary_sin": torch.ones(4, 2)},
        {"window_size": (2, 2)},
        {"alibi_slopes": torch.ones(2)},
        {"block_table": torch.zeros(1, 1, dtype=torch.int32)},
        {"k": torch.randn(1, 1, 2, 8), "v": torch.randn(1, 1, 2, 8)},  # new tokens but no cache_seqlens
    ],
)
def test_kvcache_refuses_what_it_does_not_implement(fa: ModuleType, kwargs: dict[str, object]) -> None:
    k_cache, v_cache = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)
    before = k_cache.clone()
    with pytest.raises(fa.StandInUnsupported):
        fa.flash_attn_with_kvcache(torch.randn(1, 1, 2, 8), k_cache, v_cache, **kwargs)
    assert torch.equal(k_cache, before)


def test_malformed_inputs_are_errors(fa: ModuleType) -> None:
    q, k, v, cq, ck = _varlen_args()
    with pytest.raises(ValueError, match="int32"):
        fa.flash_attn_varlen_func(q, k, v, cq.long(), ck, 4, 4)
    with pytest.raises(ValueError, match="max_seqlen"):
        fa.flash_attn_varlen_func(q, k, v, cq, ck, 3, 4)
    with pytest.raises(ValueError, match="divisible"):
        fa.flash_attn_varlen_func(torch.randn(4, 3, 8), k, v, cq, ck, 4, 4)
    with pytest.raises(ValueError, match="dtype"):
        fa.flash_attn_varlen_func(q.double(), k.double(), v.double(), cq, ck, 4, 4)
    with pytest.raises(ValueError, match="holds 4 tokens"):
        fa.flash_attn_varlen_func(q, k, v, cu([3]), ck, 4, 4)
    k_cache, v_cache = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)
    before = k_cache.clone()
    with pytest.raises(ValueError, match="exceed the cache"):
        fa.flash_attn_with_kvcache(torch.randn(1, 2, 2, 8), k_cache, v_cache, k=torch.randn(1, 2, 2, 8),
                                   v=torch.randn(1, 2, 2, 8), cache_seqlens=torch.tensor([3], dtype=torch.int32))
    assert torch.equal(k_cache, before)  # refused before any write


def test_signatures_are_flash_attn_2_5_8(fa: ModuleType) -> None:
    params = {name: list(inspect.signature(getattr(fa, name)).parameters) for name in
              ("flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_func")}
    assert params["flash_attn_varlen_func"] == [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "dropout_p",
        "softmax_scale", "causal", "window_size", "alibi_slopes", "deterministic", "return_attn_probs",
        "block_table",
    ]
    assert params["flash_attn_with_kvcache"] == [
        "q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
        "block_table", "softmax_scale", "causal", "window_size", "rotary_interleaved", "alibi_slopes",
        "num_splits", "return_softmax_lse",
    ]
    assert params["flash_attn_func"] == [
        "q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size", "alibi_slopes", "deterministic",
        "return_attn_probs",
    ]


def test_flash_attn_func_and_bert_padding(fa: ModuleType) -> None:
    from flash_attn.bert_padding import index_first_axis, pad_input, unpad_input

    q, k, v = torch.randn(2, 5, 4, 8), torch.randn(2, 3, 2, 8), torch.randn(2, 3, 2, 8)
    out = fa.flash_attn_func(q, k, v, causal=True)
    for b in range(2):
        assert_close(out[b], ref_attention(q[b], k[b], v[b], True)[0], torch.float32)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    flat, indices, cu_seqlens, max_len = unpad_input(q, mask)
    assert flat.shape == (6, 4, 8) and cu_seqlens.tolist() == [0, 2, 6] and max_len == 4
    assert cu_seqlens.dtype == torch.int32 and torch.equal(index_first_axis(q.reshape(10, 4, 8), indices), flat)
    back = pad_input(flat, indices, 2, 5)
    assert torch.equal(back[mask], q[mask]) and back[~mask].eq(0).all()


def test_deterministic_backward_repeats_bit_for_bit(fa: ModuleType) -> None:
    q, k, v, cq, ck = _varlen_args()
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        fa.flash_attn_varlen_func(*leaves, cq, ck, 4, 4, causal=True, deterministic=True).square().sum().backward()
        grads.append([t.grad for t in leaves])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_only_importable_from_the_shim_folder(repo: Path) -> None:
    probe = (
        "import importlib.util, importlib.metadata, json; s = importlib.util.find_spec('flash_attn');"
        "print(json.dumps([s.origin if s else None, importlib.metadata.version('flash_attn') if s else None]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    plain = subprocess.run([sys.executable, "-c", probe], cwd=repo, env=env, capture_output=True, text=True,
                           check=True).stdout
    assert str(SHIM) not in plain  # the project's own sys.path never offers the stand-in
    shimmed = subprocess.run([sys.executable, "-c", probe], cwd=repo, env={**env, "PYTHONPATH": str(SHIM)},
                             capture_output=True, text=True, check=True).stdout
    assert str(SHIM / "flash_attn" / "__init__.py") in shimmed and "2.5.8+rehearsal.sdpa" in shimmed


@pytest.mark.cuda
def test_varlen_and_kvcache_on_cuda(fa: ModuleType) -> None:
    gen = torch.Generator().manual_seed(0)
    lq, lk = [3, 7, 1], [5, 7, 4]
    q = torch.randn(sum(lq), 4, 64, generator=gen).bfloat16()
    k = torch.randn(sum(lk), 2, 64, generator=gen).bfloat16()
    v = torch.randn(sum(lk), 2, 64, generator=gen).bfloat16()
    out = fa.flash_attn_varlen_func(q.cuda(), k.cuda(), v.cuda(), cu(lq).cuda(), cu(lk).cuda(), 7, 7, causal=True)
    assert_close(out.cpu(), ref_varlen(q, k, v, lq, lk, True), torch.bfloat16)
    k_cache = torch.zeros(3, 8, 2, 64, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    new = torch.randn(2, 2, 2, 64, generator=gen).bfloat16()
    res = fa.flash_attn_with_kvcache(
        q[:4].reshape(2, 2, 4, 64).cuda(), k_cache, v_cache, k=new.cuda(), v=new.cuda(),
        cache_seqlens=torch.tensor([1, 3], dtype=torch.int32, device="cuda"),
        cache_batch_idx=torch.tensor([2, 0], dtype=torch.int32, device="cuda"), causal=True,
    )
    assert res.shape == (2, 2, 4, 64) and torch.equal(k_cache[2, 1:3].cpu(), new[0]) and k_cache[1].eq(0).all()
