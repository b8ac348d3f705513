"""The sequential stop inside `orch launch` (measurement.repeats: auto, or --until-decided): after each triplet from
the rule's first look on, the interval of the triplets recorded so far; the plan grows one triplet until the rule stops.

The look uses the audit's functions on the recorded train results: step lines -> window ratios -> d -> the rule's
repeated interval, with the host's calibration found as the audit finds it (ledger/verdict/decide/calibration.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from ledger.cost.store import Ledger
from ledger.verdict.decide.calibration import calibration_step_profile, calibration_step_spread, find_calibration
from ledger.verdict.decide.evidence import read_steps
from ledger.verdict.decide.noise import ArmSpread, NoiseEvidence, baseline_disagreement, triplet_arm_spread
from ledger.verdict.decide.sequential import SequentialRule
from ledger.verdict.decide.sequential_doc import Look, asked_record, calibration_spread, look, run_rule
from ledger.verdict.decide.stats import Spread, StepProfile, triplet_log_speedup
from ledger.verdict.decide.windows import speedup, step_times
from protocol.errors import FailedError
from protocol.home import Home
from protocol.plan import Triplet, triplets
from protocol.results import TrainResult
from protocol.run_record import HostFingerprint
from protocol.schema import LoadedProtocol, Measurement, baseline_workload_id
from protocol.sequential_run import SequentialRecord


class Lookup(Protocol):
    """What a calibration lookup reads of a run's context."""

    loaded: LoadedProtocol
    home: Home
    ledger: Ledger
    host: HostFingerprint


class RunContext(Lookup, Protocol):
    """What a sequential look reads and writes of orchestrator.run.run_plan.RunContext (typed here structurally, so
    that this module does not import run_plan, which imports it)."""

    run_id: str
    run_dir: Path
    sequential: SequentialState | None

    def update_run(self, **fields: Any) -> None: ...

    def write_run_json(self) -> None: ...


@dataclass
class SequentialState:
    """A sequential run while it goes: its rule, the triplets planned so far, their d, and the calibration used."""

    rule: SequentialRule
    record: SequentialRecord
    planned: int = 1  # triplets in the plan now (the last may still be running)
    d: list[float] = field(default_factory=list)
    calibration: Spread | None = None
    calibration_step: Spread | None = None  # the calibration's baseline step spread (the noise check, issue 34)
    profile: StepProfile | None = None  # the calibration's baseline step profile (noise.py)
    arms: list[ArmSpread | None] = field(default_factory=list)  # each triplet's step contrasts
    ab: list[float] = field(default_factory=list)  # each triplet's A/B contrast u (the A/B launch check, issue 34)
    calibration_words: str | None = None  # None until the first look looked the calibration up
    stop: str | None = None
    said: list[str] = field(default_factory=list)  # what the last look has to say, after its package's line


def begin(ctx: RunContext, until_decided: int | None, say: Callable[[str], None]) -> None:
    """A run under a sequential rule starts with one triplet planned; run.json records the rule and who asked."""
    m = ctx.loaded.protocol.measurement
    record = asked_record(m, until_decided)
    rule = run_rule(m, record)
    if record is None or rule is None:
        return
    ctx.sequential = SequentialState(rule, record)
    ctx.update_run(sequential=record)
    ctx.write_run_json()
    by = "measurement.repeats: auto" if record.asked == "protocol" else "--until-decided"
    say(f"sequential ({by}): triplets are added one at a time until the rule stops, at most {rule.max_triplets}")


