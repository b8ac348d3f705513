"""The protocol.yaml model (pydantic v2, frozen, extra="forbid"), its loader and its rules (YAML: protocol_yaml.py).

A protocol freezes one experiment; its id is the SHA256 of its canonical JSON. Refusals name file, line and field.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from protocol.errors import RefusedError
from protocol.hashing import canonical_json as dumps_canonical
from protocol.plan import DEFAULT_MAX_REPEATS, DEFAULT_TARGET_HALF_WIDTH, MAX_REPEATS
from protocol.protocol_yaml import field_name, line_of, node_at, parse_yaml, read_text
from protocol.recipe import ALLOWED_PRECISIONS, UPSTREAM_RECIPE, flag_value_equal

PROTOCOL_SCHEMA = "orch.protocol/1"
HostControl = Literal["pin_cpus", "gc_at_boundaries"]
HOST_CONTROLS: tuple[HostControl, ...] = ("pin_cpus", "gc_at_boundaries")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Recipe(_Frozen):
    group_size: int
    policy_group_size: int
    rounds: int
    global_seed: int
    data_seed: int
    lr: float
    warmup_steps: int
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    max_grad_norm: float
    kl_weight_text: float
    kl_weight_image: float
    freeze_vit: bool
    total_steps: int


class Sources(_Frozen):
    root: str = Field(description="directory of the runtime sources, relative to the protocol's base")
    include: list[str] = Field(min_length=1, description="glob patterns relative to root, e.g. train/**/*.py")


class GitSource(_Frozen):
    git: str = Field(description="a git revision of the protocol's repository; sources come from `git archive`")


class Arm(_Frozen):
    commitment: str = Field(description="path of the published source manifest (JSON) of this arm")
    source: Literal["tree"] | GitSource = "tree"
    switches: dict[str, str] = Field(default_factory=dict, description="environment of the arm's fusion switches")
    config: dict[str, str] = Field(
        default_factory=dict, description="external configuration (e.g. reward server), passed as --key value"
    )
    under_evaluation: bool = Field(
        False, description="a new candidate whose working tree may differ from the published commitment"
    )


class Arms(_Frozen):
    baseline: Arm
    candidate: Arm


# a Slurm time limit as sbatch takes it: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS
SLURM_TIME = r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2})$"


class SlurmLauncher(_Frozen):
    """The allocation a Slurm run needs: `launcher.nproc` ranks on each of `nodes` nodes."""

    nodes: int = Field(ge=1, le=4096, description="nodes of the allocation; every train package spans all of them")
    gpus_per_node: int = Field(0, ge=0, le=64, description="GPUs (gres/gpu) per node; 0 for a CPU protocol")
    partition: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Slurm partition")
    time_limit: str | None = Field(None, pattern=SLURM_TIME, description="Slurm time limit, e.g. 01:30:00")


class Launcher(_Frozen):
    nproc: int = Field(ge=1, le=64, description="ranks (one node); ranks per node under scheduler slurm")
    backend: Literal["gloo", "nccl"]
    device: Literal["cpu", "cuda"]
    script: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    scheduler: Literal["local", "slurm"] = Field(
        "local", description="local: this host under orch's GPU lock; slurm: inside a Slurm allocation (launcher.slurm)"
    )
    slurm: SlurmLauncher | None = None

    @model_validator(mode="after")
    def _scheduler_section(self) -> Launcher:
        if self.scheduler == "slurm" and self.slurm is None:
            raise ValueError("scheduler slurm needs a launcher.slurm section (nodes, gpus_per_node, partition, "
                             "time_limit)")
        if self.scheduler != "slurm" and self.slurm is not None:
            raise ValueError("launcher.slurm is given but launcher.scheduler is not slurm; set scheduler: slurm")
        if self.slurm is not None and self.device == "cuda" and self.slurm.gpus_per_node < self.nproc:
            raise ValueError(f"launcher.nproc {self.nproc} ranks per node need launcher.slurm.gpus_per_node >= "
                             f"{self.nproc} on a cuda protocol")
        return self

    @property
    def world_size(self) -> int:
        """Ranks of a train package: nproc, times the nodes under Slurm."""
        return self.nproc * (self.slurm.nodes if self.slurm is not None else 1)


class Measurement(_Frozen):
    steps: int = 16
    warmup: int = 10
    window: int = 2
    drift_bound: float = Field(0.02, gt=0, lt=1)
    digest_first: int = 0
    digest_last: int = 13
    # the same host controls for every arm, recorded with each rank's results (DESIGN.md section 5)
    host_controls: list[HostControl] = Field(
        default_factory=lambda: list(HOST_CONTROLS),
        description="pin_cpus: each rank on its own block of cores; gc_at_boundaries: Python's cyclic GC runs only "
        "between steps (probe time), never inside a timed step",
    )
    repeats: int | Literal["auto"] = Field(
        1,
        description="fresh A -> C -> B triplets in one run under one lock (1 = exactly the owner's run); each "
        "triplet's headline is the owner's, the audit's interval uses them all; auto: triplets are added one at a "
        "time until the sequential rule stops (decided, precise, or measurement.max_repeats)",
    )
    max_repeats: int = Field(
        DEFAULT_MAX_REPEATS, ge=1, le=MAX_REPEATS,
        description="repeats: auto only: the most triplets the sequential rule may take",
    )
    target_half_width: float | None = Field(
        DEFAULT_TARGET_HALF_WIDTH, gt=0, lt=1,
        description="repeats: auto only: stop once the repeated interval's relative half-width is at most this "
        "(null: stop only when decided or at the maximum)",
    )

    @field_validator("repeats", mode="before")
    @classmethod
    def _repeats_value(cls, value: object) -> object:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_REPEATS):
            return value
        raise ValueError(f"repeats must be between 1 and {MAX_REPEATS} triplets, or auto; got {value!r}")

    @model_validator(mode="after")
    def _sequential_fields(self) -> Measurement:
        if self.repeats != "auto" and (self.max_repeats != DEFAULT_MAX_REPEATS
                                       or self.target_half_width != DEFAULT_TARGET_HALF_WIDTH):
            raise ValueError("max_repeats and target_half_width apply only to repeats: auto; set repeats: auto or "
                             "remove them")
        return self

    @property
    def sequential(self) -> bool:
        """repeats: auto: the number of triplets is decided while the run goes (ledger/verdict/sequential.py)."""
        return self.repeats == "auto"

    @property
    def fixed_repeats(self) -> int | None:
        """The number of triplets of a fixed design; None for repeats: auto."""
        return self.repeats if isinstance(self.repeats, int) else None

    @property
    def windows(self) -> list[tuple[int, int]]:
        """Inclusive step ranges of the timing windows (w1, w2, ...)."""
        return [(s, s + self.window - 1) for s in range(self.warmup, self.steps, self.window)]


class Diagnostic(_Frozen):
    name: str
    command: list[str] = Field(min_length=1)
    expect_sha256: str | None = None


class Checks(_Frozen):
    prepare: list[Diagnostic] = Field(default_factory=list)
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    static_graph: Diagnostic | None = None


class Scorer(_Frozen):
    command: list[str] = Field(min_length=1)


class Model(_Frozen):
    """The model the protocol declares it trains; the audit compares it with what the probe observed."""

    layers: int = Field(ge=1, description="decoder layers of the language model, e.g. 28 for BAGEL-7B-MoT")
    layer_prefix: str = Field(
        "language_model.model.layers", description="parameter-name prefix of the decoder layers ('<prefix>.<i>.')"
    )
    min_params: int | None = Field(None, ge=1, description="fewest parameters (trainable + frozen) the model has")


class Rehearsal(_Frozen):
    """A rehearsal of the real trainer at tiny size (orch rehearse): never evidence of a speedup."""

    upstream: str = Field(description="the upstream snapshot rehearsed (commit or manifest root)")
    recipe_overrides: dict[str, int] = Field(
        default_factory=dict,
        description="recipe keys a smaller host forces (only policy_group_size: it must divide the ranks)",
    )
    reason: str = ""


class Timeouts(_Frozen):
    checks: int = Field(900, gt=0, description="seconds")
    train: int = Field(1800, gt=0, description="seconds")
    reload: int = Field(600, gt=0, description="seconds")
    score: int = Field(900, gt=0, description="seconds")


class Protocol(_Frozen):
    schema_: Literal["orch.protocol/1"] = Field("orch.protocol/1", alias="schema")
    name: str
    base: str = Field("..", description="directory the protocol's paths are relative to, from the protocol file")
    recipe: Recipe
    precision: str
    sources: Sources
    arms: Arms
    launcher: Launcher
    measurement: Measurement = Measurement()
    checks: Checks = Checks()
    scorer: Scorer
    timeouts: Timeouts = Timeouts()
    model: Model | None = None
    rehearsal: Rehearsal | None = None

    @field_validator("precision")
    @classmethod
    def _precision_allowed(cls, value: str) -> str:
        if value not in ALLOWED_PRECISIONS:
            raise ValueError(f"precision {value!r} is not allowed; use one of {', '.join(ALLOWED_PRECISIONS)}")
        return value


class LoadedProtocol(BaseModel):
    """A validated protocol with the place it came from."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    protocol: Protocol
    path: Path
    base: Path

    @property
    def id(self) -> str:
        return protocol_id(self.protocol)

    def resolve(self, relative: str) -> Path:
        return (self.base / relative).resolve()


