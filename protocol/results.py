"""Versioned result documents that sealed workers hand back to the orchestrator, and the probe's step lines.

Workers write them (with torch); the orchestrator and the audit read them (without torch), strictly.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from protocol.host.clock import ClockCheck
from protocol.host.quiet_host import QuietHost


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ForbiddenOp(_Strict):
    """A tensor op in a numerical step whose inputs or output have a forbidden dtype (fp16, fp8, int8)."""

    op: str
    dtype: str
    step: int


class RngFingerprint(_Strict):
    """SHA256 (hex) of the generator states at a step boundary (before the step's work)."""

    cpu: str
    cuda: str | None = None


STEP_SCHEMA = "orch.step/2"  # /2 adds `scalars`, the trainer's own numbers
TRAIN_SCHEMA = "orch.train/2"  # /2 adds `watched_steps`, the optimizer's groups and trainable names
PROBE_SCHEMA: Literal["orch.probe/2"] = "orch.probe/2"  # probe.rank{R}.json: one rank, for the train worker


class StepRecord(_Strict):
    """One line of a rank's `steps.rank{R}.jsonl`: what the probe saw in one optimizer step.

    A step's window runs from the end of the previous boundary to this step's optimizer step, so what a trainer
    logs after `optimizer.step()` of step k (its per-step log line) is recorded with step k+1.
    """

    schema_: str = Field(STEP_SCHEMA, alias="schema")
    rank: int
    world_size: int
    step: int
    duration_s: float  # wall time of the step, probe work excluded (synchronized clock / CUDA events)
    probe_s: float  # time the probe itself spent at this step's boundary (digests, RNG, memory)
    # of probe_s: naming the tensors and digesting them (None: no digest at this boundary, or an older record)
    digest_s: float | None = None
    # the whole previous boundary (probe_s, then its record's write and the clock's restart): what the previous
    # step's duration excludes; None at step 0 and in older records (ledger/probe_cost.py reads both)
    prev_boundary_s: float | None = None
    lr: list[float]  # learning rate of each param group used by this step
    rng: RngFingerprint
    peak_allocated: int | None = None  # bytes, device; None on CPU
    peak_reserved: int | None = None
    digests: dict[str, str] | None = None  # name -> 128-bit hex, after optimizer.step(), digest steps only
    combined: str | None = None  # digest over sorted (name, digest) pairs
    forbidden: list[ForbiddenOp] = []
    watched: bool = False  # the forbidden-dtype watch was on during this step
    hops: dict[str, int] = {}  # higher-order operators / compiled regions the watch let through -> calls
    uninspected: list[str] = []  # what the watch could not look into during this step, in words
    # the trainer's own numbers in this step's window, name -> "dtype:raw bytes in hex": the scalar loss of each
    # backward() ("backward[i]"), each clip_grad_norm_ result ("grad_norm[i]"), numbers the trainer logged through
    # wandb.log ("wandb[i].KEY") or Python logging ("log[i] TEMPLATE#j"); timing, memory and evaluation values
    # are left out (they differ between launches or are blinded)
    scalars: dict[str, str] = {}


class ParamGroup(_Strict):
    """One optimizer parameter group as the trainer built it: how many tensors, how many elements, hyperparameters."""

    tensors: int
    numel: int
    hyper: dict[str, str]  # name -> repr of the value (lr is the base lr), implementation flags left out


class ObservedRecipe(_Strict):
    """The recipe as the trainer actually used it, read from the live optimizer at step 0."""

    optimizer: str
    lr: float  # base lr (param_group['initial_lr'] when a scheduler is attached, else 'lr')
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    max_grad_norm: float | None = None  # from torch.nn.utils.clip_grad_norm_, when the trainer calls it
    warmup_steps: int | None = None  # first step whose lr reaches the base lr
    frozen: list[str] = []  # names of parameters with requires_grad=False (e.g. the ViT)
    trainable_params: int = 0
    frozen_params: int = 0
    layers: dict[str, int] = {}  # '<prefix>.layers' -> distinct layer indices seen in the trained module's names
    trainable: list[str] = []  # names of the trained module's parameters with requires_grad=True (collapsed)
    optimizer_params: int = 0  # elements in the optimizer's parameter groups
    param_groups: list[ParamGroup] = []


class RankSummary(_Strict):
    rank: int
    steps_file: str  # relative to the package directory
    steps_sha256: str
    steps: int
    final_combined: str  # combined digest of parameters and optimizer state after the last step
    final_digests: dict[str, str]
    peak_allocated: int | None = None  # max over steps
    peak_reserved: int | None = None
    checkpoint_file: str | None = None  # relative to the scratch directory; None for the watched replay
    checkpoint_sha256: str | None = None
    host_controls: dict[str, str] = {}  # what the probe applied to this rank (same for every arm)
    clock: ClockCheck | None = None  # the step times cross-checked against the train worker's clock
    startup: dict[str, float] = {}  # the probe's start-up times of this rank (ProbeSummary.startup)


class ProbeSummary(_Strict):
    """`probe.rank{R}.json`: what the probe of one rank hands the train worker when the rank ends (complete or not)."""

    schema_: Literal["orch.probe/2"] = Field(PROBE_SCHEMA, alias="schema")
    rank: int
    world_size: int
    complete: bool  # the rank reached the protocol's step count and was stopped by the probe
    steps: int  # steps recorded
    steps_file: str  # relative to the package directory
    steps_sha256: str
    final_digests: dict[str, str]  # empty when the rank never reached its last digest step
    final_combined: str | None
    observed_recipe: ObservedRecipe | None  # None: the probe saw no optimizer step
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    checkpoint_file: str | None = None  # written only by a complete rank with a checkpoint folder
    checkpoint_sha256: str | None = None
    other_optimizer_steps: int = 0  # step() calls of optimizers other than the first (not training steps)
    host_controls: dict[str, str] = {}
    watched_steps: list[int] = []
    logged_calls: int = 0  # logger / wandb calls with at least one number
    clock_replaced: dict[str, int] = {}  # time.<name> the trainer replaced -> first step it was seen
    # Unix times of the rank's start-up: process (created), probe (its main), torch (the trainer imported it),
    # installed (the probe's hooks), step0_end (the first optimizer step ended); informational, never a measurement
    startup: dict[str, float] = {}


class TrainResult(_Strict):
    schema_: str = Field(TRAIN_SCHEMA, alias="schema")
    arm: str
    world_size: int
    steps: int
    digest_steps: list[int]
    device: str  # "cpu" or "cuda"
    observed_recipe: ObservedRecipe
    ranks: list[RankSummary]
    stopped_cleanly: bool
    watched_steps: list[int] = []  # steps the forbidden-dtype watch covered (all of them in the watched replay)
    quiet_host: QuietHost | None = None  # what else the host did while this package ran (observed only)
    startup: dict[str, float] = {}  # Unix times: worker (its process created), torchrun (started by the worker)


class ReloadRank(_Strict):
    rank: int
    checkpoint_sha256: str
    combined: str
    digests: dict[str, str]


class ReloadResult(_Strict):
    schema_: str = Field("orch.reload/1", alias="schema")
    arm: str
    world_size: int
    ranks: list[ReloadRank]


class Diagnostic(_Strict):
    name: str
    command: list[str]
    ok: bool
    exit_code: int
    output_sha256: str
    expected_sha256: str | None = None
    detail: str = ""
    wall_s: float | None = None  # the command's wall time (results before it: none)


class ChecksResult(_Strict):
    schema_: str = Field("orch.checks/1", alias="schema")
    versions: dict[str, str]  # python, torch, triton, cuda, driver, gpu_model, gpu_count
    prepare: list[Diagnostic] = []  # the protocol's prepare commands (ok = exit 0), run before the diagnostics
    diagnostics: list[Diagnostic]
    precision_ok: bool
    precision_detail: str = ""
    # set when the diagnostics were not run again: the run whose checks ran them under these same versions
    diagnosed_by: str | None = None


class ScoreResult(_Strict):
    """What leaves the score package: the sealed metrics file's name and SHA256, never its content."""

    schema_: str = Field("orch.score/1", alias="schema")
    sealed_file: str
    sealed_sha256: str
