"""The fields of argument dataclasses a training script imports (transformers' TrainingArguments, TRL's configs), for
`orch init`: run in the user's training environment as a subprocess, since orch itself imports neither.

    python -m workers.arg_fields trl:GRPOConfig transformers:TrainingArguments    # one JSON document on stdout
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import json
import sys
import typing
from typing import Any

_KINDS = {bool: "bool", int: "int", float: "float", str: "str"}


def _kind(tp: Any) -> str:
    if tp in _KINDS:
        return _KINDS[tp]
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return _KINDS.get(args[0], "other") if len(args) == 1 else "other"


def _default(f: dataclasses.Field[Any]) -> tuple[bool, Any]:
    if f.default is dataclasses.MISSING:
        return False, None
    value = f.default
    if isinstance(value, (bool, int, float, str)) or value is None:
        return True, value
    if hasattr(value, "value") and isinstance(value.value, (int, float, str)):  # an Enum member
        return True, value.value
    return True, None


def describe(spec: str) -> dict[str, Any]:
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name)
    hints = typing.get_type_hints(cls)
    mro = [c for c in cls.__mro__ if c is not object]
    fields = []
    for f in dataclasses.fields(cls):
        owner = next((c for c in reversed(mro) if f.name in inspect.get_annotations(c)), cls)
        has_default, default = _default(f)
        fields.append({"name": f.name, "kind": _kind(hints.get(f.name)), "has_default": has_default,
                       "default": default, "defined_in": f"{owner.__module__}.{owner.__qualname__}"})
    top = module.partition(".")[0]
    versions = {}
    for dist in {top, "transformers", "trl"}:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"spec": spec, "class": f"{cls.__module__}.{cls.__qualname__}",
            "mro": [f"{c.__module__}.{c.__qualname__}" for c in mro], "versions": versions, "fields": fields}


def main(argv: list[str]) -> int:
    out = {}
    for spec in argv:
        try:
            out[spec] = describe(spec)
        except Exception as err:  # reported per class: orch init lists it as not importable
            out[spec] = {"error": f"{type(err).__name__}: {err}"}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
