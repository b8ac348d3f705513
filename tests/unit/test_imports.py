"""The project's own import graph, read with ast: no cycle, every arrow down the layers and rooms, no folder too full.

protocol <- manifests <- ledger <- orchestrator, and protocol, manifests <- workers; nothing imports orchestrator,
and the CPU side never imports workers (they run as subprocesses). Inside each package the rooms of docs/DESIGN.md's
table point one way: orchestrator's isolation, lock, slurm, init <- run <- cli; ledger's cost <- verdict <- files and
verdict's decide <- documents; workers' rank <- the entry points; protocol's host <- the contracts.
Function-level and TYPE_CHECKING imports count too; so does the package face that every import of a submodule runs.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from functools import cache
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
MAX_MODULES = 20  # per folder of orch's own code (issue 54)
MAX_ROOM_MODULES = 16  # per room of orchestrator/

# Rooms: inside a package, what each room may import of that package (itself included). A module that sits directly
# in the package (not in a room), and the package's face, belong to the room named by TOP[package].
ROOMS: dict[str, dict[str, set[str]]] = {
    # docs/DESIGN.md, Architecture
    "orchestrator": {
        "isolation": {"isolation"},
        "lock": {"lock"},
        "slurm": {"slurm"},
        "init": {"init"},
        "run": {"isolation", "lock", "slurm", "init", "run"},
        "cli": {"isolation", "lock", "slurm", "init", "run", "cli"},
        "face": set(),  # orchestrator/__init__.py draws the map and holds no code
    },
    # ledger.render and ledger.probe_cost are shared by the families
    "ledger": {
        "cost": {"cost", "shared"},
        "verdict": {"cost", "verdict", "shared"},
        "files": {"cost", "verdict", "files", "shared"},
        "shared": {"cost", "verdict", "files", "shared"},
    },
    "ledger.verdict": {
        "decide": {"decide"},
        "documents": {"decide", "documents"},
        "face": set(),
    },
    "workers": {
        "entry": {"entry", "rank"},  # the `python -m workers.KIND` modules and what they share
        "rank": {"rank"},
        "rehearsal": {"rehearsal"},
    },
    "protocol": {
        "contracts": {"contracts", "host"},
        "host": {"host"},
    },
}
TOP = {"orchestrator": "face", "ledger": "shared", "ledger.verdict": "face", "workers": "entry",
       "protocol": "contracts"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "shim" not in path.relative_to(REPO).parts:  # the rehearsal's stand-ins for third-party packages
                out[_module_name(path)] = path
    return out


def _package_of(name: str, path: Path) -> str:
    """The package a module's relative imports and its own face are read against."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(tree: ast.AST, package: str) -> list[tuple[str, list[str]]]:
    """(module imported from, names) of every import statement, relative ones resolved against `package`."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((base, [a.name for a in node.names]))
    return found


def import_graph(faces: bool = False) -> dict[str, set[str]]:
    """module -> the project modules it imports (a `from pkg import name` of a submodule names the submodule).
    faces: also the package faces each import runs first (importing a.b.c runs a/__init__ and a/b/__init__)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges: set[str] = set()
        for base, names in _imports(ast.parse(path.read_text(), str(path)), _package_of(name, path)):
            targets = [f"{base}.{n}" if f"{base}.{n}" in known else base for n in names] or [base]
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if faces and target:
                    parts = target.split(".")
                    edges.update(".".join(parts[:i]) for i in range(1, len(parts)))
                if target:
                    edges.add(target)
        graph[name] = edges - {name}
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
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
        for w in sorted(graph.get(v, ())):
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


def own_face_imports(name: str, source: str, is_face: bool = False) -> list[str]:
    """The imports of module `name` that read its own package's __init__ (`from pkg import x`, `import pkg`,
    `from . import x`): a submodule is reached by its own name, never through the package it sits in."""
    package = name if is_face else name.rpartition(".")[0]
    if is_face or not package:
        return []
    return [f"{name}: from {base} import {', '.join(names)}" if names else f"{name}: import {base}"
            for base, names in _imports(ast.parse(source), package) if base == package]


def room_of(module: str, package: str) -> str | None:
    """The room of `module` inside `package`: the sub-package it sits in (or is the face of), else TOP[package];
    None when it is outside the package."""
    if module == package:
        return TOP[package]
    if not module.startswith(package + "."):
        return None
    rest = module[len(package) + 1:].split(".")
    is_face = module in modules() and modules()[module].name == "__init__.py"
    return rest[0] if len(rest) > 1 or is_face else TOP[package]


def against_rooms(graph: Mapping[str, set[str]], package: str) -> list[str]:
    """Arrows between rooms of `package` that its ROOMS table does not allow."""
    out = []
    for src, targets in graph.items():
        if (mine := room_of(src, package)) is None:
            continue
        for dst in targets:
            theirs = room_of(dst, package)
            if theirs is not None and theirs not in ROOMS[package][mine]:
                out.append(f"{src} ({mine}) -> {dst} ({theirs})")
    return sorted(out)


def folder_counts() -> dict[str, int]:
    """Modules (.py files but __init__.py) per folder of orch's own code."""
    counts: dict[str, int] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path.name != "__init__.py" and "__pycache__" not in path.parts:
                folder = path.parent.relative_to(REPO).as_posix()
                counts[folder] = counts.get(folder, 0) + 1
    return counts


