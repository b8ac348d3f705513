"""A training script's command-line arguments, read statically (ast, nothing imported) for `orch init`: argparse's
add_argument calls, and the dataclasses handed to HfArgumentParser / TrlParser / a parse_args_into_dataclasses helper.

Dataclasses the script imports (transformers' TrainingArguments, TRL's configs) are named for workers.arg_fields.
`orch launch` uses the same reading to refuse a flag the parser does not take (orchestrator/init/script_check.py).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from protocol.errors import RefusedError

Literal_ = bool | int | float | str | None
# callables that turn a tuple of dataclasses into a parser (HfArgumentParser, TRL's TrlParser, R3-style helpers)
DATACLASS_PARSERS = ("HfArgumentParser", "TrlParser", "parse_args_into_dataclasses")
_KINDS = {"bool": "bool", "int": "int", "float": "float", "str": "str", "str2bool": "bool"}


@dataclass(frozen=True)
class ScriptArg:
    """One argument: its field (dest), flag, default (None: none, or not a literal), kind and where it is defined."""

    name: str
    flag: str
    default: Literal_
    has_default: bool
    kind: str  # bool | int | float | str | other
    origin: str  # "argparse", "dataclass NAME" (the script's own) or "library module.Class" (workers.arg_fields)
    defined_in: str = ""  # for library fields: the class that declares it


@dataclass
class ScriptArgs:
    """What the script's parsers take: its own arguments, the library dataclasses to introspect, names not found."""

    args: list[ScriptArg] = field(default_factory=list)
    library: dict[str, str] = field(default_factory=dict)  # dataclass name in the script -> "module:Class"
    unresolved: list[str] = field(default_factory=list)
    trainer: str | None = None  # the *Trainer class the script builds, if one
    options: set[str] = field(default_factory=set)  # every long option of its add_argument calls
    open: list[str] = field(default_factory=list)  # why the parser may take flags not read here (then none is refused)


def _literal(node: ast.expr | None) -> tuple[bool, Literal_]:
    if node is None:
        return False, None
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return True, None
    return (True, value) if isinstance(value, (bool, int, float, str)) or value is None else (True, None)


def _kind(annotation: ast.expr | None) -> str:
    if annotation is None:
        return "other"
    text = ast.unparse(annotation).replace("typing.", "")
    for wrap in ("Optional[", "Union["):
        if text.startswith(wrap):
            text = text[len(wrap):].rstrip("]").split(",")[0].strip()
    text = text.split("|")[0].strip()
    return _KINDS.get(text, "other")


def _is_dataclass(cls: ast.ClassDef) -> bool:
    for dec in cls.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if (isinstance(target, ast.Name) and target.id == "dataclass") or (
                isinstance(target, ast.Attribute) and target.attr == "dataclass"):
            return True
    return False


def _dataclass_fields(cls: ast.ClassDef) -> list[ScriptArg]:
    out = []
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        if "ClassVar" in ast.unparse(stmt.annotation):
            continue
        value = stmt.value
        has, default = _literal(value)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "field":
            kw = {k.arg: k.value for k in value.keywords}
            has, default = _literal(kw.get("default")) if "default" in kw else (
                ("default_factory" in kw), None)
        name = stmt.target.id
        out.append(ScriptArg(name, f"--{name}", default, has, _kind(stmt.annotation), f"dataclass {cls.name}"))
    return out


def _argparse_arg(call: ast.Call) -> ScriptArg | None:
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    longs = [f for f in flags if f.startswith("--")]
    if not longs:
        return None  # a positional argument or a short flag only: nothing orch could render
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    dest = kw.get("dest")
    name = dest.value if isinstance(dest, ast.Constant) and isinstance(dest.value, str) else (
        longs[0][2:].replace("-", "_"))
    action = kw.get("action")
    act = action.value if isinstance(action, ast.Constant) else None
    if act in ("store_true", "store_false"):
        return ScriptArg(name, longs[0], act == "store_false", True, "switch", "argparse")
    has, default = _literal(kw.get("default"))
    tp = kw.get("type")
    kind = _KINDS.get(tp.id, "other") if isinstance(tp, ast.Name) else ("str" if tp is None else "other")
    if kind == "str" and tp is None and isinstance(default, (bool, int, float)) and not isinstance(default, str):
        kind = type(default).__name__
    required = kw.get("required")
    if isinstance(required, ast.Constant) and required.value is True:
        has, default = False, None
    return ScriptArg(name, longs[0], default, has, kind, "argparse")


