"""A protocol against its frozen recipe file: the values it gives, the flags that carry them to the trainer, flags
that set them again or shrink the declared model, and the rehearsal's overrides. Each refusal is one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from protocol.errors import RefusedError
from protocol.protocol_yaml import line_of, node_at
from protocol.recipe import RecipeFile, Value, flag_value_equal, normalized, same_value

_MISSING = object()


def overridable(recipe: RecipeFile) -> list[str]:
    """Keys a rehearsal on fewer ranks may lower to a divisor of its ranks."""
    return [k for k, spec in recipe.keys.items() if spec.rehearsal == "divides_ranks"]


def normalized_values(given: Mapping[str, Value], recipe: RecipeFile) -> dict[str, Value]:
    """The protocol's values with numbers written as the frozen value's kind (YAML 0 for a float key is 0.0)."""
    return {k: normalized(recipe.keys[k].value, v) if k in recipe.keys else v for k, v in given.items()}


def recipe_differences(
    given: Mapping[str, Value], recipe: RecipeFile, overrides: Mapping[str, int] | None = None
) -> list[tuple[str, object, object]]:
    """(key, given, frozen) for every frozen key the protocol gives otherwise (or not at all: given is None is
    shown as missing), then (key, given, None) for every key the recipe file does not have."""
    expected: dict[str, Value] = {**recipe.values(), **(overrides or {})}
    diffs: list[tuple[str, object, object]] = []
    for key, value in expected.items():
        seen = given.get(key, _MISSING)
        if not same_value(value, seen):
            diffs.append((key, seen, value))
    diffs += [(k, v, None) for k, v in given.items() if k not in expected]
    return diffs


def _shown(key: str, seen: object, frozen: object) -> str:
    if seen is _MISSING:
        return f"recipe.{key} missing (upstream {frozen!r})"
    if frozen is None:
        return f"recipe.{key} = {seen!r} is not a key of the frozen recipe"
    return f"recipe.{key} = {seen!r} (upstream {frozen!r})"


def launch_flag_differences(args: Sequence[str], values: Mapping[str, Value], recipe: RecipeFile) -> list[str]:
    """Recipe keys whose `--flag value` is missing from, or differs in, the launcher's arguments."""
    args = list(args)
    problems = []
    for key, flag in recipe.flags().items():
        expected = values.get(key, recipe.keys[key].value)
        if flag not in args or args.index(flag) + 1 >= len(args):
            problems.append(f"{flag} missing (recipe {key} = {expected})")
            continue
        given = args[args.index(flag) + 1]
        if not flag_value_equal(expected, given):
            problems.append(f"{flag} {given} (recipe {key} = {expected})")
    return problems


def _recipe_flag_named(token: str, flags: Sequence[str]) -> str | None:
    """The recipe flag an argument sets, the way argparse reads it: `--key`, `--key=value` or an abbreviation."""
    key = token.partition("=")[0]
    if not key.startswith("--") or len(key) < 3:
        return None
    if key in flags:
        return key
    matches = [f for f in flags if f.startswith(key)]
    return matches[0] if len(matches) == 1 else None


def recipe_overrides(args: Sequence[str], configs: Mapping[str, Mapping[str, str]], recipe: RecipeFile) -> list[str]:
    """Arguments that would set a recipe value a second time, behind the one checked `--flag value` (the trainer's
    parser keeps the last): a repeated flag, a `--flag=value` form, an abbreviation argparse accepts, or an arm's
    `config` key (passed as `--key value` after the launcher's arguments)."""
    flags = list(recipe.flags().values())
    problems = []
    seen: set[str] = set()
    for token in args:
        flag = _recipe_flag_named(token, flags)
        if flag is None:
            continue
        if token != flag:
            problems.append(f"launcher.args {token!r} sets {flag} (write it once as `{flag} VALUE`)")
        elif flag in seen:
            problems.append(f"launcher.args give {flag} twice (the trainer keeps the last)")
        seen.add(flag)
    for arm, config in configs.items():
        for key in config:
            flag = _recipe_flag_named(f"--{key}", flags)
            if flag is not None:
                problems.append(f"arms.{arm}.config.{key} sets the recipe's {flag} after the launcher's arguments")
    return problems


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "y", "t", "on")


def shrinking_flags(args: Sequence[str], recipe: RecipeFile) -> list[str]:
    """Launcher flags that the recipe file says make the trainer build a smaller model than the declared one."""
    args = list(args)
    found = []
    for flag, why in recipe.model_shrinking_flags.items():
        for i, a in enumerate(args):
            key, eq, inline = a.partition("=")
            if key != flag:
                continue
            value = inline if eq else (args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else "1")
            if _truthy(value):
                found.append(f"{flag} {value} ({why})")
    return found


