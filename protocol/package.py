"""The sealed spec of one package (`package.json`): what a worker runs, with what, and where it writes.

Written by the launcher, validated strictly by the worker; its SHA256 is one of the package's input digests.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

PACKAGE_SCHEMA = "orch.package/1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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


class PackageSpec(_Strict):
    schema_: str = Field(PACKAGE_SCHEMA, alias="schema")
    run_id: str
    name: str  # checks | train-A | reload-A | ... | score
    kind: str  # checks | train | reload | score
    arm_label: str | None = None  # A | C | B
    arm: str | None = None  # baseline | candidate
    package_dir: str  # where result.json, logs and probe lines go
    sealed_dir: str  # cwd of the package: the arm's read-only copy
    scratch_dir: str
    ckpt_dir: str | None = None
    result_path: str
    device: str  # cpu | cuda
    precision: str
    nproc: int = 1
    backend: str = "gloo"
    script: str | None = None
    args: list[str] = []
    steps: int = 16
    warmup: int = 10
    window: int = 2  # steps per timing window (the step clock checks each window's time)
    digest_first: int = 0
    digest_last: int = 13
    host_controls: list[str] = []
    watch_all: bool = False  # train: the untimed watched replay (forbidden-dtype watch on every step, no checkpoint)
    inputs: dict[str, str] = {}  # name -> sha256 of an input file (init state, checkpoint, ...)
    prepare: list[CommandSpec] = []  # checks: commands that make the shared inputs (e.g. the initial state)
    diagnostics: list[CommandSpec] = []  # checks: the protocol's diagnostic commands
    static_graph: CommandSpec | None = None  # checks
    score_targets: list[ScoreTarget] = []  # score
    sealed_metrics_path: str | None = None  # score: where the DEV metrics go (never printed)
    slurm: SlurmStep | None = None  # train/replay under launcher.scheduler slurm (left out of package.json if None)

    def path(self, field: str) -> Path:
        return Path(str(getattr(self, field)))
