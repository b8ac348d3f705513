"""The protocol.yaml model (pydantic v2, frozen, extra="forbid"), its loader and its rules (YAML: protocol_yaml.py).

A protocol freezes one experiment; its id is the SHA256 of its canonical JSON. Refusals name file, line and field.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from protocol.errors import RefusedError
from protocol.hashing import canonical_json as dumps_canonical
from protocol.plan import DEFAULT_MAX_REPEATS, DEFAULT_TARGET_HALF_WIDTH, MAX_REPEATS
from protocol.protocol_yaml import field_name, line_of, node_at, parse_yaml, read_text
from protocol.recipe import ALLOWED_PRECISIONS, LoadedRecipe, Value, load_recipe, recipe_flags, v1_recipe
from protocol.recipe_rules import Checked, check_recipe, normalized_values, reinit_command

PROTOCOL_SCHEMA = "orch.protocol/2"  # /2 names its frozen recipe file; /1 documents were written under R3's
HostControl = Literal["pin_cpus", "gc_at_boundaries"]
HOST_CONTROLS: tuple[HostControl, ...] = ("pin_cpus", "gc_at_boundaries")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RecipeFileRef(_Frozen):
    """The frozen recipe file (docs/RECIPES.md) and the SHA256 of its bytes: part of the protocol's id."""

    path: str = Field(description="relative to the protocol's base, e.g. recipes/r3_tree_rl_bagel7b.yaml")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA256 of the recipe file's bytes")


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


def endpoint(text: str) -> tuple[str, int]:
    """(host, port) of a declared endpoint `HOST:PORT`: an IPv4 unicast address, localhost (127.0.0.1) or [::1]
    (a name could not be resolved inside the package's network namespace); ValueError with one line otherwise."""
    host, sep, port = text.rpartition(":")
    usage = (f"{text!r} is not HOST:PORT with HOST an IPv4 address, localhost or [::1] and PORT 1-65535, "
             "e.g. 127.0.0.1:8000")
    if not sep or not port.isdigit() or port != str(int(port)) or not 1 <= int(port) <= 65535:
        raise ValueError(usage)
    if host in ("localhost", "[::1]"):
        return ("127.0.0.1" if host == "localhost" else "::1"), int(port)
    try:
        addr = ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(usage) from None
    if addr.is_unspecified or addr.is_multicast or addr == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError(f"{text!r}: {host} is not one host's address; give the service's own address")
    return str(addr), int(port)


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
    endpoints: list[str] = Field(
        default_factory=list, max_length=64,
        description="TCP services outside the package that it may reach, as HOST:PORT (an IPv4 address, localhost "
        "or [::1]; e.g. a reward server the owner keeps external, a loopback judge): in namespace mode a package "
        "has a network of its own (loopback only) and reaches these alone, each at the same HOST:PORT "
        "(docs/THREAT_MODEL.md, sockets and the network)",
    )

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: list[str]) -> list[str]:
        for i, text in enumerate(value):
            try:
                endpoint(text)
            except ValueError as exc:
                raise ValueError(f"item {i + 1}: {exc}") from None
        if len(set(value)) != len(value):
            raise ValueError("endpoints lists one HOST:PORT twice; give each once")
        return value

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
    compile: Literal["prime", "none"] = Field(
        "prime",
        description="prime: an untimed run of the baseline fills the compile cache once, and every launch starts from "
        "its tuned kernels (a trainer that compiles); none: the trainer compiles nothing, no prime runs, and any "
        "package that compiles or tunes a kernel fails, named (the claim is checked, not trusted)",
    )
    prime_steps: int | None = Field(
        None, ge=1,
        description="compile: prime only: the prime runs this many of the steps (null: all of them). Set it where a "
        "rehearsal shows the trainer compiles nothing after that step; a baseline launch that compiles or tunes what "
        "the prime did not reach then keeps the run from being accepted, named (checked, not trusted)",
    )
    target_half_width: float | None = Field(
        DEFAULT_TARGET_HALF_WIDTH, gt=0, lt=1,
        description="repeats: auto only: stop once the repeated interval's relative half-width is at most this "
        "(null: stop only when decided or at the maximum)",
    )
    calibration_max_age_days: float = Field(
        7.0, gt=0,
        description="an A/A calibration (orch calibrate) speaks for this host only this many days after it was "
        "recorded; an older one is not used, and a one-triplet run without a younger one is not decided",
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

    @model_validator(mode="after")
    def _prime_steps(self) -> Measurement:
        if self.prime_steps is not None and self.compile != "prime":
            raise ValueError("prime_steps applies only to compile: prime (no prime runs under compile: none); remove "
                             "it")
        if self.prime_steps is not None and self.prime_steps > self.steps:
            raise ValueError(f"prime_steps {self.prime_steps} is more than the {self.steps} steps a launch runs; give "
                             f"at most {self.steps}, or remove it (the prime then runs all of them)")
        return self

    @property
    def primed_steps(self) -> int:
        """Steps the prime runs: prime_steps, else all of them."""
        return self.steps if self.prime_steps is None else self.prime_steps

    @property
    def sequential(self) -> bool:
        """repeats: auto: the number of triplets is decided while the run goes (ledger/verdict/decide/sequential.py)."""
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
        description="recipe keys a smaller host forces (only those its recipe file marks `rehearsal: "
        "divides_ranks`; each must divide the ranks)",
    )
    reason: str = ""


