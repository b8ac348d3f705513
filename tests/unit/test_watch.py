"""The forbidden-dtype watch and higher-order operators: flex_attention (eager, and compiled as upstream compiles
it) passes through with bit-identical results, and a float16 inside it (inputs, a score_mod cast) is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from workers.rank.watch import WatchLog, graph_findings, inspect_compiled_graphs, make_watch

REPO = Path(__file__).resolve().parents[2]
# as upstream modeling/bagel/qwen2_navit.py does at import: a module-level compiled flex_attention
compiled_flex = torch.compile(flex_attention)
S, H, KV, D = 256, 4, 2, 16


def causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
    return q >= kv


def half_score(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
    return score.to(torch.float16).to(score.dtype)  # a float16 round trip hidden in a score_mod


def qkv(dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4396)
    q = torch.randn(1, H, S, D, generator=g).to(dtype)
    k = torch.randn(1, KV, S, D, generator=g).to(dtype)
    v = torch.randn(1, KV, S, D, generator=g).to(dtype)
    return q, k, v


def block_mask() -> Any:
    # as upstream modeling/bagel/bagel.py builds it
    return create_block_mask(causal, B=1, H=H, Q_LEN=S, KV_LEN=S, device="cpu", BLOCK_SIZE=128, _compile=True)


def call(fn: Any, dtype: torch.dtype = torch.bfloat16, **kw: Any) -> torch.Tensor:
    q, k, v = qkv(dtype)
    out: torch.Tensor = fn(q, k, v, enable_gqa=True, block_mask=block_mask(), **kw)
    return out


@pytest.fixture(scope="module")
def unwatched() -> dict[str, torch.Tensor]:
    """Outputs with no watch and no compile hook installed yet (this module installs them afterwards)."""
    out = {
        "eager": call(flex_attention),
        "compiled": call(compiled_flex),
        "compiled_half_score": call(compiled_flex, score_mod=half_score),
    }
    torch._dynamo.reset()  # compiled again under the hook: the probe installs it before the trainer compiles
    return out


@pytest.fixture(scope="module")
def watch(unwatched: dict[str, torch.Tensor]) -> tuple[Any, WatchLog]:
    log = WatchLog()
    assert inspect_compiled_graphs(log, lambda: True) is None
    return make_watch(log, lambda: True), log


def test_eager_flex_attention_passes_through_bit_identical(unwatched: Any, watch: Any) -> None:
    mode, log = watch
    log.take()
    with mode:
        out = call(flex_attention)
    forbidden, hops, _ = log.take()
    assert torch.equal(out, unwatched["eager"])
    assert hops.get("higher_order.flex_attention") == 1 and forbidden == []


def test_compiled_flex_attention_stays_compiled_and_bit_identical(unwatched: Any, watch: Any) -> None:
    mode, log = watch
    log.take()
    with mode:
        out = call(compiled_flex)
        again = call(compiled_flex)
    forbidden, hops, uninspected = log.take()
    assert torch.equal(out, unwatched["compiled"]) and torch.equal(again, unwatched["compiled"])
    # compiled, not the eager fallback: eager flex_attention gives other bits for the same inputs
    assert not torch.equal(unwatched["eager"], unwatched["compiled"])
    region = "compiled:flex_attention.py:flex_attention"
    assert hops.get(region) == 2 and "higher_order.flex_attention" not in hops and forbidden == []
    assert f"{region}: backend-generated kernels (inspected as the graph handed to the backend)" in uninspected


def test_float16_inputs_are_named_eager_and_compiled(watch: Any) -> None:
    mode, log = watch
    log.take()
    with mode:
        call(flex_attention, torch.float16)
    assert ("higher_order.flex_attention", "float16") in log.take()[0]
    with mode:
        call(compiled_flex, torch.float16)
    forbidden = log.take()[0]
    assert ("compiled:flex_attention.py:flex_attention:higher_order.flex_attention", "float16") in forbidden


def test_score_mod_cast_to_float16_is_seen(unwatched: Any, watch: Any) -> None:
    mode, log = watch
    log.take()
    with mode:
        call(flex_attention, score_mod=half_score)
    assert ("higher_order.flex_attention/graph0:to", "float16") in log.take()[0]
    with mode:
        out = call(compiled_flex, score_mod=half_score)
    assert ("compiled:flex_attention.py:flex_attention/score_mod_0:to", "float16") in log.take()[0]
    assert torch.equal(out, unwatched["compiled_half_score"])


def test_inactive_watch_records_nothing_and_changes_nothing(unwatched: Any) -> None:
    log = WatchLog()
    with make_watch(log, lambda: False):
        out = call(compiled_flex, torch.float16)
        eager = call(flex_attention)
    assert log.take() == ([], {}, []) and torch.equal(eager, unwatched["eager"]) and out.dtype == torch.float16


def test_other_higher_order_operators_pass_through() -> None:
    """torch.cond (a HOP with two subgraphs) under the watch: same result; a float16 branch is seen statically."""
    log = WatchLog()
    x = torch.randn(4, 4)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t.half().float() * 2, lambda t: t - 1, (x,))

    want = f(x)
    with make_watch(log, lambda: True):
        got = f(x)
    forbidden, hops, _ = log.take()
    assert torch.equal(got, want) and hops.get("higher_order.cond") == 1
    assert any(op.startswith("higher_order.cond/graph0:") and dt == "float16" for op, dt in forbidden)


def test_out_dtype_int8_matmul_and_float16_output_are_seen() -> None:
    from torch._higher_order_ops.out_dtype import out_dtype

    log = WatchLog()
    a = torch.randint(-5, 5, (4, 4), dtype=torch.int8)
    want = out_dtype(torch.ops.aten.mm.default, torch.int32, a, a)
    with make_watch(log, lambda: True):
        got = out_dtype(torch.ops.aten.mm.default, torch.int32, a, a)
        out_dtype(torch.ops.aten.mm.default, torch.float16, a.float(), a.float())
    forbidden, hops, _ = log.take()
    assert torch.equal(got, want) and hops == {"higher_order.out_dtype": 2}
    assert {("higher_order.out_dtype", "int8"), ("higher_order.out_dtype", "float16")} <= set(forbidden)


def test_graph_findings_int8_matmul_and_untyped_graphs() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._int_mm(a, b)

    gm = torch.fx.symbolic_trace(f)  # no dtype metadata: only dtype constants could be seen
    found = graph_findings(gm, "g")
    assert found.forbidden == frozenset() and any("without dtype metadata" in u for u in found.uninspected)
    from torch.fx.experimental.proxy_tensor import make_fx

    typed = make_fx(f)(torch.zeros(32, 32, dtype=torch.int8), torch.zeros(32, 32, dtype=torch.int8))
    assert ("g:aten._int_mm.default", "int8") in graph_findings(typed, "g").forbidden


def _found_by_tree_leaves(func: Any, args: Any, kwargs: Any, out: Any) -> set[tuple[str, str]]:
    """see_op's definition: every tensor torch's pytree finds in the op's arguments and results."""
    from torch.utils._pytree import tree_leaves

    from workers.rank.watch import _int8_math, forbidden_dtype

    op = str(func)
    base = op.split(".")[1] if op.startswith("aten.") else op
    return {(op, str(t.dtype).removeprefix("torch.")) for t in tree_leaves((args, kwargs, out))
            if isinstance(t, torch.Tensor) and (forbidden_dtype(t.dtype) or _int8_math(base, t.dtype))}


