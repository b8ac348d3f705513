"""`orch init SCRIPT`: a draft recipe file (every hyperparameter with its flag and current default, the probe's
observations where the trainer is recognised) and a draft short-form protocol for `--device cpu` or `--gpus N`.
Every argument is classified (recipe key, run setting) or listed as not classified: nothing is guessed silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.init.rules import MAY_MATTER, recognised_table, run_setting
from orchestrator.init.scorer import draft_scorer
from orchestrator.init.script_args import ScriptArg, read_script
from protocol.errors import RefusedError, UsageError
from protocol.recipe import parse_recipe

Introspect = Callable[[Sequence[str]], dict[str, Any]]
ORCH_ROOT = Path(__file__).resolve().parents[2]


def introspect_subprocess(python: str) -> Introspect:
    """workers.arg_fields in the training environment's interpreter (orch imports neither transformers nor TRL)."""

    def run(specs: Sequence[str]) -> dict[str, Any]:
        if not specs:
            return {}
        path = os.pathsep.join([str(ORCH_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        done = subprocess.run([python, "-m", "workers.arg_fields", *specs], capture_output=True, text=True,
                              timeout=300, check=False, env={**os.environ, "PYTHONPATH": path})
        if done.returncode != 0:
            return {s: {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]} for s in specs}
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    return run


@dataclass
class Draft:
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)  # key -> recognised trainer, or "the script's own number"
    run_settings: list[str] = field(default_factory=list)
    unclassified: list[tuple[ScriptArg, str]] = field(default_factory=list)
    trainer: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # library classes that could not be read
    all_args: dict[str, ScriptArg] = field(default_factory=dict)


def _library_args(specs: dict[str, str], introspect: Introspect, draft: Draft) -> tuple[list[ScriptArg], set[str]]:
    described = introspect(sorted(set(specs.values())))
    out: list[ScriptArg] = []
    mro: set[str] = set()
    for name, spec in sorted(specs.items()):
        doc = described.get(spec, {"error": "not described"})
        if "error" in doc:
            draft.problems.append(f"{name} ({spec.replace(':', '.')}): not importable here ({doc['error']}); run orch "
                                  "init with --python of the training environment")
            continue
        mro |= set(doc["mro"])
        draft.versions.update(doc.get("versions", {}))
        for f in doc["fields"]:
            out.append(ScriptArg(f["name"], f"--{f['name']}", f["default"], f["has_default"], f["kind"],
                                 f"library {doc['class']}", f["defined_in"]))
    return out, mro


def classify(script: Path, introspect: Introspect) -> Draft:
    """Every argument of the script: a recipe key (recognised trainer, or a number the script defines itself), a
    run setting, or not classified (listed with why)."""
    found = read_script(script)
    draft = Draft()
    draft.problems += [f"{name}: not a dataclass defined or imported by the script" for name in found.unresolved]
    library, mro = _library_args(found.library, introspect, draft)
    args = {a.name: a for a in [*library, *found.args]}  # the script's own field wins over a library one
    draft.all_args = args
    label, table = recognised_table(set(args), mro)
    draft.trainer = label
    for key, (observe, note) in table.items():
        known = args.get(key)
        if known is None or not known.has_default or known.default is None:
            continue
        draft.keys[key] = {"value": known.default, "flag": known.flag, **({"observe": observe} if observe else {}),
                           **({"note": note} if note else {})}
        draft.why[key] = label
    for a in args.values():
        if a.name in draft.keys:
            continue
        own = not a.origin.startswith("library")
        if run_setting(a.name):
            draft.run_settings.append(a.name)
        elif own and a.kind in ("int", "float") and isinstance(a.default, (int, float)) and not isinstance(
                a.default, bool):
            draft.keys[a.name] = {"value": a.default, "flag": a.flag}
            draft.why[a.name] = "a number the script defines itself"
        else:
            draft.unclassified.append((a, _unclassified_why(a, own)))
    return draft


def _unclassified_why(a: ScriptArg, own: bool) -> str:
    why = ("no default value to freeze" if not a.has_default or a.default is None else
           f"the script's own {a.kind} argument" if own else
           f"a field of {a.defined_in.rpartition('.')[2] or 'a library class'}")
    return f"{why}; it may matter: {MAY_MATTER[a.name]}" if not own and a.name in MAY_MATTER else why


def _coerce(arg: ScriptArg | None, key: str, text: str) -> Any:
    value = yaml.safe_load(text) if text else ""
    kind = arg.kind if arg is not None else ""
    if isinstance(value, str) and kind in ("int", "float"):
        try:
            return int(text) if kind == "int" else float(text)
        except ValueError:
            raise UsageError(f"--set {key}={text}: {key} takes a number") from None
    if kind == "bool" and not isinstance(value, bool):
        raise UsageError(f"--set {key}={text}: {key} takes true or false")
    return value


def apply_edits(draft: Draft, sets: Sequence[str], drops: Sequence[str]) -> None:
    """--set KEY=VALUE (a drafted key, or any argument of the script, which becomes a key) and --drop KEY."""
    for item in sets:
        key, eq, text = item.partition("=")
        if not eq:
            raise UsageError(f"--set {item}: write KEY=VALUE")
        arg = draft.all_args.get(key)
        if key not in draft.keys and arg is None:
            raise UsageError(f"--set {key}: not an argument of the script; its keys: {', '.join(draft.keys)}")
        if key not in draft.keys:
            assert arg is not None
            draft.keys[key] = {"flag": arg.flag}
            draft.why[key] = "set by --set"
            draft.unclassified = [(a, w) for a, w in draft.unclassified if a.name != key]
            draft.run_settings = [n for n in draft.run_settings if n != key]
        draft.keys[key] = {**draft.keys[key], "value": _coerce(arg, key, text)}
    for key in drops:
        if key not in draft.keys:
            raise UsageError(f"--drop {key}: not a key of the draft; its keys: {', '.join(draft.keys)}")
        del draft.keys[key]


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def recipe_text(draft: Draft, name: str, trainer: str, script_rel: str) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in sorted(draft.versions.items()))
    lines = [
        f"# Drafted by `orch init` from {script_rel}{f' ({versions})' if versions else ''}: each value is the "
        "script's current default.",
        "# Set each to the value the owner froze and delete the keys that are not frozen (docs/GUIDE.md); then",
        "# write the file's new sha256 into the protocol (orch refuses a stale digest and prints the new one).",
        "schema: orch.recipe/1",
        f"name: {_scalar(name)}",
        f"trainer: {_scalar(trainer)}",
    ]
    if draft.trainer:
        lines.append("optimizer: AdamW")
    lines.append("keys:")
    for key, spec in draft.keys.items():
        lines.append(f"  {key}:  # {draft.why.get(key, '')}")
        lines.append(f"    value: {_scalar(spec['value'])}")
        lines.append(f"    flag: {spec['flag']}")
        if "observe" in spec:
            lines.append(f"    observe: {_scalar(spec['observe'])}")
        if spec.get("note"):
            lines.append(f"    note: {_scalar(spec['note'])}")
    if draft.run_settings:
        lines.append(f"# run settings, no recipe value ({len(draft.run_settings)}; the protocol's launcher.args "
                     "passes those it needs):")
        lines += _wrapped(draft.run_settings)
    if draft.unclassified:
        lines.append(f"# not classified by orch init ({len(draft.unclassified)}), left for you: add a key for "
                     "each one the owner freezes")
        for a, why in draft.unclassified:
            lines.append(f"#   {a.name}: {_scalar(a.default) if a.has_default else '(no default)'}  # {why}")
    return "\n".join(lines) + "\n"


