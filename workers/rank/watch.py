"""The probe's forbidden-dtype watch: what it sees (tensor ops, higher-order operators and their subgraphs, the
graphs torch.compile hands its backend) and what it says it could not see. Which steps it covers is probe.py's.
"""

from __future__ import annotations

import functools
import importlib.util
import operator
import os
import sys
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workers.rank.after_import import AfterImport

FORBIDDEN_MM = ("mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "dot", "conv")
INT8_OPS = ("_int_mm", "_weight_int8pack_mm", "_weight_int4pack_mm", "_scaled_mm", "_scaled_grouped_mm")
_HOOKED = "_orch_watch_hooked"


def forbidden_dtype(dtype: Any) -> bool:
    import torch

    name = str(dtype)
    return dtype == torch.float16 or "float8" in name or name.startswith("torch.qu") or name.startswith("torch.qi")


def _int8_math(base: str, dtype: Any) -> bool:
    import torch

    return dtype in (torch.int8, torch.uint8) and (base in INT8_OPS or base.startswith(FORBIDDEN_MM))


def _dt(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class WatchLog:
    """What the watch saw since the last take(): forbidden (op, dtype) pairs, the higher-order operators and
    compiled regions it let through (with counts), and, in words, what it could not look into."""

    forbidden: set[tuple[str, str]] = field(default_factory=set)
    hops: Counter[str] = field(default_factory=Counter)
    uninspected: set[str] = field(default_factory=set)

    def take(self) -> tuple[list[tuple[str, str]], dict[str, int], list[str]]:
        out = sorted(self.forbidden), dict(sorted(self.hops.items())), sorted(self.uninspected)
        self.forbidden.clear()
        self.hops.clear()
        self.uninspected.clear()
        return out


@dataclass(frozen=True)
class GraphFindings:
    forbidden: frozenset[tuple[str, str]]
    uninspected: frozenset[str]
    nodes: int


def _target_name(node: Any) -> str:
    from torch._ops import HigherOrderOperator, OpOverload

    t = node.target
    if isinstance(t, HigherOrderOperator):
        return f"higher_order.{t.name()}"
    if isinstance(t, OpOverload) or node.op in ("call_method", "call_module", "get_attr", "placeholder", "output"):
        return str(t)
    return str(getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or t)


def _submodule(gm: Any, dotted: str) -> Any:
    obj = gm
    for part in str(dotted).split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def graph_findings(gm: Any, label: str) -> GraphFindings:
    """Forbidden dtypes in an FX graph: every node's value dtypes (meta 'val' / 'example_value' / 'tensor_meta'),
    dtype constants in node arguments (casts such as `.to(torch.float16)`), int8 matmul-type nodes; subgraphs
    (get_attr / call_module GraphModules, e.g. flex_attention's score_mod and mask_mod) recursively."""
    import torch
    from torch.utils._pytree import tree_leaves

    forbidden: set[tuple[str, str]] = set()
    uninspected: set[str] = set()
    seen: set[int] = set()
    count = 0

    def value_dtypes(node: Any) -> list[Any]:
        vals = [node.meta.get(k) for k in ("val", "example_value", "tensor_meta") if node.meta.get(k) is not None]
        return [v.dtype for v in tree_leaves(vals) if isinstance(getattr(v, "dtype", None), torch.dtype)]

    def walk(g: Any, where: str) -> None:
        nonlocal count
        if id(g) in seen:
            return
        seen.add(id(g))
        typed = untyped = 0
        for node in g.graph.nodes:
            count += 1
            if node.op in ("get_attr", "call_module"):
                sub = _submodule(g, node.target)
                if isinstance(sub, torch.fx.GraphModule):
                    walk(sub, f"{where}/{node.target}")
            # an op is judged by what it computes on: its own value and its arguments (placeholders and
            # outputs are only the edges of the graph, getitem only unpacks)
            if node.op not in ("call_function", "call_method", "call_module") or node.target is operator.getitem:
                continue
            name = _target_name(node)
            base = name.split(".")[1] if name.startswith("aten.") else name
            dtypes = value_dtypes(node)
            typed, untyped = (typed + 1, untyped) if dtypes else (typed, untyped + 1)
            for leaf in tree_leaves((node.args, node.kwargs)):
                if isinstance(leaf, torch.dtype):
                    dtypes.append(leaf)  # a cast, e.g. .to(torch.float16)
                elif isinstance(leaf, torch.fx.Node):
                    dtypes += value_dtypes(leaf)
            for d in dtypes:
                if forbidden_dtype(d) or _int8_math(base, d):
                    forbidden.add((f"{where}:{name}", _dt(d)))
        if untyped and not typed:
            uninspected.add(f"{where}: graph without dtype metadata (only dtype constants in its calls inspected)")

    walk(gm, label)
    return GraphFindings(frozenset(forbidden), frozenset(uninspected), count)


_GRAPH_CACHE: weakref.WeakKeyDictionary[Any, dict[str, GraphFindings]] = weakref.WeakKeyDictionary()


def _cached_findings(gm: Any, label: str) -> GraphFindings:
    per = _GRAPH_CACHE.setdefault(gm, {})
    if label not in per:
        per[label] = graph_findings(gm, label)
    return per[label]


_OPS: dict[Any, tuple[str, str]] = {}  # an ATen op -> (its name, the base name _int8_math reads)
_VERDICTS: dict[tuple[str, Any], bool] = {}  # (base, dtype) -> forbidden_dtype(dtype) or _int8_math(base, dtype)


def see_op(log: WatchLog, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """An ATen op: a float16 / float8 / quantized tensor among its inputs or outputs, or int8 matmul-type math.

    It runs for every op of a watched step, so what depends only on the op or on (op, dtype) is worked out once per
    process, and the tensors are found by walking the lists, tuples and dicts that ATen's arguments and results are
    made of (what tree_leaves would find in them, without its per-call cost)."""
    import torch

    names = _OPS.get(func)
    if names is None:
        op = str(func)
        names = _OPS[func] = (op, op.split(".")[1] if op.startswith("aten.") else op)
    op, base = names
    pending = [args, kwargs, out]
    while pending:
        x = pending.pop()
        if isinstance(x, torch.Tensor):
            key = (base, x.dtype)
            bad = _VERDICTS.get(key)
            if bad is None:
                bad = _VERDICTS[key] = forbidden_dtype(x.dtype) or _int8_math(base, x.dtype)
            if bad:
                log.forbidden.add((op, _dt(x.dtype)))
        elif isinstance(x, (list, tuple)):
            pending.extend(x)
        elif isinstance(x, dict):
            pending.extend(x.values())


# higher-order operators that run code no FX graph describes: only their tensor inputs and outputs can be seen
OPAQUE_HOPS = {
    "inductor_compiled_code": "Inductor-generated code",
    "aoti_call_delegate": "an AOTInductor module",
    "executorch_call_delegate": "a delegated module",
    "inline_asm_elementwise": "inline assembly",
    "triton_kernel_wrapper_mutation": "a user Triton kernel",
    "triton_kernel_wrapper_functional": "a user Triton kernel",
}


def see_hop(log: WatchLog, hop: Any, args: Any, kwargs: Any, out: Any) -> None:
    """A higher-order operator the watch let through (it ran with the watch popped, so its inner ops were not
    dispatched to it): its tensor inputs and outputs, dtype constants among its arguments (out_dtype's), int8
    tensors into a matmul-type op it applies, and its subgraphs read statically."""
    import torch
    from torch.utils._pytree import tree_leaves

    name = f"higher_order.{hop.name()}"
    log.hops[name] += 1
    if hop.name() in OPAQUE_HOPS:
        log.uninspected.add(f"{name}: {OPAQUE_HOPS[hop.name()]} (only its tensor inputs and outputs were seen)")
    leaves = tree_leaves((args, kwargs, out))
    applied = [str(x).split(".")[1] for x in leaves if isinstance(x, torch._ops.OpOverload) and "." in str(x)]
    graphs = 0  # subgraphs are named by their order among the arguments: flex_attention's graph0 is score_mod
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if forbidden_dtype(leaf.dtype) or any(_int8_math(base, leaf.dtype) for base in applied):
                log.forbidden.add((name, _dt(leaf.dtype)))
        elif isinstance(leaf, torch.dtype):
            if forbidden_dtype(leaf):
                log.forbidden.add((name, _dt(leaf)))
        elif isinstance(leaf, torch.fx.GraphModule):
            found = _cached_findings(leaf, f"{name}/graph{graphs}")
            graphs += 1
            log.forbidden.update(found.forbidden)
            log.uninspected.update(found.uninspected)
        elif callable(leaf) and not isinstance(leaf, (type, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            what = getattr(leaf, "__qualname__", None) or type(leaf).__name__
            log.uninspected.add(f"{name}: Python callable argument {what} (not a graph: its ops were not seen)")


def make_watch(log: WatchLog, active: Callable[[], bool]) -> Any:
    """A TorchDispatchMode that records into `log` while `active()`; results pass through unchanged.

    Higher-order operators (flex_attention, cond, while_loop, invoke_subgraph, ...) reach __torch_dispatch__
    (`supports_higher_order_operators`) with the mode already popped: they run exactly as without the watch.
    `ignore_compile_internals`: torch.compile compiles and runs its artifacts as without the watch (otherwise
    Dynamo skips compiling under a dispatch mode and the watched steps would run other, eager kernels); the
    graphs it compiles are inspected by `inspect_compiled_graphs` instead.
    """
    from torch._ops import HigherOrderOperator
    from torch.utils._python_dispatch import TorchDispatchMode

    class _ForbiddenWatch(TorchDispatchMode):
        supports_higher_order_operators = True

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if active():
                if isinstance(func, HigherOrderOperator):
                    see_hop(log, func, args, kwargs, out)
                else:
                    see_op(log, func, args, kwargs, out)
            return out

    _ForbiddenWatch.__name__ = _ForbiddenWatch.__qualname__ = "ForbiddenWatch"
    return _ForbiddenWatch()


def inspect_compiled_graphs(
    log: WatchLog, active: Callable[[], bool], note: Callable[[str], None] | None = None
) -> str | None:
    """Have every graph Dynamo hands a backend read (not changed) by graph_findings, and each run of the compiled
    artifact counted in `log.hops` as `compiled:<file>:<function>` with those findings, while `active()`.

    The backend's generated kernels, and the backward of a compiled region, are not dispatched to the watch:
    each run says so in `log.uninspected`. Returns why the hook could not be installed, or None. Dynamo not yet
    imported: the hook goes in when it is (torch.compile imports it), and a reason it could not is given to `note`.
    """
    module = sys.modules.get("torch._dynamo.output_graph")
    if module is not None:
        return _hook_output_graph(module, log, active)
    try:
        found = importlib.util.find_spec("torch._dynamo") is not None
    except Exception as exc:  # a torch without Dynamo: nothing is compiled, nothing to inspect
        return f"torch._dynamo unavailable: {type(exc).__name__}"
    if not found:
        return "torch._dynamo unavailable: ModuleNotFoundError"

    def hook(imported: Any) -> None:
        why = _hook_output_graph(imported, log, active)
        if why is not None and note is not None:
            note(why)

    sys.meta_path.insert(0, AfterImport("torch._dynamo.output_graph", hook))
    return None


def _hook_output_graph(module: Any, log: WatchLog, active: Callable[[], bool]) -> str | None:
    output_graph = getattr(module, "OutputGraph", None)
    original = getattr(output_graph, "call_user_compiler", None)
    if output_graph is None or original is None:
        return "torch._dynamo OutputGraph.call_user_compiler not found: compiled graphs are not inspected"
    if getattr(original, _HOOKED, False):
        return None

    @functools.wraps(original)
    def call_user_compiler(self: Any, gm: Any, example_inputs: Any) -> Any:
        compiled = original(self, gm, example_inputs)
        try:
            co = getattr(self, "co_fields", {}) or {}
            label = f"compiled:{os.path.basename(str(co.get('co_filename', '?')))}:{co.get('co_name', '?')}"
            found = graph_findings(gm, label)
        except Exception as exc:  # inspection must never break the trainer's compile
            log.uninspected.add(f"compiled graph not inspected ({type(exc).__name__}: {exc})")
            return compiled
        return _counted(compiled, label, found, log, active)

    setattr(call_user_compiler, _HOOKED, True)
    output_graph.call_user_compiler = call_user_compiler
    return None


def _counted(compiled: Any, label: str, found: GraphFindings, log: WatchLog, active: Callable[[], bool]) -> Any:
    """The compiled artifact, called exactly as before; each call while active() is recorded."""
    import torch

    owner = getattr(compiled, "__self__", compiled)
    if isinstance(owner, torch.fx.GraphModule):
        return compiled  # an eager-backend graph: its ops run through the dispatcher and the watch sees them
    kernels = f"{label}: backend-generated kernels (inspected as the graph handed to the backend)"
    backward = f"{label}: backward of the compiled region (not inspected)"

    @functools.wraps(compiled)
    def run(*args: Any, **kwargs: Any) -> Any:
        if active():
            log.hops[label] += 1
            log.forbidden.update(found.forbidden)
            log.uninspected.update(found.uninspected)
            log.uninspected.add(kernels)
            if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
                log.uninspected.add(backward)
        return compiled(*args, **kwargs)

    return run
