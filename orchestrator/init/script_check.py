"""Before the lock: an arm's `launcher.script` exists in its tree, and its argument parser (read statically by
orchestrator/init/script_args.py; library dataclasses by workers.arg_fields in a subprocess) takes every flag orch
passes.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.init.script_args import read_script
from protocol.errors import RefusedError
from protocol.recipe_rules import reinit_command
from protocol.schema import Arm, LoadedProtocol

ORCH_ROOT = Path(__file__).resolve().parents[2]
INTROSPECT_TIMEOUT_S = 120


@dataclass(frozen=True)
class Parser:
    """The long options a script's parser takes, or why they are not all known (then no flag is refused)."""

    options: frozenset[str]
    fields: frozenset[str]  # argument names (dest), for a recipe key without a flag
    unknown: str | None = None

    def takes(self, flag: str) -> bool:
        """argparse's rule: the option itself, or an unambiguous-or-not prefix of one (abbreviations)."""
        return flag in self.options or any(o.startswith(flag) for o in self.options)


def _field_options(name: str, boolean_true: bool) -> set[str]:
    """What HfArgumentParser (and R3-style helpers) add for a dataclass field: --name, --name-with-dashes, and
    --no_name / --no-name for a bool field that defaults to True."""
    out = {f"--{name}", f"--{name.replace('_', '-')}"}
    if boolean_true:
        out |= {f"--no_{name}", f"--no-{name.replace('_', '-')}"}
    return out


@functools.lru_cache(maxsize=8)
def _describe(specs: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """workers.arg_fields in orch's interpreter (the trainer's), from an empty folder: transformers and TRL are never
    imported by orch itself, and no file of the project is on the path."""
    inherited = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ORCH_ROOT), *inherited]), "PYTHONSAFEPATH": "1"}
    with tempfile.TemporaryDirectory(prefix="orch-args-") as cwd:
        try:
            done = subprocess.run([sys.executable, "-P", "-m", "workers.arg_fields", *specs], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=INTROSPECT_TIMEOUT_S, check=False)
            doc = json.loads(done.stdout) if done.returncode == 0 else {}
        except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
            doc = {}
    return {s: doc.get(s) or {"error": "not described"} for s in specs}


def read_parser(script: Path) -> Parser:
    """The options of the script's parser: argparse calls, its own dataclasses, library dataclasses it names."""
    found = read_script(script)
    options = set(found.options)
    fields = {a.name for a in found.args}
    for a in found.args:
        if a.origin.startswith("dataclass"):
            options |= _field_options(a.name, a.kind == "bool" and a.default is True)
    why = list(found.open) + [f"{u} is not read" for u in found.unresolved]
    if found.library:
        described = _describe(tuple(sorted(set(found.library.values()))))
        for spec, doc in described.items():
            if "error" in doc:
                why.append(f"{spec.replace(':', '.')} could not be read ({doc['error']})")
                continue
            for f in doc.get("fields", []):  # type: ignore[attr-defined]
                fields.add(f["name"])
                options |= _field_options(f["name"], f["kind"] == "bool" and f["default"] is True)
    if not options and not why:
        why.append("no argument parser was found in it")
    return Parser(frozenset(options), frozenset(fields), "; ".join(why) or None)


def _did_you_mean(flag: str, parser: Parser) -> str:
    near = difflib.get_close_matches(flag, sorted(parser.options), n=1)
    return f" (did you mean {near[0]}?)" if near else ""


def _flags(args: Sequence[str]) -> list[str]:
    """The long options of a command line, up to a bare `--` (after it argparse reads no option)."""
    out = []
    for a in args:
        if a == "--":
            break
        if a.startswith("--") and len(a) > 2:
            out.append(a.partition("=")[0])
    return out


def check_script(loaded: LoadedProtocol, name: str, arm: Arm, source_dir: Path) -> str | None:
    """RefusedError (exit 3, one line) when the arm's script is missing from its tree, when its parser does not take
    a flag of the recipe, launcher.args or the arm's config, or when a recipe key without a flag is one of its
    arguments (the trainer would keep its own default). Returns a note when the parser could not be read whole."""
    p = loaded.protocol
    script = p.launcher.script
    path = source_dir / script
    where = f"{loaded.path.name}: launcher.script {script}"
    if not path.is_file():
        raise RefusedError(f"{where} is not a file in the {name} arm's sources ({p.sources.root}); fix launcher.script "
                           "(it is relative to sources.root) or add the script to the sources")
    parser = read_parser(path)
    if parser.unknown is not None:
        return f"the flags for {script} are not checked before the lock: {parser.unknown}"
    recipe = loaded.frozen_recipe()
    by_flag = {flag: key for key, flag in recipe.recipe.flags().items()}
    reinit = reinit_command(p.sources.root, script, p.launcher.device, p.launcher.nproc, recipe.raw)
    fix_recipe = f"fix the key's flag in {recipe.named}, then write the protocol again against it (`{reinit}`)"
    for flag in _flags(p.launcher.args):
        if parser.takes(flag):
            continue
        if flag in by_flag:
            raise RefusedError(f"{recipe.named}: key {by_flag[flag]} is passed as {flag}, which {script} does not "
                               f"take{_did_you_mean(flag, parser)}; {fix_recipe}")
        raise RefusedError(f"{loaded.path.name}: launcher.args pass {flag}, which {script} does not take"
                           f"{_did_you_mean(flag, parser)}; fix or remove it in launcher.args")
    for key in sorted(arm.config):
        if not parser.takes(f"--{key}"):
            raise RefusedError(f"{loaded.path.name}: arms.{name}.config.{key} passes --{key}, which {script} does "
                               f"not take{_did_you_mean(f'--{key}', parser)}; fix or remove it")
    for key, spec in recipe.recipe.keys.items():
        if spec.flag is None and key in parser.fields:
            raise RefusedError(f"{recipe.named}: key {key} has no flag, so {script} would keep its own default of "
                               f"--{key}; add `flag: --{key}` to the key (or delete the key if its owner did not "
                               f"freeze it), then `{reinit}`")
    return None