def _wrapped(names: list[str], width: int = 116) -> list[str]:
    out, line = [], "#  "
    for n in names:
        if len(line) + len(n) + 2 > width:
            out.append(line.rstrip(","))
            line = "#  "
        line += f" {n},"
    return [*out, line.rstrip(",")]


def protocol_text(draft: Draft, name: str, recipe_rel: str, recipe_sha: str, sources_root: str, script: str,
                  device: str, gpus: int, config: dict[str, str], switches: dict[str, str]) -> str:
    cpu = device == "cpu"
    nproc = 2 if cpu else gpus
    precision = "fp32" if cpu else "bf16"
    present = draft.all_args
    args: list[str] = []
    if draft.trainer in ("TRL GRPOTrainer", "Hugging Face Trainer"):
        wanted = {"bf16": "False" if cpu else "True", "use_cpu": "True" if cpu else None, "report_to": "none",
                  "save_strategy": "no", "logging_steps": "1", "disable_tqdm": "True", "output_dir": "{trainer_dir}"}
        for k, v in wanted.items():
            if v is not None and k in present:
                args += [f"--{k}", v]
    else:
        for k, v in (("device", device), ("precision", precision), ("log_dir", "{trainer_dir}"),
                     ("output_dir", "{trainer_dir}")):
            if k in present and k not in draft.keys:
                args += [f"--{k}", v]
    for a, _ in draft.unclassified:
        if not a.has_default and a.origin == "argparse":
            args += [a.flag, "EDIT_ME"]
    manifest = f"manifests/{name.replace('-', '_')}.json"
    arm = {"commitment": manifest, "source": "tree"}
    candidate = {**arm, **({"config": config} if config else {}), **({"switches": switches} if switches else {})}
    doc = {
        "schema": "orch.protocol/2",
        "name": f"{name}-{'cpu2' if cpu else f'cuda{gpus}'}",
        "base": "..",
        "recipe_file": {"path": recipe_rel, "sha256": recipe_sha},
        "precision": precision,
        "sources": {"root": sources_root, "include": ["**/*.py"]},
        "arms": {"baseline": arm, "candidate": candidate},
        "launcher": {"nproc": nproc, "backend": "gloo" if cpu else "nccl", "device": "cpu" if cpu else "cuda",
                     "script": script, "args": args, "env": {"OMP_NUM_THREADS": "1"}},
        "measurement": {"steps": 16, "warmup": 10, "window": 2, "drift_bound": 0.02, "digest_first": 0,
                        "digest_last": 13},
        "scorer": {"command": ["python", "score.py", "--ckpt", "{ckpt}", "--out", "{out}"]},
        "timeouts": {"checks": 300, "train": 900, "reload": 300, "score": 300},
    }
    change = [f"--{k} {v}" for k, v in config.items()] + [f"{k}={v}" for k, v in switches.items()]
    candidate_line = (f"the candidate arm (as drafted: the baseline with {', '.join(change)})" if change else
                      "the candidate arm (as drafted it equals the baseline, a null: give --candidate-config "
                      "NAME=VALUE or --candidate-switch VAR=VALUE)")
    head = [
        f"# Drafted by `orch init` ({'2 CPU ranks' if cpu else f'{gpus} GPU(s)'}): the short form (no `recipe:`): orch "
        f"renders --flag VALUE of every key of {recipe_rel} before launcher.args.",
        f"# Check: {candidate_line},",
        "# the scorer (a DEV score of the {ckpt} checkpoint; see docs/GUIDE.md, 'The scorer')"
        + (", and launcher.args (EDIT_ME: a required argument)." if "EDIT_ME" in args else "."),
    ]
    return "\n".join(head) + "\n" + yaml.safe_dump(doc, sort_keys=False, width=116)


