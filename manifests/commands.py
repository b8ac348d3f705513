"""The `orch freeze`, `orch verify` and `orch schema` commands: one function each, called by the CLI.

They return what to print and raise protocol.errors types for refusals, so they are testable without a terminal.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from manifests.core import Manifest, diff_manifests, hash_tree, load_manifest, write_text_atomic
from manifests.sources import arm_source_dir
from protocol.errors import UsageError
from protocol.schema import json_schema, load_protocol


def freeze(
    root: Path | None,
    include: list[str],
    protocol_path: Path | None,
    arm: str,
    output: Path | None,
    fmt: str,
) -> str:
    """Hash a tree (ROOT --include, or the sources of a protocol's arm) and write or return the manifest."""
    if fmt not in ("json", "sha256sum"):
        raise UsageError(f"--format {fmt!r} is not known; use json or sha256sum")
    if protocol_path is not None:
        if root is not None or include:
            raise UsageError("give either ROOT --include GLOB... or --protocol P, not both")
        loaded = load_protocol(protocol_path)
        if arm not in ("baseline", "candidate"):
            raise UsageError(f"--arm {arm!r} is not an arm; use baseline or candidate")
        arm_spec = getattr(loaded.protocol.arms, arm)
        with tempfile.TemporaryDirectory(prefix="orch-freeze-") as tmp:
            src = arm_source_dir(loaded, arm_spec, Path(tmp))
            manifest = hash_tree(src, loaded.protocol.sources.include)
    else:
        if root is None or not include:
            raise UsageError("orch freeze needs ROOT and at least one --include GLOB, or --protocol P")
        manifest = hash_tree(root, include)
    text = manifest.to_json() if fmt == "json" else manifest.to_sha256sum()
    if output is not None:
        write_text_atomic(output, text)
        return f"{manifest.root}  {len(manifest.entries)} files -> {output}"
    return text.rstrip("\n")


def verify(commitment: Path, root: Path | None) -> tuple[bool, str]:
    """Compare a tree with a commitment: (True, root) when equal, else (False, the diff lines)."""
    expected = load_manifest(commitment)
    tree = root if root is not None else Path.cwd()
    if not tree.is_dir():
        raise UsageError(f"--root {tree}: not a directory")
    actual: Manifest = hash_tree(tree, expected.include)
    diff = diff_manifests(expected, actual)
    if diff.equal:
        return True, f"ok {expected.root}  {len(expected.entries)} files match {commitment}"
    lines = [f"sources differ from {commitment}: {diff.summary()}", *diff.lines()]
    lines.append("run `orch freeze` if this is a new candidate")
    return False, "\n".join(lines)


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True)