def test_see_op_finds_what_tree_leaves_finds_in_nested_arguments_and_results() -> None:
    from workers.rank.watch import see_op

    f32, f16, bf16 = torch.ones(2), torch.ones(2, dtype=torch.float16), torch.ones(2, dtype=torch.bfloat16)
    i8, f8 = torch.ones(2, 2, dtype=torch.int8), torch.ones(2, dtype=torch.float8_e4m3fn)
    q = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)
    aten = torch.ops.aten
    cases = [
        (aten.add.Tensor, (f32, f32), {"alpha": 1}, f32),  # nothing
        (aten.add.Tensor, (bf16, bf16), {}, bf16),  # bfloat16 is allowed
        (aten.add.Tensor, (i8, i8), {}, i8),  # int8 outside matmul-type math is allowed
        (aten.mm.default, (i8, i8), {}, torch.ones(2, 2, dtype=torch.int32)),  # int8 matmul
        (aten._int_mm.default, (i8.to(torch.uint8), i8), {}, None),
        (aten.cat.default, ([f32, [f16, (f32,)]],), {}, f32),  # nested lists and tuples
        (aten.add.Tensor, (f32,), {"other": {"deep": [f8]}}, f32),  # a tensor in a dict of kwargs
        (aten.max.dim, (f32, 0), {}, torch.return_types.max((f16, torch.zeros(1, dtype=torch.int64)))),  # structseq
        (aten.dequantize.self, (q,), {}, f32),  # a quantized tensor
        (aten.add.Tensor, (f16, 2.0), {}, f16),  # the op's verdict for float16 is cached, and read again below
    ]
    for func, args, kwargs, out in [*cases, *cases]:  # twice: the second pass reads the per-process caches
        log = WatchLog()
        see_op(log, func, args, kwargs, out)
        assert log.forbidden == _found_by_tree_leaves(func, args, kwargs, out), (func, log.forbidden)
    log = WatchLog()
    see_op(log, aten.mm.default, (i8, i8), {}, None)
    assert log.forbidden == {("aten.mm.default", "int8")}
