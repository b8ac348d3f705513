"""What every worker entry point shares: reading the package spec strictly, writing its result, failing clearly.

A worker exits 0 with result.json written, or non-zero with one line on stderr saying why.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel

from protocol.hashing import canonical_json
from protocol.package import PackageSpec, parse_spec

R = TypeVar("R", bound=BaseModel)
# the probe's one line when a rank's trainer raises (time.time() when it was caught: the first failure is the cause)
RANK_FAILED = "probe: rank {rank} failed at {time:.6f}: {cause}"
RANK_FAILED_RE = r"^probe: rank (\d+) failed at ([0-9.]+): (.*)$"


class WorkerFailed(Exception):
    """A package failed: the message is the one line the worker prints before exiting 1."""


def load_spec(path: str | Path, kind: str) -> PackageSpec:
    try:
        spec = parse_spec(Path(path).read_bytes())
    except (OSError, ValueError) as exc:  # a ValidationError is a ValueError
        raise WorkerFailed(f"package spec {path} is not a valid orch.package/2 (or /1) document: {exc}") from exc
    if spec.kind != kind:
        raise WorkerFailed(f"package spec {path} is of kind {spec.kind!r}, this worker runs {kind!r}")
    return spec


def write_json(path: str | Path, doc: BaseModel | dict[str, Any], mode: int | None = None) -> None:
    """Atomic write: a reader never sees half a document."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(doc, BaseModel):
        text = doc.model_dump_json(by_alias=True, indent=1) + "\n"
    else:
        text = canonical_json(doc, ensure_ascii=True, pretty=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


def run_entry_point(
    kind: str, run: Callable[[PackageSpec], R], argv: list[str] | None
) -> tuple[PackageSpec, R]:
    """`python -m workers.<kind> --spec package.json`: validate the spec, run, write result.json atomically."""
    ap = argparse.ArgumentParser(prog=f"python -m workers.{kind}")
    ap.add_argument("--spec", required=True)
    opts = ap.parse_args(argv)
    try:
        spec = load_spec(opts.spec, kind)
        result = run(spec)
    except WorkerFailed as exc:
        fail(f"{kind}: {exc}")
    write_json(spec.result_path, result)
    return spec, result


def fail(message: str) -> NoReturn:
    sys.stderr.write(f"{message}\n")
    sys.stderr.flush()
    raise SystemExit(1)
