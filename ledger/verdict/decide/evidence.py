"""Loading one run's evidence for the audit: run.json, protocol.json, the ledger's records, every result and step line.

Nothing is computed or written here; an incomplete run raises IncompleteRunError naming every missing piece.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ledger.cost.record import LedgerRecord
from ledger.cost.store import Ledger
from ledger.verdict.decide.sequential_doc import triplets_taken
from protocol.errors import FailedError, RefusedError, UsageError
from protocol.fileio import read_regular
from protocol.hashing import sha256_file
from protocol.home import Home
from protocol.plan import AFTER_TRIPLETS, launch_labels, package_names, replay_label
from protocol.recipe import RUN_COPY as RECIPE_RUN_COPY
from protocol.recipe import LoadedRecipe, parse_recipe, v1_recipe
from protocol.results import ChecksResult, ReloadResult, ScoreResult, StepRecord, TrainResult
from protocol.run_record import OLD_RUN_SCHEMAS, RUN_SCHEMA, RunRecord
from protocol.schema import Protocol

PACKAGES = package_names(1)  # the owner's run; with measurement.repeats K the plan lists package_names(K)
M = TypeVar("M", bound=BaseModel)


class IncompleteRunError(FailedError):
    """The run cannot be audited; `problems` says exactly what is missing or failed."""

    def __init__(self, message: str, problems: Sequence[str]) -> None:
        super().__init__(message)
        self.problems = list(problems)


@dataclass
class RunEvidence:
    """Everything the audit reads of one run, loaded and validated, nothing computed yet."""

    run_id: str
    run_dir: Path
    run: RunRecord
    protocol: Protocol
    protocol_sha256: str
    checks: ChecksResult
    trains: dict[str, TrainResult]
    reloads: dict[str, ReloadResult]
    score: ScoreResult | None  # None: an A/A launch of `orch calibrate` (no scorer)
    steps: dict[str, dict[int, list[StepRecord]]]
    # watch-C: the untimed replay of arm C with the forbidden-dtype watch on every step (None: an A/A launch)
    watch: TrainResult | None
    watch_steps: dict[int, list[StepRecord]]
    records: list[LedgerRecord]  # this run's ledger records, in ledger order
    closes: dict[str, LedgerRecord]  # package -> its close record
    result_sha256: dict[str, str]  # package -> sha256 of its result.json bytes
    names: tuple[str, ...] = PACKAGES  # the plan's packages
    triplets: int = 1  # the triplets taken: measurement.repeats, or as many as a sequential run's rule took
    sequential: bool = False  # repeats: auto or --until-decided: labels numbered from A1 (protocol/plan.py)
    recipe: LoadedRecipe | None = None  # the frozen recipe file (its copy in the run folder; R3's for protocol/1)

    @property
    def repeats(self) -> int:
        return self.triplets


def _run_recipe(run_dir: Path, protocol: Protocol, problems: list[str]) -> LoadedRecipe | None:
    """The run's frozen recipe: the copy beside protocol.json, whose sha256 must be the protocol's (orch.protocol/2),
    or R3's recipe file for an orch.protocol/1 run."""
    ref = protocol.recipe_file
    try:
        if ref is None:
            return v1_recipe()
        path = run_dir / RECIPE_RUN_COPY
        if not path.is_file():
            problems.append(f"{RECIPE_RUN_COPY}: missing (the copy of the protocol's recipe file {ref.path})")
            return None
        raw = path.read_bytes()
        if hashlib.sha256(raw).hexdigest() != ref.sha256:
            problems.append(f"{RECIPE_RUN_COPY}: its sha256 is not protocol.json's recipe_file.sha256 "
                            "(the recipe copy was altered)")
            return None
        return parse_recipe(path, raw, ref.path)
    except RefusedError as err:
        problems.append(f"{RECIPE_RUN_COPY}: {err.message}")
        return None


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"]) or "document"
    return f"{loc}: {e['msg']}"


