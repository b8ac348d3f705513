"""The sealed spec of one package (`package.json`): what a worker runs, with what, and where it writes.

Written by the launcher, validated strictly by the worker. A union keyed on `kind`: each kind carries only its fields
(orch.package/2); `parse_spec` also reads an orch.package/1 spec (one model with every field optional).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

# /2: one model per kind (checks, train and replay, reload, score)
PACKAGE_SCHEMA: Literal["orch.package/2"] = "orch.package/2"
PACKAGE_SCHEMA_V1: Literal["orch.package/1"] = "orch.package/1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class CommandSpec(_Strict):
    name: str
    argv: list[str]
    expect_sha256: str | None = None  # digest the command's stdout must have (static graph diagnostic)


class ScoreTarget(_Strict):
    """One checkpoint to score, with the sealed sources of the arm that produced it."""

    arm_label: str
    sealed_dir: str
    ckpt_dir: str
    argv: list[str]


class SlurmStep(_Strict):
    """How a train package spans the nodes of a Slurm allocation: one srun task a node, each running torchrun.

    No node name is kept here (package.json is evidence): each node finds the rendezvous host from Slurm itself.
    """

    srun: list[str]  # srun and its options, up to the command it runs
    nodes: int
    nproc_per_node: int
    port: int  # the c10d rendezvous port on the allocation's first node
    rdzv_id: str
    clock_dir: str  # where each node's step clock writes the kernel stamps it received (scratch)


class _SpecBase(_Strict):
    """What every package has: who it is, where it runs and writes, and on what device."""

    schema_: Literal["orch.package/2"] = Field(PACKAGE_SCHEMA, alias="schema")
    run_id: str
    name: str  # checks | train-A | reload-A | ... | watch-C | score
    arm_label: str | None = None  # A | C | B (A1, C1, ... with repeats)
    arm: str | None = None  # baseline | candidate
    package_dir: str  # where result.json, logs and probe lines go
    sealed_dir: str  # cwd of the package: the arm's read-only copy
    scratch_dir: str
    result_path: str
    device: str  # cpu | cuda
    precision: str
    nproc: int = 1
    backend: str = "gloo"
    inputs: dict[str, str] = {}  # name -> sha256 of an input file (init state, checkpoint, ...)

    def path(self, field: str) -> Path:
        return Path(str(getattr(self, field)))


class Diagnosed(_Strict):
    """An earlier launch of the same calibration whose checks ran every diagnostic and passed, and its versions."""

    run_id: str
    versions: dict[str, str]


class ChecksSpec(_SpecBase):
    kind: Literal["checks"] = "checks"
    prepare: list[CommandSpec] = []  # commands that make the shared inputs (e.g. the initial state)
    diagnostics: list[CommandSpec] = []  # the protocol's diagnostic commands
    static_graph: CommandSpec | None = None
    # an A/A launch after the calibration's first: the diagnostics and the static graph are not run again when this
    # host's versions equal those they passed under (any difference: they run)
    diagnosed: Diagnosed | None = None


class TrainSpec(_SpecBase):
    """A timed launch (train), the watched replay (replay, every step watched, no checkpoint) or the untimed prime of
    the baseline's compile cache (prime: the baseline's trainer, no checkpoint, before the first timed launch)."""

    kind: Literal["train", "replay", "prime"] = "train"
    script: str | None = None
    args: list[str] = []
    ckpt_dir: str | None = None
    steps: int = 16
    warmup: int = 10
    window: int = 2  # steps per timing window (the step clock checks each window's time)
    digest_first: int = 0
    digest_last: int = 13
    host_controls: list[str] = []
    watch_all: bool = False  # the untimed watched replay (forbidden-dtype watch, no checkpoint)
    # the replay watches steps watch_from..steps-1 (train-C watched 0..warmup-1; 0: every step, as before issue 51)
    watch_from: int = Field(0, ge=0)
    # the prime (issue 51): stop after the first step (from step 1) that added nothing to the compile cache on any rank
    until_compiled: bool = False
    slurm: SlurmStep | None = None  # under launcher.scheduler slurm (left out of package.json if None)


class ReloadSpec(_SpecBase):
    kind: Literal["reload"] = "reload"
    ckpt_dir: str | None = None


class ScoreSpec(_SpecBase):
    kind: Literal["score"] = "score"
    score_targets: list[ScoreTarget] = []
    sealed_metrics_path: str | None = None  # where the DEV metrics go (never printed)


PackageSpec = Annotated[ChecksSpec | TrainSpec | ReloadSpec | ScoreSpec, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[ChecksSpec | TrainSpec | ReloadSpec | ScoreSpec] = TypeAdapter(PackageSpec)
_KIND_FIELDS = {kind: set(model.model_fields) for kind, model in
                (("checks", ChecksSpec), ("train", TrainSpec), ("replay", TrainSpec), ("prime", TrainSpec),
                 ("reload", ReloadSpec), ("score", ScoreSpec))}


class PackageSpecV1(_Strict):
    """orch.package/1, as written before /2: one model, every kind's fields optional. Read, never written."""

    schema_: Literal["orch.package/1"] = Field(PACKAGE_SCHEMA_V1, alias="schema")
    run_id: str
    name: str
    kind: str
    arm_label: str | None = None
    arm: str | None = None
    package_dir: str
    sealed_dir: str
    scratch_dir: str
    ckpt_dir: str | None = None
    result_path: str
    device: str
    precision: str
    nproc: int = 1
    backend: str = "gloo"
    script: str | None = None
    args: list[str] = []
    steps: int = 16
    warmup: int = 10
    window: int = 2
    digest_first: int = 0
    digest_last: int = 13
    host_controls: list[str] = []
    watch_all: bool = False
    inputs: dict[str, str] = {}
    prepare: list[CommandSpec] = []
    diagnostics: list[CommandSpec] = []
    static_graph: CommandSpec | None = None
    score_targets: list[ScoreTarget] = []
    sealed_metrics_path: str | None = None
    slurm: SlurmStep | None = None


def parse_spec(data: str | bytes | dict[str, Any]) -> ChecksSpec | TrainSpec | ReloadSpec | ScoreSpec:
    """A package spec of either version (ValueError when it is neither): /1 is read into its kind's /2 model,
    keeping the fields that kind has (a /1 spec carried every kind's defaults)."""
    doc = json.loads(data) if isinstance(data, (str, bytes)) else dict(data)
    if isinstance(doc, dict) and doc.get("schema") == PACKAGE_SCHEMA_V1:
        old = PackageSpecV1.model_validate(doc)
        fields = _KIND_FIELDS.get(old.kind)
        if fields is None:
            raise ValueError(f"kind {old.kind!r} is not a package kind")
        kept = {k: v for k, v in old.model_dump(by_alias=False).items() if k in fields and k != "schema_"}
        return _ADAPTER.validate_python(kept)
    return _ADAPTER.validate_python(doc)
