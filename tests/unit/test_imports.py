"""The project's own import graph, read with ast: no cycle, and every arrow points down the layers of STYLE.md.

protocol <- manifests <- ledger <- orchestrator, and protocol, manifests <- workers; nothing imports orchestrator,
and the CPU side never imports workers (they run as subprocesses). Inside ledger: cost <- verdict <- files. Inside
orchestrator: isolation, lock, slurm, init <- run <- cli (docs/DESIGN.md's table of rooms).
Function-level and TYPE_CHECKING imports count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "manifests", "ledger", "orchestrator", "workers")
# what each top-level package may import (itself included)
ALLOWED = {
    "protocol": {"protocol"},
    "manifests": {"protocol", "manifests"},
    "ledger": {"protocol", "manifests", "ledger"},
    "workers": {"protocol", "manifests", "workers"},
    "orchestrator": {"protocol", "manifests", "ledger", "orchestrator"},
}


# inside ledger, what each family may import of the ledger (ledger.render and the package itself are shared)
LEDGER_ALLOWED = {
    "cost": {"cost"},
    "verdict": {"cost", "verdict"},
    "files": {"cost", "verdict", "files"},
}


# inside orchestrator, what each room may import of orchestrator (docs/DESIGN.md, Architecture)
ORCHESTRATOR_ALLOWED = {
    "isolation": {"isolation"},
    "lock": {"lock"},
    "slurm": {"slurm"},
    "init": {"init"},
    "run": {"isolation", "lock", "slurm", "init", "run"},
    "cli": {"isolation", "lock", "slurm", "init", "run", "cli"},
}


def _family(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "ledger" and len(parts) > 2 and parts[1] in LEDGER_ALLOWED else None


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "shim" not in path.relative_to(REPO).parts:  # the rehearsal's stand-ins for third-party packages
                out[_module_name(path)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (a `from pkg import name` of a submodule names the submodule)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges: set[str] = set()
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_imports_it_must_judge() -> None:
    graph = import_graph()
    assert "ledger.cost.store" in graph["ledger.verdict.documents.audit"]
    assert "protocol.hashing" in graph["manifests.core"]
    assert "workers.rank.digest_triton" in graph["workers.rank.digest"]  # a function-level import is an edge
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_no_upward_import() -> None:
    upward = sorted(
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if dst.split(".")[0] not in ALLOWED[src.split(".")[0]]
    )
    assert upward == []


def test_ledger_families_point_one_way() -> None:
    against = sorted(
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if (family := _family(src)) is not None
        and dst.startswith("ledger.")
        and (_family(dst) or "shared") not in LEDGER_ALLOWED[family] | {"shared"}
    )
    assert against == []


def test_orchestrator_rooms_point_one_way() -> None:
    graph = import_graph()
    rooms = {name.split(".")[1] for name in graph if name.startswith("orchestrator.") and name.count(".") == 1}
    assert rooms == set(ORCHESTRATOR_ALLOWED)  # every module sits in a room; the package itself holds only the map
    against = sorted(
        f"{src} -> {dst}"
        for src, targets in graph.items()
        for dst in targets
        if src.startswith("orchestrator.") and dst.startswith("orchestrator.")
        and dst.split(".")[1] not in ORCHESTRATOR_ALLOWED[src.split(".")[1]]
    )
    assert against == []


def test_package_faces_import_nothing() -> None:
    """A package's __init__ imports none of the project: a module importing a sibling never runs through its face into
    other siblings (the circle ledger.verdict.stats -> ledger.verdict -> ledger.verdict.decision -> stats)."""
    faces = {name: path for name, path in modules().items() if path.name == "__init__.py"}
    assert "ledger.verdict" in faces and "orchestrator.isolation" in faces
    graph = import_graph()
    assert {name: sorted(graph[name]) for name in faces if graph[name]} == {}