@dataclass(frozen=True)
class Checked:
    """The parts of a protocol its recipe file checks (schema.py builds it; this module never imports the schema)."""

    recipe: Mapping[str, Value]
    args: Sequence[str]
    nproc: int
    overrides: Mapping[str, int]
    configs: Mapping[str, Mapping[str, str]]
    model_layers: int | None
    rendered: int = 0  # the short form: the first `rendered` arguments are the recipe's flags, rendered by orch


def check_recipe(path: Path, root_node: Any, protocol: Checked, recipe: RecipeFile, named: str) -> None:
    """Every refusal of a protocol against its frozen recipe file, in order: rehearsal overrides, values, flags,
    values set again, flags that shrink the declared model. RefusedError (exit 3) names file, line and keys."""
    overrides = protocol.overrides
    allowed = overridable(recipe)
    bad_override = sorted(set(overrides) - set(allowed))
    if bad_override:
        line = line_of(node_at(root_node, ("rehearsal", "recipe_overrides")))
        raise RefusedError(
            f"{path}:{line}: rehearsal.recipe_overrides: {', '.join(bad_override)} may not be overridden "
            f"(only {', '.join(allowed) or 'none'}); remove it"
        )
    for key, value in overrides.items():
        if value < 1 or protocol.nproc % value:
            line = line_of(node_at(root_node, ("rehearsal", "recipe_overrides")))
            raise RefusedError(f"{path}:{line}: rehearsal.recipe_overrides.{key} must divide launcher.nproc")
    diffs = recipe_differences(protocol.recipe, recipe, overrides)
    if diffs:
        first = diffs[0][0]
        line = line_of(node_at(root_node, ("recipe", first) if first in protocol.recipe else ("recipe",)))
        listed = ", ".join(_shown(k, g, u) for k, g, u in diffs)
        raise RefusedError(f"{path}:{line}: recipe differs from the frozen upstream recipe ({named}): {listed}; "
                           "restore it")
    args = protocol.args
    flags = launch_flag_differences(args, protocol.recipe, recipe)
    if flags:
        line = line_of(node_at(root_node, ("launcher", "args")))
        raise RefusedError(
            f"{path}:{line}: launcher.args do not carry the recipe: {'; '.join(flags)}; pass every recipe value "
            "(or leave `recipe:` out: orch then renders every recipe flag)"
        )
    configs = protocol.configs
    if protocol.rendered:  # the short form: the recipe's flags are orch's to write, none of them the user's
        again = recipe_overrides(args[protocol.rendered:], {}, recipe)
        again += [f"{flag} {args[i + 1] if i + 1 < len(args) else ''}".strip()
                  for i, flag in enumerate(args) if i >= protocol.rendered and flag in recipe.flags().values()]
        if again:
            line = line_of(node_at(root_node, ("launcher", "args")))
            raise RefusedError(
                f"{path}:{line}: launcher.args set the recipe again ({'; '.join(again)}), but a protocol without "
                f"`recipe:` has orch render every recipe flag from {named}; remove them from launcher.args")
    again = recipe_overrides(args, configs, recipe)
    if again:
        line = line_of(node_at(root_node, ("launcher", "args")))
        raise RefusedError(f"{path}:{line}: the recipe is set again behind its checked flag: {'; '.join(again)}; "
                           "remove the extra setting (the recipe is frozen)")
    shrink = shrinking_flags(args, recipe) if protocol.model_layers is not None else []
    if shrink:
        line = line_of(node_at(root_node, ("launcher", "args")))
        raise RefusedError(
            f"{path}:{line}: launcher.args shrink the declared model ({protocol.model_layers} layers): "
            f"{'; '.join(shrink)}; remove the flag (blinding covers the trainer's step-0 evaluation)"
        )


def reinit_command(sources_root: str, script: str, device: str, nproc: int, recipe_raw: bytes | None = None) -> str:
    """The `orch init` that writes a protocol again against its recipe file as it is now (the fix for an edited
    recipe): the script from the project's root, the protocol's device, the recipe's name where not the script's."""
    path = PurePosixPath(sources_root, script)
    target = "--device cpu" if device == "cpu" else f"--gpus {nproc}"
    try:
        name = yaml.safe_load(recipe_raw or b"").get("name")
    except (yaml.YAMLError, AttributeError):
        name = None
    named = f" --name {name}" if isinstance(name, str) and name != path.stem.replace("_", "-") else ""
    return f"orch init {path.as_posix()} {target}{named} --protocol-only --force"