# top-level fields added after orch.protocol/1 was first published: left out of the canonical JSON while
# unset, so the id of every protocol written before them is unchanged
LATER_FIELDS = ("model", "rehearsal")
# fields added later inside a section: at their default they stay out of the canonical JSON likewise
_LATER_DEFAULTS: dict[tuple[str, str], object] = {
    ("measurement", "repeats"): 1, ("launcher", "scheduler"): "local", ("launcher", "slurm"): None,
}


# the sequential rule's settings: part of the id only of a protocol with repeats: auto (always there in full)
_SEQUENTIAL_KEYS = ("max_repeats", "target_half_width")


def canonical_json(protocol: Protocol) -> bytes:
    data = protocol.model_dump(mode="json", by_alias=True)
    for key in LATER_FIELDS:
        if data.get(key) is None:
            data.pop(key, None)
    for (section, key), default in _LATER_DEFAULTS.items():
        if data.get(section, {}).get(key, default) == default:
            data.get(section, {}).pop(key, None)
    if not protocol.measurement.sequential:
        for key in _SEQUENTIAL_KEYS:
            data["measurement"].pop(key, None)
    return dumps_canonical(data, ensure_ascii=False).encode()


def protocol_id(protocol: Protocol) -> str:
    return hashlib.sha256(canonical_json(protocol)).hexdigest()


