"""The run record `run.json` (orch.run/2): RunRecord, which `orch launch` writes and the audit and calibration read
(a field not set yet is absent from the file, never null: bytes are kept); EarlierRun, what a launch reads of the
run.json of earlier runs, whatever their version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from protocol.hashing import canonical_json
from protocol.host.quiet_host import HostWatchRef
from protocol.sequential_run import SequentialRecord

RUN_SCHEMA = "orch.run/2"  # /2: the watched replay watch-C and the trainer's own numbers in the step lines
OLD_RUN_SCHEMAS = ("orch.run/1",)  # recorded before watch-C and trainer scalars: refused by the audit by name
RunStatus = Literal["running", "complete", "failed", "interrupted"]
PackageStatus = Literal["running", "ok", "failed", "timeout", "interrupted"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


M = TypeVar("M", bound=_Strict)


def _updated(model: M, fields: dict[str, Any]) -> M:
    """`model` with `fields` set, validated again; the fields set before stay set (and so in the file)."""
    return type(model).model_validate({**model.model_dump(by_alias=True, exclude_unset=True), **fields})


class HostFingerprint(_Strict):
    """The host a run ran on: GPU model and count, driver, CUDA, torch, triton, python; the name only hashed."""

    gpu_model: str
    gpu_count: int
    driver: str
    cuda: str
    torch: str
    triton: str
    python: str
    host_hash: str  # HMAC of the host name keyed by the ledger's salt
    # issue 52: what an A/A calibration must share with a run besides the above (None: recorded before)
    cpu_model: str | None = None
    kernel: str | None = None
    gpu_uuids: str | None = None  # HMAC of the sorted GPU UUIDs keyed by host_hash ("none": no GPU)


class ArmRecord(_Strict):
    """One arm as the run verified it: its commitment, the roots of its verified and sealed sources, its settings."""

    commitment: str  # the commitment file as the protocol names it
    commitment_root: str
    sources_root: str  # the included sources as hashed before the run
    sealed_root: str | None = None  # the whole sealed copy; set once the arm is sealed (absent before)
    # what the sealed copy holds beyond the include globs (in the seal, not in the commitment); set with sealed_root
    beyond_include: list[str] | None = None
    switches: dict[str, str]
    config: dict[str, str]
    source: Literal["tree"] | dict[str, str]  # "tree", or {"git": REV}
    under_evaluation: bool
    note: str | None  # how a candidate under evaluation differs from its commitment
    # the trainer's command line as orch renders it: script, the recipe's flags (rendered by orch for a protocol
    # without `recipe:`), launcher.args, the arm's config; placeholders ({trainer_dir}, ...) as the protocol writes them
    command: list[str] | None = None


class LockRecord(_Strict):
    kind: str  # gpu | cpu-slot | slurm
    devices: list[int]
    wait_s: float
    # seconds the lock was held, from the grant to the end of the plan and the scratch's removal; recorded when the
    # plan ends (None: a run recorded before it was, a Slurm allocation, or a run still holding the lock)
    held_s: float | None = None


class TrainerOutputs(_Strict):
    """The trainer's own outputs of a train or replay package, sealed in scratch (blinding): counts and a digest."""

    files: int
    bytes: int
    sha256: str
    kinds: dict[str, int]
    moved_from_run_dir: int


class TunedKernel(_Strict):
    """A kernel a package tuned itself (a pick not taken from the baseline's compile cache)."""

    kernel: str  # the @triton.jit function (Inductor) or the autotuned function (Triton)
    file: str  # its tuned file, relative to the package's cache folder
    pick: str  # the configuration it picked
    baseline_pick: str | None  # the baseline's pick for a kernel of that name, if the baseline tuned one
    rewritten: bool  # it rewrote a file copied from the baseline (else it made a new one)


class CacheUse(_Strict):
    """A package's compile cache against the run's sealed baseline cache (orchestrator/isolation/compile_cache.py)."""

    baseline_files: int  # files in the sealed baseline cache (the prime's own entry: what it made)
    baseline_tuned: int  # of them, tuned picks
    taken: int  # files of the baseline's still equal in the package's copy after it ran
    taken_tuned: int
    made: int  # files the package made itself
    made_tuned: int
    changed: int  # baseline files the package rewrote in its copy
    baseline_tuned_sha256: str  # digest of the picks of the baseline's kernels as the package left them
    tuned_sha256: str  # digest of every pick in the package's folder (its own ones too)
    own_kernels: list[TunedKernel]  # made or rewritten tuned picks (at most 50)
    # the prime's entry: every entry it sealed (folders, lock files and temporaries too) and the sha256 of the
    # manifest it wrote, compile-cache.baseline.json, which the audit reads back
    sealed_entries: int | None = None
    manifest_sha256: str | None = None
    # the prime's entry (issue 51): the steps it ran (it stops once a step adds nothing to the cache) of a launch's
    prime_steps: int | None = None
    launch_steps: int | None = None


class KeptCache(_Strict):
    """The baseline compile cache a run loaded (issue 51): one it found kept under its key, checked entry for entry
    against the manifest its sealing run recorded in the ledger (`reused`), or the one its own prime sealed and kept
    (with why no kept cache served: `reason`)."""

    key: str  # sha256 of the key fields (orchestrator/isolation/kept_cache.py)
    name: str  # its folder under the kept root: baseline-KEY16-RUN_ID
    reused: bool
    sealed_by: str  # the run whose prime sealed it
    sealed_at: str  # UTC
    manifest_sha256: str
    entries: int
    files: int
    tuned: int
    tuned_sha256: str
    prime_steps: int | None  # steps the sealing prime ran
    launch_steps: int | None
    prime_gpu_seconds: float | None  # what the sealing prime cost (paid once, in its run)
    reason: str | None = None  # why this run primed: no kept cache of its key, or what failed the check
    checked_s: float | None = None  # seconds the check of every entry took (reused)


