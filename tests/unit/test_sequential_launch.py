"""The sequential stop (measurement.repeats: auto, `orch launch --until-decided`): the schema and its protocol id,
rule_of, the looks replayed from recorded triplets, the integrity check, and run_plan growing its plan one triplet
at a time on real files (only the package runner is replaced: it writes what a train worker writes).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ledger.cost.store import Ledger
from ledger.verdict.decide.sequential import SequentialRule
from ledger.verdict.decide.sequential_doc import (
    asked_record,
    calibration_spread,
    integrity,
    replay,
    rule_of,
    run_rule,
    sequential_doc,
    triplets_taken,
)
from ledger.verdict.decide.stats import Spread
from manifests.core import hash_tree
from orchestrator.isolation.packages import PackageOutcome
from orchestrator.isolation.sealing import seal_arm
from orchestrator.run import run_plan as run_plan_mod
from orchestrator.run.launch import _cpu_grant
from orchestrator.run.progress import Progress
from orchestrator.run.run_plan import RunContext, VerifiedArm, run_plan
from orchestrator.run.sequential_launch import begin
from protocol.errors import RefusedError
from protocol.home import resolve_home
from protocol.plan import package_names, triplets
from protocol.results import ObservedRecipe, RankSummary, RngFingerprint, StepRecord, TrainResult
from protocol.run_record import HostFingerprint, RunRecord
from protocol.schema import LoadedProtocol, Measurement, Protocol, canonical_json, load_protocol, protocol_id
from protocol.sequential_run import SequentialLook, SequentialRecord

REPO = Path(__file__).resolve().parents[2]
TS = "2026-01-01T00:00:00Z"
DECIDES_AT_3 = [0.30, 0.36, 0.33, 0.31]  # a clear speedup: the no-calibration rule decides at its second look
NOISY = [0.05, -0.04, 0.06, -0.05, 0.04, -0.06]  # a null: covers 1 at every look


# --- schema and protocol id -------------------------------------------------------------------------------------

def _with_measurement(loaded: LoadedProtocol, **measurement: Any) -> Protocol:
    data = loaded.protocol.model_dump(mode="json", by_alias=True)
    data["measurement"] = {k: v for k, v in data["measurement"].items()
                           if k not in ("max_repeats", "target_half_width")} | measurement
    return Protocol.model_validate(data)


def test_fixed_protocols_keep_their_ids_and_never_see_the_sequential_fields() -> None:
    for path in sorted((REPO / "protocol").glob("*.yaml")):
        loaded = load_protocol(path)
        m = json.loads(canonical_json(loaded.protocol))["measurement"]
        assert "max_repeats" not in m and "target_half_width" not in m, path.name
        explicit = _with_measurement(loaded, max_repeats=6, target_half_width=0.05)  # the defaults, written out
        assert protocol_id(explicit) == loaded.id, path.name


def test_repeats_auto_changes_the_id_and_pins_the_rule() -> None:
    loaded = load_protocol(REPO / "protocol" / "r3_mini.yaml")
    auto = _with_measurement(loaded, repeats="auto")
    auto4 = _with_measurement(loaded, repeats="auto", max_repeats=4)
    auto_wide = _with_measurement(loaded, repeats="auto", target_half_width=None)
    ids = {loaded.id, protocol_id(auto), protocol_id(auto4), protocol_id(auto_wide)}
    assert len(ids) == 4
    m = json.loads(canonical_json(auto))["measurement"]
    assert (m["repeats"], m["max_repeats"], m["target_half_width"]) == ("auto", 6, 0.05)


@pytest.mark.parametrize("measurement, words", [
    ({"repeats": 3, "max_repeats": 4}, "apply only to repeats: auto"),
    ({"repeats": 1, "target_half_width": 0.1}, "apply only to repeats: auto"),
    ({"repeats": 33}, "between 1 and 32"),
    ({"repeats": 0}, "between 1 and 32"),
    ({"repeats": "sometimes"}, "auto"),
    ({"repeats": "auto", "max_repeats": 33}, "less than or equal to 32"),
])
def test_bad_sequential_settings_are_refused_with_the_field_named(
    tmp_path: Path, measurement: dict[str, Any], words: str
) -> None:
    data = yaml.safe_load((REPO / "protocol" / "r3_mini.yaml").read_text())
    data["base"] = str(REPO)  # the copy lives elsewhere; its paths stay the repository's
    data["measurement"] = {**data.get("measurement", {}), **measurement}
    path = tmp_path / "protocol.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RefusedError) as err:
        load_protocol(path)
    assert "measurement" in err.value.message and words in err.value.message


def test_rule_of_a_fixed_and_an_auto_measurement_and_of_until_decided() -> None:
    assert rule_of(Measurement()) is None and rule_of(Measurement(repeats=3)) is None
    rule = rule_of(Measurement(repeats="auto", max_repeats=5, target_half_width=None))
    assert rule == SequentialRule(max_triplets=5, level=0.95, target_half_width=None)
    assert asked_record(Measurement(repeats=3), None) is None
    asked = asked_record(Measurement(repeats=3), 4)
    assert asked is not None and (asked.asked, asked.max_triplets, asked.target_half_width) == ("--until-decided", 4,
                                                                                                0.05)
    assert run_rule(Measurement(repeats=3), asked) == SequentialRule(max_triplets=4, target_half_width=0.05)
    auto = asked_record(Measurement(repeats="auto", max_repeats=3), 9)  # the protocol's rule wins
    assert auto is not None and (auto.asked, auto.max_triplets) == ("protocol", 3)


def test_the_calibration_spread_comes_only_from_a_usable_block() -> None:
    assert calibration_spread(None) is None
    assert calibration_spread({"found": False, "usable": False}) is None
    assert calibration_spread({"found": True, "usable": False, "sd": 0.1, "df": 4}) is None  # orch.calibration/1
    assert calibration_spread({"found": True, "usable": True, "sd": 0.1, "df": 4}) == Spread(0.1, 4)


# --- replay and integrity ---------------------------------------------------------------------------------------

def test_replay_stops_where_the_rule_decides_and_a_calibration_allows_the_first_look_at_one() -> None:
    rule = SequentialRule(max_triplets=6)
    looks = replay(rule, DECIDES_AT_3, None)
    assert [lk.triplets for lk in looks] == [2, 3] and [lk.stop for lk in looks] == [None, "decided"]
    assert looks[-1].interval.low > 1.0
    calibrated = replay(rule, DECIDES_AT_3, Spread(0.03, 8))
    assert [(lk.triplets, lk.stop) for lk in calibrated] == [(1, "decided")]
    null = replay(SequentialRule(max_triplets=4, target_half_width=None), NOISY, None)
    assert [(lk.triplets, lk.stop) for lk in null] == [(2, None), (3, None), (4, "maximum")]


@pytest.mark.parametrize("taken, ok, words", [
    (3, True, "exactly where its rule stops (decided)"),
    (2, False, "stopped earlier than its rule"),
    (1, False, "before the rule's first look"),
    (4, False, "went on after its rule stopped"),
])
def test_integrity_names_a_run_that_stopped_earlier_or_later_than_its_rule(taken: int, ok: bool, words: str) -> None:
    rule = SequentialRule(max_triplets=6)
    d = DECIDES_AT_3[:taken]
    got_ok, got_words = integrity(rule, taken, replay(rule, d, None), rule.first_look(None))
    assert got_ok is ok and words in got_words
    doc = sequential_doc(rule, "protocol", d, None, {})
    assert doc["integrity"]["ok"] is ok and doc["triplets"] == taken
    assert (doc["stop"] == "decided") is (taken >= 3)


def test_the_audit_block_states_rule_looks_cost_and_checks_run_json() -> None:
    rule = SequentialRule(max_triplets=6)
    gpu = {name: 10.0 for name in package_names(3, sequential=True)}
    recorded = SequentialRecord(asked="protocol", max_triplets=6, target_half_width=0.05, level=0.95,
                                looks=[_look(2, None), _look(3, "decided")], triplets=3, stop="decided")
    doc = sequential_doc(rule, "protocol", DECIDES_AT_3[:3], None, gpu, recorded, wall_s=gpu)
    assert "Lan-DeMets" in doc["method"] and "probability" in doc["guarantee"] and "at most 6" in doc["rule"]
    assert [lk["triplets"] for lk in doc["looks"]] == [2, 3] and doc["stop"] == "decided"
    assert doc["gpu_seconds"]["per_triplet"] == [60.0, 60.0, 60.0]  # train + reload of three launches
    assert doc["gpu_seconds"]["decision"] == 180.0 and doc["gpu_seconds"]["run"] == 10.0 * (4 + 6 * 3)  # with prime
    assert [lk["gpu_seconds"] for lk in doc["looks"]] == [120.0, 180.0]
    assert doc["integrity"]["ok"] and doc["interval"]["low"] > 1.0
    said_otherwise = recorded.model_copy(update={"looks": [_look(2, "decided")], "triplets": 2})
    bad = sequential_doc(rule, "protocol", DECIDES_AT_3[:3], None, gpu, said_otherwise)
    assert not bad["integrity"]["ok"] and "differ from the replay" in bad["integrity"]["words"]
    assert "run.json says 2 triplet(s)" in bad["integrity"]["words"]
    other_rule = recorded.model_copy(update={"max_triplets": 3})
    worse = sequential_doc(rule, "protocol", DECIDES_AT_3[:3], None, gpu, other_rule)
    assert not worse["integrity"]["ok"] and "is not the protocol's" in worse["integrity"]["words"]


def _look(k: int, stop: str | None) -> SequentialLook:
    return SequentialLook.model_validate({"triplets": k, "estimate": 1.0, "low": 0.9, "high": 1.1,
                                          "nominal_level": 0.97, "df": k - 1, "variance_source": "run", "stop": stop})


def test_triplets_taken_come_from_the_ledgers_package_names() -> None:
    names = package_names(4, sequential=True)
    assert triplets_taken(Measurement(repeats="auto"), None, names) == (4, True)
    assert triplets_taken(Measurement(repeats="auto"), None, package_names(1, sequential=True)) == (1, True)
    assert triplets_taken(Measurement(repeats=3), None, names) == (3, False)


# --- run_plan grows the plan ------------------------------------------------------------------------------------

def _context(tmp_path: Path, **measurement: Any) -> Iterator[RunContext]:
    base = load_protocol(REPO / "protocol" / "r3_mini.yaml")
    loaded = base.model_copy(update={"protocol": _with_measurement(base, **measurement)})
    home = resolve_home(tmp_path / "home")
    for d in (home.runs, home.ledger_dir, home.scratch):
        d.mkdir(parents=True, exist_ok=True)
    include = list(loaded.protocol.sources.include)
    run_id = "run1"
    run_dir = home.run_dir(run_id)
    (run_dir / "packages").mkdir(parents=True)
    scratch = home.scratch / run_id
    scratch.mkdir(parents=True)
    arms: dict[str, VerifiedArm] = {}
    for name in ("baseline", "candidate"):
        src = tmp_path / "src" / name
        for sub in ("modeling", "train"):
            (src / sub).mkdir(parents=True)
        (src / "modeling" / "model.py").write_text(f"# the model of the {name}\n")
        (src / "train" / "online_rl.py").write_text(f"# the trainer of the {name}\n")
        root = hash_tree(src, include).root
        arms[name] = VerifiedArm(name, getattr(loaded.protocol.arms, name), src, root, root)
    host = HostFingerprint(gpu_model="none", gpu_count=0, driver="none", cuda="none", torch="2.13.0",
                           triton="3.5.1", python="3.11.7", host_hash="0" * 64)
    c = RunContext(loaded, home, run_id, run_dir, scratch, Ledger(home.ledger_path), host, arms)
    c.run_record = RunRecord.begin(run_id, loaded.id, loaded.protocol.name, TS, host, {})
    for name, arm in arms.items():
        c.sealed[name] = seal_arm(name, arm.source_dir, include, arm.sources_root, run_dir / "sealed" / name)
    grant = _cpu_grant(loaded.protocol.launcher.nproc, 10.0, tmp_path / "locks", lambda _: None, run_id)
    with grant:
        c.grant = grant
        yield c


@pytest.fixture
def auto_ctx(tmp_path: Path) -> Iterator[RunContext]:
    yield from _context(tmp_path, repeats="auto", max_repeats=4)


@pytest.fixture
def fixed_ctx(tmp_path: Path) -> Iterator[RunContext]:
    yield from _context(tmp_path, repeats=2)


def _train_result(pkg_dir: Path, label: str, step_s: float, ranks: int) -> None:
    summaries = []
    for r in range(ranks):
        lines = [StepRecord(rank=r, world_size=ranks, step=s, duration_s=step_s, probe_s=0.001, lr=[1e-6],
                            rng=RngFingerprint(cpu=f"{s:064x}")) for s in range(16)]
        text = "".join(x.model_dump_json(by_alias=True) + "\n" for x in lines)
        (pkg_dir / f"steps.rank{r}.jsonl").write_text(text)
        summaries.append(RankSummary(rank=r, steps_file=f"steps.rank{r}.jsonl", steps_sha256="0" * 64, steps=16,
                                     final_combined="f", final_digests={}))
    recipe = ObservedRecipe(optimizer="AdamW", lr=1e-6, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    result = TrainResult(arm=label, world_size=ranks, steps=16, digest_steps=list(range(14)), device="cpu",
                         observed_recipe=recipe, ranks=summaries, stopped_cleanly=True)
    (pkg_dir / "result.json").write_text(result.model_dump_json(by_alias=True))


def _runner(ctx: RunContext, ran: list[str], d: list[float], fail: str | None) -> Callable[..., PackageOutcome]:
    """Writes what each worker writes; triplet k's candidate steps are exp(d[k-1]) times shorter than its baseline's,
    and each train leaves a checkpoint folder in scratch."""

    def run_package(spec: Any, env: dict[str, str], timeout: float, on_tick: Any = None, **_: Any) -> PackageOutcome:
        ran.append(spec.name)
        pkg_dir = Path(spec.package_dir)
        pkg_dir.mkdir(parents=True, exist_ok=True)
        if spec.name.startswith("train-"):
            label = spec.arm_label
            k = int(label[1:]) if label[1:] else 1
            step_s = 0.2 / math.exp(d[k - 1]) if label.startswith("C") else 0.2
            _train_result(pkg_dir, label, step_s, spec.nproc)
            (ctx.scratch / "ckpt" / label).mkdir(parents=True)
        else:
            (pkg_dir / "result.json").write_text(json.dumps({"name": spec.name}) + "\n")
        if spec.kind == "score":
            (ctx.run_dir / "score.sealed.json").write_text("{}\n")
        status = "failed" if spec.name == fail else "ok"
        return PackageOutcome(name=spec.name, status=status, exit_code=0 if status == "ok" else 1, wall_s=1.0,
                              started=TS, ended=TS)

    return run_package


def _run(ctx: RunContext, monkeypatch: pytest.MonkeyPatch, d: list[float],
         fail: str | None = None) -> tuple[str, dict[str, str], list[str], list[str]]:
    ran: list[str] = []
    said: list[str] = []
    monkeypatch.setattr(run_plan_mod, "run_package", _runner(ctx, ran, d, fail))
    begin(ctx, None, said.append)
    status, statuses = run_plan(ctx, Progress(live=False, say=said.append))
    return status, statuses, ran, said


def _closes(ctx: RunContext) -> dict[str, str]:
    return {r.package: r.status for r in Ledger(ctx.home.ledger_path).records(ctx.run_id) if r.status != "open"}


def test_a_sequential_run_adds_triplets_until_its_rule_decides(
    auto_ctx: RunContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    status, statuses, ran, said = _run(auto_ctx, monkeypatch, DECIDES_AT_3)
    assert status == "complete"
    assert ran == list(package_names(3, sequential=True))  # checks, prime, A1 C1 B1, B2 C2 A2, A3 C3 B3, watch-C, score
    assert statuses == dict.fromkeys(ran, "ok") and _closes(auto_ctx) == statuses
    seq = auto_ctx.run.sequential
    assert seq is not None and (seq.asked, seq.triplets, seq.stop) == ("protocol", 3, "decided")
    assert [(lk.triplets, lk.stop) for lk in seq.looks] == [(2, None), (3, "decided")]
    replayed = replay(SequentialRule(max_triplets=4), DECIDES_AT_3[:3], None)
    assert [lk.interval.low for lk in replayed] == pytest.approx([lk.low for lk in seq.looks])
    assert any(s.startswith("look 2:") and "add triplet 3 of at most 4" in s for s in said)
    assert any(s.startswith("look 3:") and "stop, decided faster" in s for s in said)
    assert sorted(p.name for p in (auto_ctx.scratch / "ckpt").iterdir()) == ["A1", "C1"]  # the scorer's only
    written = RunRecord.model_validate_json((auto_ctx.run_dir / "run.json").read_bytes())
    assert written.sequential == seq


def test_a_null_stops_at_the_maximum_with_every_triplet_in_the_ledger(
    auto_ctx: RunContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    status, _, ran, said = _run(auto_ctx, monkeypatch, NOISY)
    assert status == "complete" and ran == list(package_names(4, sequential=True))
    assert set(_closes(auto_ctx)) == set(package_names(4, sequential=True))
    seq = auto_ctx.run.sequential
    assert seq is not None and (seq.triplets, seq.stop) == (4, "maximum")
    assert any("at the maximum of 4 triplets: stop" in s for s in said)


def test_a_failure_inside_a_later_triplet_stops_the_run_and_adds_no_triplet(
    auto_ctx: RunContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    status, statuses, ran, _ = _run(auto_ctx, monkeypatch, NOISY, fail="train-C2")
    assert status == "failed" and ran[-1] == "train-C2" and statuses["train-C2"] == "failed"
    assert set(statuses) == set(package_names(2, sequential=True))  # the plan grew to triplet 2, not beyond
    closes = _closes(auto_ctx)
    assert closes["train-C2"] == "failed"
    assert {n for n, s in closes.items() if s == "not-run"} == {"reload-C2", "train-A2", "reload-A2", "watch-C",
                                                                 "score"}
    assert not any(n.endswith("3") for n in closes)


def test_a_fixed_design_is_unchanged(fixed_ctx: RunContext, monkeypatch: pytest.MonkeyPatch) -> None:
    status, _, ran, said = _run(fixed_ctx, monkeypatch, [0.3, 0.3])
    assert status == "complete" and ran == list(package_names(2)) and fixed_ctx.run.sequential is None
    assert not any(s.startswith("look") for s in said)
    assert [t.a for t in triplets(2)] == ["A1", "A2"]


def test_until_decided_turns_a_fixed_protocol_sequential_and_records_who_asked(
    fixed_ctx: RunContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    monkeypatch.setattr(run_plan_mod, "run_package", _runner(fixed_ctx, ran, DECIDES_AT_3, None))
    begin(fixed_ctx, 5, lambda _: None)
    status, _ = run_plan(fixed_ctx, Progress(live=False, say=lambda _: None))
    seq = fixed_ctx.run.sequential
    assert status == "complete" and seq is not None
    assert (seq.asked, seq.max_triplets, seq.triplets, seq.stop) == ("--until-decided", 5, 3, "decided")
    assert fixed_ctx.loaded.protocol.measurement.repeats == 2  # the protocol (and its id) stay as they are


def _orch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.orch", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120, check=False)


def test_max_repeats_without_until_decided_is_a_usage_error(tmp_path: Path) -> None:
    res = _orch("launch", "protocol/r3_mini.yaml", "--max-repeats", "3", "--home", str(tmp_path / "h"))
    assert res.returncode == 2 and "--max-repeats goes with --until-decided" in res.stderr
    assert not (tmp_path / "h").exists()