def _load_model(model: type[M], path: Path, problems: list[str], rel: str) -> M | None:
    if not os.path.lexists(path) or (path.is_dir() and not path.is_symlink()):
        problems.append(f"{rel}: missing")
        return None
    try:  # what a package wrote: a link is refused, never followed (protocol.fileio.read_regular)
        return model.model_validate_json(read_regular(path))
    except ValidationError as err:
        problems.append(f"{rel}: malformed ({_first_error(err)})")
    except OSError as err:
        problems.append(f"{rel}: unreadable ({err.strerror})")
    return None


def _load_run(path: Path, run_id: str, problems: list[str]) -> RunRecord | None:
    """run.json through its model; an orch.run/1 record is refused in one line before anything else."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        problems.append("run.json: missing (the launch never got past its start)")
        return None
    except OSError as err:
        problems.append(f"run.json: unreadable ({err.strerror})")
        return None
    try:
        doc = json.loads(data)
    except ValueError as err:
        problems.append(f"run.json: malformed ({err})")
        return None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema in OLD_RUN_SCHEMAS:
        # such a run has no watched replay and no trainer numbers to compare
        raise IncompleteRunError(
            f"run {run_id} is an {schema} run, recorded before the watched replay (watch-C) and the trainer's "
            "own numbers were part of the evidence; it cannot be audited by this orch: relaunch the protocol",
            [f"run.json: {schema} (before watch-C and trainer scalars); relaunch the protocol"],
        )
    if schema != RUN_SCHEMA:
        problems.append(f"run.json: not an {RUN_SCHEMA} document")
        return None
    try:
        return RunRecord.model_validate(doc)
    except ValidationError as err:
        problems.append(f"run.json: malformed ({_first_error(err)})")
        return None


def _package_problems(
    run: RunRecord | None, records: Sequence[LedgerRecord], names: Sequence[str] = PACKAGES
) -> tuple[list[str], dict[str, LedgerRecord], set[str]]:
    """One line per package that is not ok, from the ledger (authoritative) and run.json; and the close records.

    Every package needs one open and one ok close record; a lone open record means a crash or a live run.
    """
    problems: list[str] = []
    closes: dict[str, LedgerRecord] = {}
    opens: dict[str, int] = {}
    for rec in records:
        if rec.status == "open":
            opens[rec.package] = opens.get(rec.package, 0) + 1
        else:
            closes[rec.package] = rec
    bad: set[str] = set()
    for name in names:
        close, entry = closes.get(name), None if run is None else run.package(name)
        line = None
        if opens.get(name, 0) and close is None:
            line = "open ledger record without a close (the run crashed or is still running)"
        elif close is None:
            line = "no ledger record"
        elif close.status != "ok":
            code = f" (exit {close.exit_code})" if close.exit_code is not None else ""
            line = f"{close.status}{code}" + (f": {close.note}" if close.note else "")
        elif run is not None and entry is None:
            line = "ok in the ledger but absent from run.json"
        elif entry is not None and entry.status != "ok":
            line = f"ok in the ledger but {entry.status!r} in run.json"
        if line is not None:
            bad.add(name)
            problems.append(f"package {name}: {line}")
    return problems, closes, bad


def _read_steps(
    package_dir: Path, train: TrainResult, rel: str, n_steps: int, problems: list[str]
) -> dict[int, list[StepRecord]]:
    out: dict[int, list[StepRecord]] = {}
    for rank in train.ranks:
        path = package_dir / rank.steps_file
        where = f"{rel}/{rank.steps_file}"
        if not os.path.lexists(path) or (path.is_dir() and not path.is_symlink()):
            problems.append(f"{where}: missing")
            continue
        try:
            text = read_regular(path).decode()
        except (OSError, UnicodeDecodeError) as err:
            problems.append(f"{where}: unreadable ({getattr(err, 'strerror', None) or err})")
            continue
        lines: list[StepRecord] = []
        for number, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                lines.append(StepRecord.model_validate_json(raw))
            except ValidationError as err:
                problems.append(f"{where}:{number}: malformed step line ({_first_error(err)})")
                break
        if sorted(r.step for r in lines) != list(range(n_steps)):
            problems.append(f"{where}: {len(lines)} step lines, expected steps 0-{n_steps - 1}")
        if any(r.rank != rank.rank for r in lines):
            problems.append(f"{where}: lines of another rank than {rank.rank}")
        out[rank.rank] = lines
    return out


def compile_cache_manifest_problems(run_dir: Path, run: RunRecord | None) -> list[str]:
    """The sealed baseline cache's manifest, read back: its sha256 is the one the prime's entry of run.json recorded
    when orch wrote it, and it lists as many entries as were sealed (a run recorded before the manifest digest: [])."""
    prime = None if run is None else run.package("prime")
    sealed = None if prime is None else prime.compile_cache
    kept = None if run is None else run.compile_cache
    if sealed is not None:
        digest, entries = sealed.manifest_sha256, sealed.sealed_entries
    elif kept is not None and kept.reused:  # a kept cache loaded instead of a prime (issue 51)
        digest, entries = kept.manifest_sha256, kept.entries
    else:
        return []
    if digest is None:
        return []
    if kept is not None and kept.manifest_sha256 != digest:
        return ["run.json: the compile cache it says every package loaded is not the one its prime sealed"]
    rel = "compile-cache.baseline.json"
    try:
        raw = read_regular(run_dir / rel)
    except FileNotFoundError:
        return [f"{rel}: missing (the prime sealed the baseline's compile cache)"]
    except OSError as err:
        return [f"{rel}: unreadable ({err.strerror})"]
    if hashlib.sha256(raw).hexdigest() != digest:
        return [f"{rel}: its sha256 is not the one the prime recorded in run.json"]
    try:
        doc = json.loads(raw)
        count = len(doc["files"]) + len(doc["folders"])
    except (ValueError, KeyError, TypeError):
        return [f"{rel}: malformed"]
    if entries is not None and count != entries:
        return [f"{rel}: lists {count} entries, the prime sealed {entries}"]
    return []


read_steps = _read_steps  # the launch's sequential looks read a train package's step lines as the audit does


def collect_evidence(home: Home, run_id: str) -> RunEvidence:
    """Load one run; raise IncompleteRunError naming every missing or failed piece (nothing is written)."""
    run_dir = home.run_dir(run_id)
    if not run_dir.is_dir():
        raise UsageError(f"no run {run_id!r} under {home.runs}; give a run id printed by `orch launch`")
    problems: list[str] = []
    run = _load_run(run_dir / "run.json", run_id, problems)
    if run is not None:
        if run.run_id != run_id:
            problems.append(f"run.json: run_id {run.run_id!r} is not {run_id!r}")
        if run.status != "complete":
            problems.append(f"run status is {run.status!r}, not 'complete'")
    protocol: Protocol | None = None
    proto_path = run_dir / "protocol.json"
    protocol_sha = ""
    proto_problems: list[str] = []
    if proto_path.is_file():
        protocol_sha = sha256_file(proto_path)
        protocol = _load_model(Protocol, proto_path, proto_problems, "protocol.json")
    else:
        proto_problems.append("protocol.json: missing")
    recipe = _run_recipe(run_dir, protocol, proto_problems) if protocol is not None else None
    records = Ledger(home.ledger_path).records(run_id)
    repeats, sequential = (triplets_taken(protocol.measurement, run, (r.package for r in records)) if protocol
                           else (1, False))
    # a run recorded before the prime package existed has none: its plan is read without it
    primed = any(r.package == "prime" for r in records) or (run is not None and run.package("prime") is not None)
    # an A/A launch of `orch calibrate` ends after its triplet (protocol.plan); one recorded before that change ran the
    # watched replay and the scorer, and is read with them. Only a run that names its calibration may lack them.
    calibration = (run is not None and run.calibration_of is not None
                   and not any(r.package in AFTER_TRIPLETS for r in records)
                   and all(run.package(name) is None for name in AFTER_TRIPLETS))
    # an A/A launch runs no reload after its last timed launch since issue 51; one recorded before is read with it
    trailing = package_names(repeats, sequential, primed, calibration, True)[-1]
    reloaded = not calibration or any(r.package == trailing for r in records) or (
        run is not None and run.package(trailing) is not None)
    names = package_names(repeats, sequential, primed, calibration, reloaded)
    package_problems, closes, bad = _package_problems(run, records, names)
    problems += package_problems + proto_problems

    pkg_dir = run_dir / "packages"
    # a package already reported as not ok is not reported again for its missing result
    sink: list[str] = []

    def where(name: str) -> list[str]:
        return sink if name in bad else problems

    checks = _load_model(
        ChecksResult, pkg_dir / "checks" / "result.json", where("checks"), "packages/checks/result.json"
    )
    # only a later A/A launch of a calibration may leave its diagnostics to the launch its run record names
    named = run.calibration_of.diagnosed_by if run is not None and run.calibration_of is not None else None
    if checks is not None and checks.diagnosed_by is not None and checks.diagnosed_by != named:
        problems.append(f"packages/checks/result.json: the diagnostics were left to run {checks.diagnosed_by}, which "
                        "this run's record does not name (only a later A/A launch of a calibration may)")
    score = None if calibration else _load_model(
        ScoreResult, pkg_dir / "score" / "result.json", where("score"), "packages/score/result.json")
    trains: dict[str, TrainResult] = {}
    reloads: dict[str, ReloadResult] = {}
    steps: dict[str, dict[int, list[StepRecord]]] = {}
    n_steps = protocol.measurement.steps if protocol else 0
    for label in launch_labels(repeats, sequential):
        rel = f"packages/train-{label}"
        train = _load_model(TrainResult, run_dir / rel / "result.json", where(f"train-{label}"), f"{rel}/result.json")
        if train is not None:
            if train.arm != label:
                problems.append(f"{rel}/result.json: arm {train.arm!r}, expected {label!r}")
            trains[label] = train
            if protocol is not None:
                steps[label] = _read_steps(run_dir / rel, train, rel, n_steps, problems)
        rrel = f"packages/reload-{label}"
        if f"reload-{label}" not in names:
            continue
        reload = _load_model(
            ReloadResult, run_dir / rrel / "result.json", where(f"reload-{label}"), f"{rrel}/result.json"
        )
        if reload is not None:
            if reload.arm != label:
                problems.append(f"{rrel}/result.json: arm {reload.arm!r}, expected {label!r}")
            reloads[label] = reload
    watch_rel = "packages/watch-C"
    watch = None if calibration else _load_model(
        TrainResult, run_dir / watch_rel / "result.json", where("watch-C"), f"{watch_rel}/result.json")
    watch_steps: dict[int, list[StepRecord]] = {}
    if watch is not None:
        if watch.arm != replay_label(repeats, sequential):
            problems.append(f"{watch_rel}/result.json: arm {watch.arm!r}, expected "
                            f"{replay_label(repeats, sequential)!r}")
        if protocol is not None:
            watch_steps = _read_steps(run_dir / watch_rel, watch, watch_rel, n_steps, problems)
    problems += compile_cache_manifest_problems(run_dir, run)
    result_sha = {
        name: sha256_file(pkg_dir / name / "result.json")
        for name in names
        if (pkg_dir / name / "result.json").is_file()
    }
    if (problems or bad or run is None or protocol is None or checks is None
            or (not calibration and (score is None or watch is None))):
        raise IncompleteRunError(
            f"run {run_id} is not complete ({len(problems)} problem(s)); no audit was written and no score "
            "is shown; relaunch the protocol for a complete run",
            problems,
        )
    return RunEvidence(
        run_id=run_id,
        run_dir=run_dir,
        run=run,
        protocol=protocol,
        protocol_sha256=protocol_sha,
        checks=checks,
        trains=trains,
        reloads=reloads,
        score=score,
        steps=steps,
        watch=watch,
        watch_steps=watch_steps,
        records=records,
        recipe=recipe,
        closes=closes,
        result_sha256=result_sha,
        names=names,
        triplets=repeats,
        sequential=sequential,
    )
