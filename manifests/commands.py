"""The `orch freeze`, `orch verify` and `orch schema` commands: one function each, called by the CLI.

Each prints for humans, returns its JSON document and raises protocol.errors types for refusals.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import typer

from manifests.core import Manifest, diff_manifests, hash_tree, load_manifest, write_text_atomic
from manifests.sources import arm_source_dir
from protocol.errors import RefusedError, UsageError
from protocol.plan import ARMS
from protocol.schema import json_schema, load_protocol


def repository_top(path: Path) -> Path | None:
    """The nearest folder at or above `path` holding `.git` (a work tree), or None."""
    here = path.resolve()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder
    return None


def _relative_root(tree: Path, near: Path) -> str | None:
    """`tree` relative to the repository holding `near`, when both are in it (what verify finds again)."""
    top = repository_top(near)
    if top is None:
        return None
    try:
        return tree.resolve().relative_to(top).as_posix()
    except ValueError:
        return None


def freeze_command(root: Path | None, include: list[str], protocol_path: Path | None, arm: str,
                   output: Path | None, fmt: str) -> dict[str, Any]:
    """Hash a tree (ROOT --include, or the sources of a protocol's arm) and write or print the manifest."""
    if fmt not in ("json", "sha256sum"):
        raise UsageError(f"--format {fmt!r} is not known; use json or sha256sum")
    near = output.parent if output is not None else Path.cwd()
    if protocol_path is not None:
        if root is not None or include:
            raise UsageError("give either ROOT --include GLOB... or --protocol P, not both")
        loaded = load_protocol(protocol_path)
        if arm not in ARMS:
            raise UsageError(f"--arm {arm!r} is not an arm; use baseline or candidate")
        arm_spec = getattr(loaded.protocol.arms, arm)
        tree = loaded.resolve(loaded.protocol.sources.root)
        with tempfile.TemporaryDirectory(prefix="orch-freeze-") as tmp:
            src = arm_source_dir(loaded, arm_spec, Path(tmp))
            manifest = hash_tree(src, loaded.protocol.sources.include)
    else:
        if root is None or not include:
            raise UsageError("orch freeze needs ROOT and at least one --include GLOB, or --protocol P")
        tree = root
        manifest = hash_tree(root, include)
    manifest = manifest.model_copy(update={"sources_root": _relative_root(tree, near)})
    text = manifest.to_json() if fmt == "json" else manifest.to_sha256sum()
    doc: dict[str, Any] = {"root": manifest.root, "files": len(manifest.entries), "include": manifest.include,
                           "sources_root": manifest.sources_root, "output": None if output is None else str(output)}
    if output is not None:
        write_text_atomic(output, text)
        typer.echo(f"{manifest.root}  {len(manifest.entries)} files -> {output}")
    else:
        typer.echo(text.rstrip("\n"))
        doc["manifest"] = manifest.model_dump(mode="json", by_alias=True, exclude_none=True)
    return doc


def _tree_of(commitment: Path, expected: Manifest, root: Path | None) -> tuple[Path, str]:
    """The tree to check and how it was found: --root, the manifest's recorded sources root, or the cwd."""
    if root is not None:
        return root, "--root"
    if expected.sources_root is not None:
        base = repository_top(commitment.parent) or commitment.parent.resolve()
        return base / expected.sources_root, "the manifest's sources_root"
    return Path.cwd(), "the current directory"


def verify_command(commitment: Path, root: Path | None) -> dict[str, Any]:
    """Compare a tree with a commitment: exit 0 when equal, RefusedError (exit 3) with the diff when not."""
    expected = load_manifest(commitment)
    tree, found = _tree_of(commitment, expected, root)
    if not tree.is_dir():
        hint = "" if root is not None else "; pass --root DIR"
        raise RefusedError(f"{tree} ({found}): not a directory{hint}")
    try:
        actual: Manifest = hash_tree(tree, expected.include)
    except RefusedError as err:
        if root is not None:
            raise
        raise RefusedError(f"{err.message.split(';')[0]} ({found}); pass --root DIR, the tree the manifest "
                           "was frozen from") from None
    diff = diff_manifests(expected, actual)
    doc: dict[str, Any] = {"ok": diff.equal, "commitment": str(commitment), "root": expected.root,
                           "tree": str(tree), "files": len(expected.entries), "changed": diff.changed,
                           "added": diff.added, "removed": diff.removed}
    if diff.equal:
        typer.echo(f"ok {expected.root}  {len(expected.entries)} files match {commitment}")
        return doc
    for line in diff.lines():
        typer.echo(line, err=True)
    raise RefusedError(f"sources in {tree} differ from {commitment}: {diff.summary()}; "
                       "run `orch freeze` if this is a new candidate", document=doc)


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True)
