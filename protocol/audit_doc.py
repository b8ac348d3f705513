"""The published shape of the audit (`audit.json`, orch.audit/1) and of the evidence file (orch.evidence/1).

`orch schema --kind audit|evidence` prints their JSON Schemas; times are seconds unless a field says otherwise.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from protocol.run_record import CalibrationOf


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArmTimes(_Doc):
    A: float = Field(description="baseline A, seconds")
    C: float = Field(description="candidate, seconds")
    B: float = Field(description="baseline B, seconds")


class ArmSeries(_Doc):
    A: list[float] = Field(description="baseline A, seconds per step")
    C: list[float] = Field(description="candidate, seconds per step")
    B: list[float] = Field(description="baseline B, seconds per step")


class Window(_Doc):
    name: str = Field(description="w1, w2, ...")
    steps: list[int] = Field(description="the window's steps (inclusive)")
    A: float = Field(description="baseline A window time: the SUM of its steps' times, seconds (not a step time)")
    C: float = Field(description="candidate window time: sum of its steps' times, seconds")
    B: float = Field(description="baseline B window time: sum of its steps' times, seconds")
    step_times: ArmSeries = Field(description="each step of the window, seconds (max over ranks)")
    cv: ArmTimes = Field(description="coefficient of variation of the window's step times per arm (unitless)")
    ratio: float = Field(description="mean(A, B) / C (unitless; > 1 means the candidate is faster)")
    drift: float = Field(description="|A - B| / mean(A, B) (unitless)")
    noise: float = Field(description="the window's noise estimate (unitless, relative)")
    within_noise: bool
    words: str


class Speedup(_Doc):
    windows: list[Window]
    headline: float = Field(description="min over the windows of the ratio (unitless)")
    headline_window: str
    max_drift: float
    drift_bound: float
    noisy: bool
    words: str
    step_times: ArmSeries = Field(description="every step of each arm, seconds (max over ranks, probe excluded)")


class MismatchDoc(_Doc):
    check: str
    step: int | None
    rank: int | None
    tensor: str | None
    values: dict[str, str | None]
    text: str


class ForbiddenDoc(_Doc):
    arm: str
    rank: int
    step: int
    op: str
    dtype: str


class WatchDoc(_Doc):
    watched_steps: int = Field(description="(arm, rank, step) lines recorded with the forbidden-dtype watch on")
    passed_through: dict[str, int] = Field(description="higher-order operators / compiled regions let through -> calls")
    uninspected: list[str] = Field(description="what the watch could not look into")


class ExactnessDoc(_Doc):
    exact: bool
    ranks: int
    digest_steps: list[int] = Field(description="first and last digest step (inclusive)")
    steps_compared: int
    tensors_compared: int
    mismatches: int
    first_mismatch: MismatchDoc | None
    reload_equal: dict[str, bool]
    rng_equal: bool
    rng_first_mismatch: MismatchDoc | None
    recipe_equal: bool
    recipe_differences: list[str]
    forbidden: list[ForbiddenDoc]
    watch: WatchDoc | None = None
    watch_coverage: dict[str, list[int]] | None = Field(None, description="package -> steps the dtype watch covered")
    replay_equal: bool | None = Field(None, description="watch-C replayed train-C bit for bit (null: no replay)")
    replay_first_mismatch: MismatchDoc | None = None
    scalars_equal: bool | None = Field(None, description="the trainer's own numbers equal across arms")
    scalar_steps: list[int] | None = Field(None, description="first and last step of the compared trainer numbers")
    scalars_compared: int | None = None
    scalars_first_mismatch: MismatchDoc | None = None
    problems: list[str]


class Peak(_Doc):
    allocated: int | None = Field(description="bytes")
    reserved: int | None = Field(description="bytes")


class RankMemory(_Doc):
    rank: int
    A: Peak
    C: Peak
    B: Peak
    delta_allocated: int | None = Field(description="C - max(A, B), bytes")
    delta_reserved: int | None = Field(description="C - max(A, B), bytes")


class Memory(_Doc):
    device: str
    measured: bool
    ranks: list[RankMemory]
    max_delta_allocated: int | None = Field(description="bytes")
    max_delta_reserved: int | None = Field(description="bytes")


class Cost(_Doc):
    gpu_seconds: dict[str, float] = Field(description="GPU-seconds per package")
    total_gpu_seconds: float
    wall_s: dict[str, float] = Field(description="wall seconds per package")
    total_wall_s: float
    lock_wait_s: float | None = Field(description="seconds waited for the GPU lock (once per run)")


class Attribution(_Doc):
    label: str
    training_code_only: bool
    differs: list[str]
    commitment_roots: dict[str, str | None]
    sources_roots: dict[str, str | None]
    sealed_roots: dict[str, str | None]
    sources_differ: bool
    switches: dict[str, dict[str, str | None]]
    config: dict[str, dict[str, str | None]]


class Integrity(_Doc):
    seals_verified: list[str]
    result_sha256: dict[str, str | None]
    ledger_records: int


class LedgerHead(_Doc):
    size: int
    root: str = Field(pattern=r"^[0-9a-f]{64}$")


class AuditDocument(_Doc):
    """audit.json: the verdict of one complete run, from that run's packages only."""

    schema_: str = Field(alias="schema", description="orch.audit/2 (the paired interval); orch.audit/1 documents, "
                         "recorded before paired statistics, are shown as recorded")
    run_id: str
    protocol_id: str
    protocol_name: str
    audited_at: str = Field(description="UTC, ISO 8601")
    verdict: str = Field(description="accepted | no difference shown | not exact (noisy: audits before repeats)")
    direction: str | None = Field(None, description="faster | slower when accepted, else null")
    verdict_words: str | None = Field(None, description="the verdict in one sentence")
    exact: bool
    noisy: bool
    reasons: list[str]
    diagnostics: list[str] | None = Field(None, description="drift and other diagnostics, reported, not judged")
    scope: str
    measurement: dict[str, Any] = Field(description="the protocol's measurement section as recorded")
    precision: str
    recipe: dict[str, Any] | None = Field(
        None, description="the frozen recipe file (as the protocol names it), its sha256, name, trainer, the keys "
        "the probe observed and those carried by flags only")
    speedup: Speedup
    interval: dict[str, Any] | None = Field(
        None, description="orch.audit/2: the paired interval the verdict read (ledger.verdict.documents.interval_doc): "
        "estimate, low, high (unitless ratios; null when not bounded), level, nominal_level, method, triplets, "
        "log_speedups (d per triplet, natural log), paired_speedups, headlines, bounded, covers_one, sd, df, "
        "variance_source (pooled | run | calibration | none), spread_check, calibration_used, window_spread, "
        "half_width (relative), triplets_for_5pct, outliers (triplets, windows), sequential (rule, triplets, stop, "
        "GPU-seconds) or null, words. orch.audit/1: the unpaired launch-level interval with variance components")
    sequential: dict[str, Any] | None = Field(
        None, description="a run under a sequential rule (measurement.repeats: auto or --until-decided): the rule, "
        "each look replayed from the triplets, the triplets taken, the stop, the GPU-seconds of the decision and "
        "whether the run stopped where its rule stops (ledger.verdict.decide.sequential_doc); null for a fixed design")
    replication: dict[str, Any] | None = Field(
        None, description="the owner's headline of each triplet beside its paired speedup (ledger.verdict."
        "replication_doc)")
    exactness: ExactnessDoc
    memory: Memory
    cost: Cost
    attribution: Attribution
    integrity: Integrity
    versions: dict[str, str | None]
    host_hash: str | None
    calibration: dict[str, Any] | None = Field(
        None, description="this host's latest A/A calibration of the protocol id, or why there is none")
    isolation: dict[str, Any] | None = Field(
        None, description="each package's isolation and network as run.json recorded them, and in words what that "
        "left open (scan mode, the host's network, Slurm; docs/THREAT_MODEL.md)")
    quiet_host: dict[str, Any] | None = Field(None, description="per train package: how quiet the host was")
    host_watch: dict[str, Any] | None = Field(
        None, description="per train launch and window: foreign CPU and GPU use sampled through the launch, the "
        "threshold, and one sentence per busy window (ledger.verdict.decide.host_watch)")
    gpu_busy: dict[str, Any] | None = Field(
        None, description="GPU protocols: how busy the GPUs were per train launch and window (NVML, sampled by the "
        "host watch), launch-bound under 80%, the K = 1 width the calibration gives (ledger.verdict.decide.gpu_busy)")
    positions: dict[str, Any] | None = Field(
        None, description="each triplet's A/B log ratio u, its expected u and launch-position levels, and the "
        "calibration's position correction (issue 52; ledger.verdict.decide.decision.positions_doc)")
    statistics_rules: str | None = Field(
        None, description="which rules computed the interval ('issue-52'); an audit recorded under earlier rules is "
        "compared with a recomputation on its non-statistical parts only")
    clock: dict[str, Any] | None = Field(None, description="the step clock cross-check (kernel send stamps)")
    probe_cost: dict[str, Any] | None = Field(
        None, description="the probe's seconds at each timed step's boundary / the step's seconds, per launch and "
        "rank, with and without digests, the digest part split out (ledger.probe_cost); unitless fractions")
    calibration_of: CalibrationOf | None = Field(
        None, description="for an A/A run of `orch calibrate`: the protocol (id and name) whose noise it measures")
    compile_cache: dict[str, Any] | None = Field(
        None, description="the compile caches: what the prime sealed, what each launch took and tuned itself, the "
        "diagnosis (ledger.verdict.documents.compile_cache_doc); mode none: the packages checked to have compiled "
        "nothing")
    commands: dict[str, list[str]] | None = Field(
        None, description="each arm's trainer command as orch rendered it (run.json's arms.NAME.command)")
    ledger_head: LedgerHead