def _dotted(node: ast.expr, modules: dict[str, str], imported: dict[str, str]) -> str | None:
    """`module:Class` of a class named `Name` (from-imported) or `alias.Class` / `alias.sub.Class` (imported)."""
    if isinstance(node, ast.Name):
        return imported.get(node.id)
    if isinstance(node, ast.Attribute):
        parts: list[str] = []
        cur: ast.expr = node
        while isinstance(cur, ast.Attribute):
            parts.insert(0, cur.attr)
            cur = cur.value
        if isinstance(cur, ast.Name) and cur.id in modules:
            return f"{'.'.join([modules[cur.id], *parts[:-1]])}:{parts[-1]}"
    return None


def _parser_open(tree: ast.AST) -> list[str]:
    """Why the script's argparse parser may take flags that no literal add_argument of this file names."""
    why: list[str] = []
    parsers: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            f = node.value.func
            callee = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if callee.endswith("ArgumentParser") or callee in ("add_argument_group", "add_mutually_exclusive_group"):
                parsers |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        callee = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if callee in ("parse_known_args", "parse_known_intermixed_args", "add_subparsers"):
            why.append(f"it calls {callee}")
        elif callee == "add_argument" and any(not isinstance(a, ast.Constant) for a in node.args):
            why.append(f"an add_argument with a computed name (line {node.lineno})")
        elif callee.endswith("ArgumentParser") and "parents" in kw:
            why.append("a parser built on parent parsers")
        rest = kw.get("return_remaining_strings")
        if rest is not None and not (isinstance(rest, ast.Constant) and rest.value is False):
            why.append("it keeps unknown arguments (return_remaining_strings)")
        if callee not in ("add_argument", "add_argument_group", "add_mutually_exclusive_group") and any(
                isinstance(a, ast.Name) and a.id in parsers for a in [*node.args, *kw.values()]):
            why.append(f"its parser is handed to {callee or 'a call'} (line {node.lineno})")
    return why


def read_script(path: Path) -> ScriptArgs:
    """The arguments of the script at `path`; RefusedError when it cannot be read or parsed."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError) as err:
        raise RefusedError(f"{path}: cannot read the training script ({err}); give a Python file") from None
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef) and _is_dataclass(n)}
    imported: dict[str, str] = {}
    modules: dict[str, str] = {}  # `import transformers as tf` -> tf: transformers
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}:{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                modules[alias.asname or alias.name.partition(".")[0]] = alias.name if alias.asname else (
                    alias.name.partition(".")[0])
    found = ScriptArgs(open=_parser_open(tree))
    seen: set[str] = set()

    def add(arg: ScriptArg) -> None:
        if arg.name not in seen:
            seen.add(arg.name)
            found.args.append(arg)

    def add_dataclass(cls: ast.ClassDef, depth: int = 0) -> None:
        for base in cls.bases:  # inherited fields: a dataclass of this file, or a library class to introspect
            if isinstance(base, ast.Name) and base.id in classes and depth < 16:
                add_dataclass(classes[base.id], depth + 1)
            elif (spec := _dotted(base, modules, imported)) is not None:
                found.library[ast.unparse(base)] = spec
            elif not (isinstance(base, ast.Name) and base.id == "object"):
                found.unresolved.append(f"{cls.name}'s base {ast.unparse(base)}")
        for arg in _dataclass_fields(cls):
            add(arg)

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name.endswith("Trainer") and found.trainer is None and name != "Trainer":
            found.trainer = name
        elif name == "Trainer" and found.trainer is None:
            found.trainer = "Trainer"
        if name == "add_argument":
            found.options |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                              and a.value.startswith("--")}
            arg = _argparse_arg(node)
            if arg is not None:
                add(arg)
        if name in DATACLASS_PARSERS and node.args:
            first = node.args[0]
            items = first.elts if isinstance(first, (ast.Tuple, ast.List)) else [first]
            for item in items:
                if isinstance(item, ast.Name) and item.id in classes:
                    add_dataclass(classes[item.id])
                elif (spec := _dotted(item, modules, imported)) is not None:
                    found.library[ast.unparse(item)] = spec
                else:
                    found.unresolved.append(ast.unparse(item))
    return found