@dataclass(frozen=True)
class InitOptions:
    script: Path
    device: str = "cpu"
    gpus: int = 0
    name: str | None = None
    sets: Sequence[str] = ()
    drops: Sequence[str] = ()
    config: dict[str, str] = field(default_factory=dict)
    switches: dict[str, str] = field(default_factory=dict)
    root: Path = Path(".")
    force: bool = False
    protocol_only: bool = False


def init_command(opts: InitOptions, introspect: Introspect) -> dict[str, Any]:
    """Write recipes/NAME.yaml and protocol/NAME_cpu2.yaml (or _cudaN); return what was classified and how."""
    script = opts.script.resolve()
    root = opts.root.resolve()
    if not script.is_file():
        raise RefusedError(f"{opts.script}: no such training script; give the path of your script")
    try:
        rel = script.relative_to(root)
    except ValueError:
        raise RefusedError(f"{opts.script} is outside the project {root}; run orch init from the project's root "
                           "(or give --root)") from None
    name = opts.name or script.stem.replace("_", "-")
    slug = name.replace("-", "_")
    recipe_path = root / "recipes" / f"{slug}.yaml"
    suffix = "cpu2" if opts.device == "cpu" else f"cuda{opts.gpus}"
    protocol_path = root / "protocol" / f"{slug}_{suffix}.yaml"
    draft = classify(script, introspect)
    apply_edits(draft, opts.sets, opts.drops)
    if not draft.keys:
        raise RefusedError(f"{opts.script}: no recipe key found ({'; '.join(draft.problems) or 'no argument parser'})"
                           "; write the recipe by hand (docs/RECIPES.md)")
    trainer = (f"{'trl==' + draft.versions['trl'] + ' ' if 'trl' in draft.versions and 'TRL' in draft.trainer else ''}"
               f"{read_script(script).trainer or 'trainer'} ({rel.as_posix()})")
    targets = [protocol_path] if opts.protocol_only else [recipe_path, protocol_path]
    existing = [p for p in targets if p.exists()]
    if existing and not opts.force:
        raise RefusedError(f"{existing[0]} exists; orch init never overwrites a file: give --force, --name, or "
                           "--protocol-only (the protocol against the recipe file as it is)")
    config, switches = opts.config, opts.switches
    if opts.protocol_only and not config and not switches:  # the candidate drafted before stays, never a silent null
        config, switches = _drafted_candidate(protocol_path)
    if opts.protocol_only:
        if not recipe_path.is_file():
            raise RefusedError(f"{recipe_path}: no recipe file to write the protocol against; run orch init first")
        raw = recipe_path.read_bytes()
    else:
        raw = recipe_text(draft, name, trainer, rel.as_posix()).encode()
    parse_recipe(recipe_path, raw, f"recipes/{slug}.yaml")  # the draft is a valid recipe file
    protocol = protocol_text(draft, name, f"recipes/{slug}.yaml", hashlib.sha256(raw).hexdigest(),
                             rel.parent.as_posix() or ".", rel.name, opts.device, opts.gpus, config, switches)
    for path, data in ((recipe_path, raw), (protocol_path, protocol.encode())):
        if path in targets:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    scorer = None if opts.protocol_only else draft_scorer(script, rel.as_posix())
    return {
        "recipe_file": str(recipe_path.relative_to(root)), "protocol": str(protocol_path.relative_to(root)),
        "scorer": None if scorer is None else str(scorer.relative_to(root)),
        "trainer": draft.trainer or "not recognised", "versions": draft.versions,
        "keys": {k: draft.why.get(k, "") for k in draft.keys},
        "observed": [k for k, s in draft.keys.items() if "observe" in s],
        "run_settings": draft.run_settings,
        "unclassified": [{"name": a.name, "flag": a.flag, "default": a.default, "why": why}
                         for a, why in draft.unclassified],
        "problems": draft.problems,
    }


def _drafted_candidate(protocol_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The candidate arm's config and switches of the protocol written before ({} and {} when there is none)."""
    try:
        data = yaml.safe_load(protocol_path.read_text())
        candidate = data["arms"]["candidate"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return {}, {}
    if not isinstance(candidate, dict):
        return {}, {}
    pick = ({str(k): str(v) for k, v in (candidate.get(part) or {}).items()} for part in ("config", "switches"))
    return next(pick), next(pick)


def default_python() -> str:
    return sys.executable