def triplet_d(run_dir: Path, m: Measurement, t: Triplet,
              profile: StepProfile | None = None) -> tuple[float, ArmSpread | None, float]:
    """d of one recorded triplet: the mean log of its window ratios, from its train packages' step lines; its arms'
    step contrasts (about the calibration's step profile when given) and its A/B contrast u
    (ledger/verdict/decide/noise.py), as the audit reads them."""
    times: dict[str, list[float]] = {}
    for role, label in t.labels.items():
        rel = f"packages/train-{label}"
        problems: list[str] = []
        try:
            train = TrainResult.model_validate_json((run_dir / rel / "result.json").read_bytes())
        except (OSError, ValidationError) as err:
            raise FailedError(f"{rel}/result.json unreadable for the sequential look: {err}") from None
        steps = read_steps(run_dir / rel, train, rel, m.steps, problems)
        if problems:
            raise FailedError(f"the sequential look cannot read {rel}: {problems[0]}")
        times[role] = step_times(steps, m.steps)
    sp = speedup(times, steps=m.steps, warmup=m.warmup, window=m.window, drift_bound=m.drift_bound)
    return (triplet_log_speedup([w.ratio for w in sp.windows]), triplet_arm_spread(sp, profile),
            baseline_disagreement(sp))


def calibration_block(ctx: Lookup, before_seq: int | None, reference: str | None = None) -> dict[str, Any]:
    """This host's A/A calibrations of the run's protocol id or baseline workload as the audit finds them
    (find_calibration): recorded before the ledger record `before_seq`, their age counted to `reference` (default:
    that record's start), within the protocol's maximum age."""
    return find_calibration(ctx.home.runs, ctx.ledger.records(), ctx.loaded.id, ctx.host.model_dump(), before_seq,
                            baseline_workload_id(ctx.loaded.protocol),
                            ctx.loaded.protocol.measurement.calibration_max_age_days, reference)


def _find_calibration(ctx: RunContext, state: SequentialState) -> None:
    """As the audit finds it: this protocol id or baseline workload on this host, recorded before the run's first
    ledger record."""
    block = calibration_block(ctx, min((r.seq for r in ctx.ledger.records(ctx.run_id)), default=None))
    state.calibration = calibration_spread(block)
    state.calibration_step = calibration_step_spread(block)
    state.profile = calibration_step_profile(block)
    if state.calibration is not None:
        state.record = state.record.model_copy(update={"calibration_run": block.get("run_id")})
        state.calibration_words = (f"pooled with the A/A calibration of run {block.get('run_id')} (triplet SD "
                                   f"{state.calibration.sd:.4f}, df {state.calibration.df})")
    elif block.get("found"):
        state.calibration_words = (f"the calibration of run {block.get('run_id')} records no spread of the "
                                   "per-triplet d: the run's own spread only")
    else:
        state.calibration_words = f"{block.get('words')}: the run's own spread only"


def after_triplet(ctx: RunContext) -> Look | None:
    """After the last planned triplet ended ok: its d, and the look (from the rule's first look on), with the audit's
    own A/B launch check (sequential_doc.look). The plan grows by one triplet unless the rule stops; run.json records
    the look. Raises FailedError when it cannot look."""
    state = ctx.sequential
    assert state is not None
    m = ctx.loaded.protocol.measurement
    k = state.planned
    if state.calibration_words is None:  # first: the calibration's step profile shapes each triplet's contrasts
        _find_calibration(ctx, state)
        state.said.append(f"sequential rule: {state.rule.words}; the looks' spread is {state.calibration_words}")
    d, arms, ab = triplet_d(ctx.run_dir, m, triplets(k, sequential=True)[k - 1], state.profile)
    state.d.append(d)
    state.arms.append(arms)
    state.ab.append(ab)
    one = look(state.rule, state.d, state.calibration, NoiseEvidence(tuple(state.arms), state.calibration_step),
               state.ab)
    if one is None:
        first = state.rule.first_look(state.calibration)
        state.said.append(f"triplet {k}: d = {state.d[-1]:+.4f} (speedup {math.exp(state.d[-1]):.4f}x); "
                          f"the first look comes after triplet {first}: add triplet {k + 1}")
        state.planned += 1
    else:
        state.said.append(one.words(state.rule.max_triplets))
        state.record = state.record.model_copy(update={"looks": [*state.record.looks, one.record]})
        if one.stop is None:
            state.planned += 1
        else:
            state.stop = one.stop
            state.record = state.record.model_copy(update={"triplets": k, "stop": one.stop})
    ctx.update_run(sequential=state.record)
    return one