class Timeouts(_Frozen):
    checks: int = Field(900, gt=0, description="seconds")
    train: int = Field(1800, gt=0, description="seconds")
    reload: int = Field(600, gt=0, description="seconds")
    score: int = Field(900, gt=0, description="seconds")


class Protocol(_Frozen):
    schema_: Literal["orch.protocol/1", "orch.protocol/2"] = Field("orch.protocol/1", alias="schema")
    name: str
    base: str = Field("..", description="directory the protocol's paths are relative to, from the protocol file")
    recipe_file: RecipeFileRef | None = Field(None, description="orch.protocol/2: the frozen recipe file it gives")
    recipe: dict[str, Value] = Field(
        default_factory=dict, description="the frozen recipe's values, key for key (recipe_file); left out "
        "(orch.protocol/2, the short form): the file's values, and orch renders `--flag VALUE` of every key that has a "
        "flag before launcher.args")
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

    @model_validator(mode="after")
    def _recipe_file_named(self) -> Protocol:
        if self.schema_ == "orch.protocol/2" and self.recipe_file is None:
            raise ValueError("orch.protocol/2 names its frozen recipe file: add recipe_file (path, sha256); "
                             "see docs/RECIPES.md")
        if self.schema_ == "orch.protocol/1" and self.recipe_file is not None:
            raise ValueError("recipe_file needs schema: orch.protocol/2 (/1 protocols are read under R3's recipe)")
        if self.schema_ == "orch.protocol/1" and not self.recipe:
            raise ValueError("an orch.protocol/1 document gives its recipe: add recipe (or name recipe_file under "
                             "orch.protocol/2 and leave recipe out: orch renders its flags)")
        return self

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
    recipe: LoadedRecipe | None = None  # the frozen recipe file, as load_protocol read and checked it

    @property
    def id(self) -> str:
        return protocol_id(self.protocol)

    def frozen_recipe(self) -> LoadedRecipe:
        """The protocol's recipe file (R3's for orch.protocol/1), its digest checked again when read here."""
        return self.recipe if self.recipe is not None else protocol_recipe(self.protocol, self.base)

    def resolve(self, relative: str) -> Path:
        return (self.base / relative).resolve()


# top-level fields added after orch.protocol/1 was first published: left out of the canonical JSON while
# unset, so the id of every protocol written before them is unchanged
LATER_FIELDS = ("model", "rehearsal", "recipe_file")
# fields added later inside a section: at their default they stay out of the canonical JSON likewise
_LATER_DEFAULTS: dict[tuple[str, str], object] = {
    ("measurement", "repeats"): 1, ("launcher", "scheduler"): "local", ("launcher", "slurm"): None,
    ("measurement", "compile"): "prime", ("measurement", "prime_steps"): None, ("launcher", "endpoints"): [],
}