REHEARSAL_OVERRIDABLE = ("policy_group_size",)
# flags of the upstream trainer that shrink the model it trains (train/online_rl.py: debug mode sets
# llm_config.num_hidden_layers = 1, skips FSDPCheckpoint.try_load_ckpt and swaps in stub rewards)
SHRINKING_FLAGS = {"--debug": "upstream debug mode cuts the LLM to 1 layer, loads no weights and stubs the rewards"}


def recipe_differences(recipe: Recipe, overrides: dict[str, int] | None = None) -> list[tuple[str, object, object]]:
    """(key, given, upstream) for every recipe key that differs from the frozen upstream recipe (or its override)."""
    given = recipe.model_dump()
    expected = {**UPSTREAM_RECIPE, **(overrides or {})}
    return [(k, given[k], v) for k, v in expected.items() if given[k] != v]


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "y", "t", "on")


def shrinking_flags(protocol: Protocol) -> list[str]:
    """Launcher flags that would make a protocol that declares its model time a smaller one."""
    args = list(protocol.launcher.args)
    found = []
    for flag, why in SHRINKING_FLAGS.items():
        for i, a in enumerate(args):
            key, eq, inline = a.partition("=")
            if key != flag:
                continue
            value = inline if eq else (args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else "1")
            if _truthy(value):
                found.append(f"{flag} {value} ({why})")
    return found


def launch_flag_differences(protocol: Protocol) -> list[str]:
    """Recipe keys whose `--key value` flag is missing from, or differs in, the launcher's arguments."""
    args = list(protocol.launcher.args)
    problems = []
    for key, expected in protocol.recipe.model_dump().items():
        flag = f"--{key}"
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