class EvidenceWindow(_Doc):
    name: str
    steps: list[int]
    A: float = Field(description="window time, sum of its steps, seconds")
    C: float = Field(description="window time, sum of its steps, seconds")
    B: float = Field(description="window time, sum of its steps, seconds")
    cv: ArmTimes
    ratio: float
    drift: float
    within_noise: bool


class EvidenceMismatch(_Doc):
    check: str
    step: int | None
    rank: int | None
    tensor: str | None


class EvidenceExactness(_Doc):
    exact: bool
    ranks: int
    digest_steps: list[int]
    tensors_compared: int
    mismatches: int
    first_mismatch: EvidenceMismatch | None
    reload_equal: dict[str, bool]
    rng_equal: bool
    recipe_equal: bool
    forbidden_ops: int


class EvidenceAttribution(_Doc):
    label: str
    training_code_only: bool
    differs: list[str]
    switches: dict[str, dict[str, str | None]]
    config_keys: list[str]


class EvidenceMemory(_Doc):
    device: str
    peaks: list[RankMemory]
    max_delta_allocated: int | None
    max_delta_reserved: int | None


class EvidenceDocument(_Doc):
    """docs/validation/NAME.json written by `orch publish`: aggregate figures only, hygiene-checked."""

    schema_: str = Field(alias="schema", description="orch.evidence/1")
    run_id: str
    protocol_id: str
    protocol_name: str
    audit_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    audited_at: str
    verdict: str
    direction: str | None = Field(None, description="faster | slower when accepted")
    interval: dict[str, Any] | None = Field(None, description="as in audit.json")
    replication: dict[str, Any] | None = Field(None, description="as in audit.json")
    diagnostics: list[str] | None = None
    clock: str | None = Field(None, description="the step clock cross-check in words")
    scope: str
    precision: str
    measurement: dict[str, Any]
    commitment_roots: dict[str, str | None]
    attribution: EvidenceAttribution
    versions: dict[str, str | None]
    host_hash: str | None
    windows: list[EvidenceWindow]
    headline: float
    headline_window: str
    max_drift: float
    drift_bound: float
    noisy: bool
    exactness: EvidenceExactness
    memory: EvidenceMemory
    gpu_seconds: dict[str, float]
    total_gpu_seconds: float
    ledger_head: LedgerHead
    ledger_id: str | None = Field(None, description="the ledger whose head this is (checked by `orch audit`)")