_LATER_DEFAULTS[("measurement", "calibration_max_age_days")] = 7.0  # issue 52

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


# parts of a protocol a triplet's baseline timing does not depend on: its name, the candidate arm, the DEV scorer,
# the timeouts and how many triplets it asks for
_NOT_BASELINE = ("name", "scorer", "timeouts")


def baseline_workload_id(protocol: Protocol) -> str:
    """SHA256 of what the baseline arm runs and how it is measured (the canonical JSON less _NOT_BASELINE, the
    candidate arm and the repeats): protocols that share it share an A/A calibration on one host (orch calibrate),
    e.g. a candidate's protocol and its null, whose baselines are the same."""
    data = json.loads(canonical_json(protocol))
    for key in _NOT_BASELINE:
        data.pop(key, None)
    data["arms"].pop("candidate", None)
    for key in ("repeats", *_SEQUENTIAL_KEYS):
        data["measurement"].pop(key, None)
    return hashlib.sha256(dumps_canonical(data, ensure_ascii=False).encode()).hexdigest()


def protocol_recipe(protocol: Protocol, base: Path) -> LoadedRecipe:
    """The frozen recipe file a protocol gives (orch.protocol/1: R3's), refused when its SHA256 is not the one the
    protocol commits to."""
    ref = protocol.recipe_file
    if ref is None:
        return v1_recipe()
    return load_recipe((base / ref.path).resolve(), ref.path, ref.sha256, lambda raw: reinit_command(
        protocol.sources.root, protocol.launcher.script, protocol.launcher.device, protocol.launcher.nproc, raw))


def rendered_recipe(protocol: Protocol, recipe: LoadedRecipe) -> Protocol:
    """The short form (no `recipe:`) as the explicit one: the recipe file's values, and `--flag VALUE` of every key
    that has a flag (in the file's order) rendered before launcher.args, so the trainer gets
    `SCRIPT <recipe flags> <launcher.args> <arm config>`. Its id is the id of that explicit protocol."""
    launcher = protocol.launcher.model_copy(update={"args": [*recipe_flags(recipe.recipe), *protocol.launcher.args]})
    return protocol.model_copy(update={"recipe": recipe.recipe.values(), "launcher": launcher})


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
    base = (path.parent / protocol.base).resolve()
    try:
        recipe = protocol_recipe(protocol, base)
    except RefusedError as err:
        line = line_of(node_at(root_node, ("recipe_file", "sha256" if "sha256" in err.message else "path")))
        raise RefusedError(f"{path}:{line}: {err.message}") from None
    rendered = not protocol.recipe  # the short form
    protocol = rendered_recipe(protocol, recipe) if rendered else protocol.model_copy(
        update={"recipe": normalized_values(protocol.recipe, recipe.recipe)})
    checked = Checked(
        recipe=protocol.recipe, args=protocol.launcher.args, nproc=protocol.launcher.nproc,
        overrides=protocol.rehearsal.recipe_overrides if protocol.rehearsal is not None else {},
        configs={arm: getattr(protocol.arms, arm).config for arm in ("baseline", "candidate")},
        model_layers=protocol.model.layers if protocol.model is not None else None,
        rendered=len(recipe_flags(recipe.recipe)) if rendered else 0,
    )
    check_recipe(path, root_node, checked, recipe.recipe, recipe.named)
    m = protocol.measurement
    if not (0 <= m.digest_first <= m.digest_last < m.steps and m.warmup < m.steps and m.window >= 1):
        line = line_of(node_at(root_node, ("measurement",)))
        raise RefusedError(f"{path}:{line}: measurement: inconsistent steps/warm-up/windows/digest range")
    return LoadedProtocol(protocol=protocol, path=path.resolve(), base=base, recipe=recipe)


def json_schema() -> dict[str, Any]:
    return Protocol.model_json_schema(by_alias=True)