def recipe_overrides(protocol: Protocol) -> list[str]:
    """Arguments that would set a recipe value a second time, behind the one checked `--key value` (the trainer's
    parser keeps the last): a repeated flag, a `--key=value` form, an abbreviation argparse accepts, or an arm's
    `config` key (passed as `--key value` after the launcher's arguments)."""
    flags = [f"--{key}" for key in protocol.recipe.model_dump()]
    problems = []
    seen: set[str] = set()
    for token in protocol.launcher.args:
        flag = _recipe_flag_named(token, flags)
        if flag is None:
            continue
        if token != flag:
            problems.append(f"launcher.args {token!r} sets {flag} (write it once as `{flag} VALUE`)")
        elif flag in seen:
            problems.append(f"launcher.args give {flag} twice (the trainer keeps the last)")
        seen.add(flag)
    for arm in ("baseline", "candidate"):
        for key in getattr(protocol.arms, arm).config:
            flag = _recipe_flag_named(f"--{key}", flags)
            if flag is not None:
                problems.append(f"arms.{arm}.config.{key} sets the recipe's {flag} after the launcher's arguments")
    return problems


def load_protocol(path: str | Path) -> LoadedProtocol:
    """Load, validate and check a protocol file; RefusedError (exit 3) names file, line and field."""
    path = Path(path)
    root_node, data = parse_yaml(path, read_text(path))
    if not isinstance(data, dict):
        raise RefusedError(f"{path}:1: a protocol is a YAML mapping; see `orch schema`")
    try:
        protocol = Protocol.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = tuple(first["loc"])
        line = line_of(node_at(root_node, loc))
        more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
        msg = first["msg"].removeprefix("Value error, ")
        raise RefusedError(f"{path}:{line}: {field_name(loc)}: {msg}{more}; see `orch schema`") from None
    overrides = protocol.rehearsal.recipe_overrides if protocol.rehearsal is not None else {}
    bad_override = sorted(set(overrides) - set(REHEARSAL_OVERRIDABLE))
    if bad_override:
        line = line_of(node_at(root_node, ("rehearsal", "recipe_overrides")))
        raise RefusedError(
            f"{path}:{line}: rehearsal.recipe_overrides: {', '.join(bad_override)} may not be overridden "
            f"(only {', '.join(REHEARSAL_OVERRIDABLE)}); remove it"
        )
    if overrides.get("policy_group_size") and protocol.launcher.nproc % overrides["policy_group_size"]:
        line = line_of(node_at(root_node, ("rehearsal", "recipe_overrides")))
        raise RefusedError(f"{path}:{line}: rehearsal.recipe_overrides.policy_group_size must divide launcher.nproc")
    diffs = recipe_differences(protocol.recipe, overrides)
    if diffs:
        line = line_of(node_at(root_node, ("recipe", diffs[0][0])))
        listed = ", ".join(f"recipe.{k} = {g!r} (upstream {u!r})" for k, g, u in diffs)
        raise RefusedError(f"{path}:{line}: recipe differs from the frozen upstream recipe: {listed}; restore it")
    flags = launch_flag_differences(protocol)
    if flags:
        line = line_of(node_at(root_node, ("launcher", "args")))
        raise RefusedError(
            f"{path}:{line}: launcher.args do not carry the recipe: {'; '.join(flags)}; pass every recipe value"
        )
    again = recipe_overrides(protocol)
    if again:
        line = line_of(node_at(root_node, ("launcher", "args")))
        raise RefusedError(f"{path}:{line}: the recipe is set again behind its checked flag: {'; '.join(again)}; "
                           "remove the extra setting (the recipe is frozen)")
    shrink = shrinking_flags(protocol) if protocol.model is not None else []
    if shrink:
        line = line_of(node_at(root_node, ("launcher", "args")))
        raise RefusedError(
            f"{path}:{line}: launcher.args shrink the declared model ({protocol.model.layers} layers): "  # type: ignore[union-attr]
            f"{'; '.join(shrink)}; remove the flag (blinding covers the trainer's step-0 evaluation)"
        )
    m = protocol.measurement
    if not (0 <= m.digest_first <= m.digest_last < m.steps and m.warmup < m.steps and m.window >= 1):
        line = line_of(node_at(root_node, ("measurement",)))
        raise RefusedError(f"{path}:{line}: measurement: inconsistent steps/warm-up/windows/digest range")
    base = (path.parent / protocol.base).resolve()
    return LoadedProtocol(protocol=protocol, path=path.resolve(), base=base)


def json_schema() -> dict[str, Any]:
    return Protocol.model_json_schema(by_alias=True)