class PackageEntry(_Strict):
    """One package of the plan as run.json records it: who it is when it starts; how it ended once it has."""

    name: str
    kind: Literal["checks", "prime", "train", "reload", "replay", "score"]
    arm_label: str | None
    arm: str | None
    env: dict[str, str]  # the package's environment, values of host-specific variables shown as "<set>"
    status: PackageStatus
    # set when the package has ended (absent while it runs)
    exit_code: int | None = None
    started: str | None = None
    ended: str | None = None
    wall_s: float | None = None
    gpus: int | None = None
    gpu_seconds: float | None = None
    result_sha256: str | None = None
    note: str | None = None
    isolation: str | None = None
    network: str | None = None  # namespace (its own: loopback and launcher.endpoints only), or host[: why]
    # present only when there is something to say
    stragglers: list[str] | None = None
    trainer_outputs: TrainerOutputs | None = None
    host_watch: HostWatchRef | None = None  # a train package: orch's samples of the host (host_watch.json)
    compile_cache: CacheUse | None = None  # every package after the prime (the prime: the sealed cache it made)
    # a train, replay or prime package: seconds of each start-up phase to the end of step 0 (orchestrator.run.startup)
    startup: dict[str, float] | None = None

    def finish(self, **fields: Any) -> PackageEntry:
        """This entry with how the package ended, validated."""
        return _updated(self, fields)


class SlurmRecord(_Strict):
    job_id: str
    nodes: list[str]  # HMAC of each node's name keyed by the ledger's salt


class VersionsChanged(_Strict):
    since_run: str  # the last earlier run of this protocol whose checks passed
    changes: dict[str, tuple[str | None, str]]  # name -> (before, now)


class CalibrationOf(_Strict):
    """An A/A run of `orch calibrate`: the protocol whose noise floor it measures."""

    protocol_id: str
    protocol_name: str
    # the calibration's first A/A launch, whose checks ran the GPU diagnostics: a later launch of it runs them again
    # only if the versions changed (the owner's rule: rerun the diagnostics after upgrades)
    diagnosed_by: str | None = None


class RunRecord(_Strict):
    """run.json: one `orch launch` from its start (status running) to its end (complete, failed, interrupted)."""

    schema_: Literal["orch.run/2"] = Field(alias="schema")
    run_id: str
    protocol_id: str
    protocol_name: str
    started: str
    ended: str | None
    status: RunStatus
    host: HostFingerprint
    lock: LockRecord | None
    packages: list[PackageEntry]
    arms: dict[str, ArmRecord]
    slurm: SlurmRecord | None = None
    versions_changed: VersionsChanged | None = None
    calibration_of: CalibrationOf | None = None
    sequential: SequentialRecord | None = None  # repeats: auto or --until-decided: the rule and its looks
    compile_cache: KeptCache | None = None  # the baseline compile cache every package loaded (issue 51)

    @classmethod
    def begin(
        cls, run_id: str, protocol_id: str, protocol_name: str, started: str, host: HostFingerprint,
        arms: dict[str, ArmRecord], calibration_of: CalibrationOf | None = None,
    ) -> RunRecord:
        """The record of a run that has just started: no lock, no package, not ended."""
        return cls.model_validate({
            "schema": RUN_SCHEMA, "run_id": run_id, "protocol_id": protocol_id, "protocol_name": protocol_name,
            "started": started, "ended": None, "status": "running", "host": host, "lock": None, "packages": [],
            "arms": arms, **({} if calibration_of is None else {"calibration_of": calibration_of}),
        })

    def package(self, name: str) -> PackageEntry | None:
        return next((p for p in self.packages if p.name == name), None)

    def updated(self, **fields: Any) -> RunRecord:
        """This record with `fields` set, validated (a record is never changed in place)."""
        return _updated(self, fields)

    def with_package(self, entry: PackageEntry) -> RunRecord:
        """This record with `entry` in place of the package of its name, or appended when it is new."""
        packages = [p for p in self.packages if p.name != entry.name]
        at = next((i for i, p in enumerate(self.packages) if p.name == entry.name), len(packages))
        return self.updated(packages=[*packages[:at], entry, *packages[at:]])

    def with_arm(self, name: str, **fields: Any) -> RunRecord:
        return self.updated(arms={**self.arms, name: _updated(self.arms[name], fields)})

    def to_bytes(self) -> bytes:
        """The bytes of run.json: canonical JSON, ASCII, one-space indents; unset fields absent."""
        doc = self.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return canonical_json(doc, ensure_ascii=True, pretty=True).encode()


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class EarlierPackage(_Lenient):
    name: str | None = None
    status: str | None = None


class EarlierRun(_Lenient):
    """What a launch reads of earlier runs' run.json of any version (orch.run/1 included): their fingerprint,
    their checks and whether they ended. Lenient by design: only the audit needs the whole record."""

    run_id: str | None = None
    protocol_id: str | None = None
    started: str = ""
    status: str | None = None
    host: dict[str, Any] | None = None
    packages: list[EarlierPackage] = []

    @classmethod
    def read(cls, path: Path) -> EarlierRun | None:
        """The earlier run recorded at `path`, or None when the file is missing, unreadable or not a run record."""
        try:
            return cls.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            return None