def test_the_graph_sees_the_imports_it_must_judge() -> None:
    graph = import_graph()
    assert "ledger.cost.store" in graph["ledger.verdict.documents.audit"]
    assert "protocol.hashing" in graph["manifests.core"]
    assert "workers.rank.digest_triton" in graph["workers.rank.digest"]  # a function-level import is an edge
    assert "ledger.verdict.decide.dist" in graph["ledger.verdict.decide.stats"]  # `import a.b.c as c` too
    # the runtime graph adds the package faces each import runs first
    runtime = import_graph(faces=True)
    assert {"ledger.verdict", "ledger.verdict.decide"} <= runtime["ledger.verdict.documents.audit"]
    # a face that imported its modules would close a circle: stats -> ledger.verdict -> (decision -> stats)
    assert "ledger.verdict" in runtime["ledger.verdict.decide.stats"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle() -> None:
    assert cycles(import_graph(faces=True)) == []


def test_no_upward_import() -> None:
    upward = sorted(
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if dst.split(".")[0] not in ALLOWED[src.split(".")[0]]
    )
    assert upward == []


def test_rooms_point_one_way() -> None:
    graph = import_graph()
    assert {package: against_rooms(graph, package) for package in ROOMS} == {package: [] for package in ROOMS}


def test_every_module_sits_in_a_known_room() -> None:
    rooms = {package: {room_of(name, package) for name in modules()} - {None} for package in ROOMS}
    unknown = {package: sorted(map(str, found - set(ROOMS[package]))) for package, found in rooms.items()}
    assert unknown == {package: [] for package in ROOMS}
    # orchestrator/ and ledger/verdict/ hold only their rooms and a face that draws the map
    for package in ("orchestrator", "ledger.verdict"):
        assert [n for n in modules() if room_of(n, package) == "face" and n != package] == []


def test_the_room_check_sees_an_arrow_against_the_table() -> None:
    graph = {"workers.rank.watch": {"workers.common"}, "workers.train": {"workers.rank.rank_end"},
             "ledger.verdict.decide.evidence": {"ledger.verdict.documents.audit"}}
    assert against_rooms(graph, "workers") == ["workers.rank.watch (rank) -> workers.common (entry)"]
    assert against_rooms(graph, "ledger.verdict") == [
        "ledger.verdict.decide.evidence (decide) -> ledger.verdict.documents.audit (documents)"]


def test_no_module_imports_its_own_package_face() -> None:
    found = [line for name, path in modules().items()
             for line in own_face_imports(name, path.read_text(), path.name == "__init__.py")]
    assert found == []


def test_the_face_check_sees_an_import_through_the_package() -> None:
    assert own_face_imports("a.b.stats", "from a.b import dist\nfrom . import x\nimport a.b\n") == [
        "a.b.stats: from a.b import dist", "a.b.stats: from a.b import x", "a.b.stats: import a.b"]
    assert own_face_imports("a.b.stats", "import a.b.dist as dist\nfrom a.b.dist import t\nfrom a import c\n") == []


def test_package_faces_import_nothing() -> None:
    """A package's __init__ imports none of the project: a module importing a sibling never runs through its face into
    other siblings (the circle ledger.verdict.stats -> ledger.verdict -> ledger.verdict.decision -> stats)."""
    faces = {name: path for name, path in modules().items() if path.name == "__init__.py"}
    assert {"ledger.verdict", "ledger.verdict.decide", "orchestrator.isolation", "workers.rank"} <= set(faces)
    graph = import_graph()
    assert {name: sorted(graph[name]) for name in faces if graph[name]} == {}


def test_no_folder_holds_too_many_modules() -> None:
    counts = folder_counts()
    assert {folder: n for folder, n in counts.items() if n > MAX_MODULES} == {}
    rooms = {room: sum(n for f, n in counts.items() if f"{f}/".startswith(f"orchestrator/{room}/"))
             for room in ROOMS["orchestrator"] if room != "face"}
    assert {room: n for room, n in rooms.items() if n > MAX_ROOM_MODULES} == {}
    assert {"protocol", "protocol/host", "workers", "workers/rank", "ledger/verdict/decide"} <= set(counts)
    assert all(rooms.values())


def _bench_graph(folder: Path) -> dict[str, set[str]]:
    """The scripts of one bench folder, which import each other by their bare names (the script's folder is first
    on sys.path)."""
    names = {p.stem for p in folder.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        found = _imports(ast.parse(path.read_text(), str(path)), "")
        graph[path.stem] = {base.split(".")[0] for base, _ in found if base.split(".")[0] in names} - {path.stem}
    return graph


def test_no_import_cycle_in_bench() -> None:
    graph = _bench_graph(REPO / "bench")
    assert {"bench": cycles(graph), "bench/attack": cycles(_bench_graph(REPO / "bench" / "attack"))} == {
        "bench": [], "bench/attack": []}
    assert "verdict_real" in graph["bench_verdict"]  # a function-level import is an edge here too
    assert "common" in _bench_graph(REPO / "bench" / "attack")["battery"]
