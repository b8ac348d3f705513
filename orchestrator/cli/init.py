"""`orch init SCRIPT`: the command line of the draft recipe and protocol writer (orchestrator/init/draft.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.cli.common import JsonOpt, examples, report
from protocol.errors import UsageError

INIT_EXAMPLES = examples(
    "orch init train.py --device cpu",
    "orch init train.py --gpus 1 --candidate-config gradient_checkpointing=False",
    "orch init train.py --gpus 1 --set learning_rate=1e-5 --drop gradient_accumulation_steps --force",
    "orch init train.py --gpus 1 --protocol-only --force",
)


def _pairs(items: list[str] | None, option: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"{option} {item}: write NAME=VALUE")
        out[key] = value
    return out


def init(
    script: Annotated[Path, typer.Argument(help="your training script (run by torchrun)", show_default=False)],
    device: Annotated[str | None, typer.Option("--device", help="cpu: a draft for 2 CPU ranks (gloo)")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, max=64, help="a draft for N GPUs (NCCL)")] = None,
    name: Annotated[str | None, typer.Option("--name", help="the recipe's name (default: the script's)")] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help="KEY=VALUE: a recipe value other than the "
                                                                 "script's default (repeatable)")] = None,
    drops: Annotated[list[str] | None, typer.Option("--drop", help="KEY: leave a drafted key out")] = None,
    config: Annotated[list[str] | None, typer.Option(
        "--candidate-config", help="NAME=VALUE: the candidate passes --NAME VALUE after the arguments")] = None,
    switches: Annotated[list[str] | None, typer.Option(
        "--candidate-switch", help="VAR=VALUE: the candidate's environment variable")] = None,
    python: Annotated[str | None, typer.Option(
        "--python", help="interpreter of the training environment, to read transformers/TRL dataclasses "
                         "(default: orch's own)")] = None,
    root: Annotated[Path, typer.Option("--root", help="the project's root: recipes/ and protocol/ go there")] = Path(),
    force: Annotated[bool, typer.Option("--force", help="overwrite the drafts")] = False,
    protocol_only: Annotated[bool, typer.Option(
        "--protocol-only", help="write only the protocol, against the recipe file as it is now")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Draft a recipe file and a protocol for your training script (every argument classified or listed)."""
    from orchestrator.init.draft import InitOptions, default_python, init_command, introspect_subprocess

    def run() -> dict[str, Any]:
        if (device is None) == (gpus is None) or device not in (None, "cpu"):
            raise UsageError("give --device cpu or --gpus N")
        opts = InitOptions(script=script, device="cpu" if gpus is None else "cuda", gpus=gpus or 0, name=name,
                           sets=sets or [], drops=drops or [], config=_pairs(config, "--candidate-config"),
                           switches=_pairs(switches, "--candidate-switch"), root=root, force=force,
                           protocol_only=protocol_only)
        doc = init_command(opts, introspect_subprocess(python or default_python()))
        say = typer.echo
        say(f"trainer: {doc['trainer']}{' ' + str(doc['versions']) if doc['versions'] else ''}")
        say(f"recipe keys ({len(doc['keys'])}): " + ", ".join(f"{k}" for k in doc["keys"]))
        own = [k for k, why in doc["keys"].items() if why == "a number the script defines itself"]
        if own:
            say(f"  of them the script's own numbers, kept as keys (delete those that are no hyperparameter): "
                f"{', '.join(own)}")
        say(f"observed at run time: {', '.join(doc['observed']) or 'none (trainer not recognised)'}")
        say(f"run settings ({len(doc['run_settings'])}): {', '.join(doc['run_settings'])}")
        say(f"not classified ({len(doc['unclassified'])}), left for you (listed at the end of the recipe file): "
            + ", ".join(u["name"] for u in doc["unclassified"]))
        for problem in doc["problems"]:
            say(f"not read: {problem}")
        say(f"wrote {'' if protocol_only else doc['recipe_file'] + ' and '}{doc['protocol']}"
            + (f", and the DEV scorer {doc['scorer']}: write your metric in its metric()" if doc["scorer"] else ""))
        return doc

    report(run, as_json)


__all__ = ["INIT_EXAMPLES", "init"]
