"""ledger/verdict/decide/evidence.py rule by rule: each loader's words for a missing, unreadable or malformed piece, the
ledger's view of every package, the step files, and what collect_evidence returns for a complete run.

The expected lines are written out by hand from the rules (and pydantic's or json's own message for the cause),
never taken from the code under test.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from test_audit import RunSpec, _steps, make_run

from ledger.cost.record import LedgerRecord
from ledger.verdict.decide import evidence as evidence_module
from ledger.verdict.decide.evidence import (
    PACKAGES,
    IncompleteRunError,
    _load_model,
    _load_run,
    _package_problems,
    _read_steps,
    collect_evidence,
)
from protocol.errors import UsageError
from protocol.home import resolve_home
from protocol.plan import package_names
from protocol.results import RankSummary, TrainResult
from protocol.run_record import PackageEntry, RunRecord

UNPRIMED = package_names(1, prime=False)  # the synthetic runs are recorded as before the prime package


class _Inner(BaseModel):
    n: int


class _Doc(BaseModel):
    inner: list[_Inner]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- IncompleteRunError, _load_model ----------------------------------------------------------------------------


def test_an_incomplete_run_error_keeps_its_own_copy_of_the_problems() -> None:
    problems = ("a", "b")
    err = IncompleteRunError("run x is not complete", problems)
    assert err.message == "run x is not complete" and err.problems == ["a", "b"] and isinstance(err.problems, list)
    assert err.exit_code == 1  # a FailedError: the documented exit code of a failed check


def test_a_missing_model_file_is_named_missing(tmp_path: Path) -> None:
    problems: list[str] = []
    assert _load_model(_Doc, tmp_path / "doc.json", problems, "packages/x/result.json") is None
    (tmp_path / "folder.json").mkdir()  # not a file either
    assert _load_model(_Doc, tmp_path / "folder.json", problems, "packages/y/result.json") is None
    assert problems == ["packages/x/result.json: missing", "packages/y/result.json: missing"]


def test_a_model_file_off_its_model_names_the_first_field_and_pydantics_words(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    problems: list[str] = []
    path.write_text('{"inner": [{"n": 1}, {"n": "x"}, {"n": "y"}]}')
    assert _load_model(_Doc, path, problems, "r.json") is None
    path.write_text("[1, 2]")  # the whole document is wrong: no field to name
    assert _load_model(_Doc, path, problems, "s.json") is None
    assert problems == [
        "r.json: malformed (inner.1.n: Input should be a valid integer, unable to parse string as an integer)",
        "s.json: malformed (document: Input should be an object)",
    ]


def test_an_unreadable_model_file_is_named_with_the_os_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "doc.json"
    path.write_text('{"inner": []}')

    def refuse(p: Path, limit: int | None = None) -> bytes:
        raise PermissionError(errno.EACCES, "Permission denied", str(p))

    monkeypatch.setattr(evidence_module, "read_regular", refuse)
    problems: list[str] = []
    assert _load_model(_Doc, path, problems, "t.json") is None
    assert problems == ["t.json: unreadable (Permission denied)"]


def test_a_link_or_a_fifo_a_package_left_is_named_never_followed_or_waited_on(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text('{"inner": []}')
    (tmp_path / "link.json").symlink_to(target)
    os.mkfifo(tmp_path / "fifo.json")
    problems: list[str] = []
    assert _load_model(_Doc, tmp_path / "link.json", problems, "l.json") is None
    assert _load_model(_Doc, tmp_path / "fifo.json", problems, "f.json") is None
    assert problems == ["l.json: unreadable (a link, not a regular file)",
                        "f.json: unreadable (a FIFO, not a regular file)"]


def test_a_good_model_file_is_returned_and_adds_no_problem(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_text('{"inner": [{"n": 3}]}')
    problems: list[str] = ["before"]
    doc = _load_model(_Doc, path, problems, "u.json")
    assert doc == _Doc(inner=[_Inner(n=3)]) and problems == ["before"]


# --- _load_run -----------------------------------------------------------------------------------------------------


def _run_doc(tmp_path: Path) -> dict[str, Any]:
    run_dir = make_run(tmp_path)
    doc: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    return doc


def test_run_json_missing_unreadable_or_not_json(tmp_path: Path) -> None:
    problems: list[str] = []
    assert _load_run(tmp_path / "run.json", "r1", problems) is None
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "run.json").mkdir()  # a folder where the file should be: the OS refuses to read it
    assert _load_run(tmp_path / "dir" / "run.json", "r1", problems) is None
    (tmp_path / "bad.json").write_text("{")
    assert _load_run(tmp_path / "bad.json", "r1", problems) is None
    assert problems == [
        "run.json: missing (the launch never got past its start)",
        "run.json: unreadable (Is a directory)",
        "run.json: malformed (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
    ]


@pytest.mark.parametrize("doc", [[1, 2], "orch.run/2", {"schema": "orch.run/3"}, {"run_id": "r1"}])
def test_run_json_that_is_not_a_run_2_document(tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    problems: list[str] = []
    assert _load_run(path, "r1", problems) is None
    assert problems == ["run.json: not an orch.run/2 document"]


def test_run_json_of_the_right_schema_off_its_model_names_the_first_field(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"schema": "orch.run/2"}))
    problems: list[str] = []
    assert _load_run(path, "r1", problems) is None
    assert problems == ["run.json: malformed (run_id: Field required)"]


def test_a_run_1_record_is_refused_before_anything_else_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"schema": "orch.run/1", "run_id": "r7"}))
    problems = ["an earlier problem"]
    with pytest.raises(IncompleteRunError) as err:
        _load_run(path, "r7", problems)
    assert err.value.message == (
        "run r7 is an orch.run/1 run, recorded before the watched replay (watch-C) and the trainer's own numbers "
        "were part of the evidence; it cannot be audited by this orch: relaunch the protocol")
    assert err.value.problems == ["run.json: orch.run/1 (before watch-C and trainer scalars); relaunch the protocol"]
    assert problems == ["an earlier problem"]


def test_a_good_run_json_is_read_through_its_model(tmp_path: Path) -> None:
    doc = _run_doc(tmp_path / "home")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    problems: list[str] = []
    run = _load_run(path, "run1", problems)
    assert isinstance(run, RunRecord) and run.run_id == "run1" and run.status == "complete" and problems == []


# --- _package_problems -------------------------------------------------------------------------------------------


def _rec(package: str, status: str, exit_code: int | None = None, note: str | None = None) -> LedgerRecord:
    return LedgerRecord.model_construct(package=package, status=status, exit_code=exit_code, note=note)


def _run_with(statuses: dict[str, str]) -> RunRecord:
    """A run.json model whose packages are `statuses` (name -> status), nothing else of a run needed here."""
    entries = [{"name": n, "kind": "train", "arm_label": None, "arm": None, "env": {}, "status": s}
               for n, s in statuses.items()]
    return RunRecord.model_construct(packages=[PackageEntry.model_validate(e) for e in entries])


def test_each_package_needs_an_ok_close_in_the_ledger_and_in_run_json() -> None:
    names = ("p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9")
    records = [
        _rec("p1", "open"),  # a crash, or a live run
        # p2: nothing at all
        _rec("p3", "open"), _rec("p3", "failed", 3, "boom"),
        _rec("p4", "open"), _rec("p4", "interrupted"),  # no exit code, no note
        _rec("p5", "open"), _rec("p5", "timeout", 0, ""),  # exit 0 is still said; an empty note is not
        _rec("p6", "open"), _rec("p6", "ok", 0),  # ok in the ledger, not in run.json
        _rec("p7", "open"), _rec("p7", "ok", 0),  # ok in the ledger, failed in run.json
        _rec("p8", "open"), _rec("p8", "open"), _rec("p8", "ok", 0),  # two opens, then a close: fine
        _rec("p9", "failed", 1, "first"), _rec("p9", "ok", 0),  # the last close counts
    ]
    run = _run_with({"p1": "running", "p3": "failed", "p4": "interrupted", "p5": "failed", "p7": "failed",
                     "p8": "ok", "p9": "ok"})
    problems, closes, bad = _package_problems(run, records, names)
    assert problems == [
        "package p1: open ledger record without a close (the run crashed or is still running)",
        "package p2: no ledger record",
        "package p3: failed (exit 3): boom",
        "package p4: interrupted",
        "package p5: timeout (exit 0)",
        "package p6: ok in the ledger but absent from run.json",
        "package p7: ok in the ledger but 'failed' in run.json",
    ]
    assert bad == {"p1", "p2", "p3", "p4", "p5", "p6", "p7"}
    assert sorted(closes) == ["p3", "p4", "p5", "p6", "p7", "p8", "p9"]
    assert closes["p9"].status == "ok" and closes["p3"].note == "boom"


def test_without_run_json_the_ledger_alone_judges_the_packages() -> None:
    records = [_rec(n, "ok", 0) for n in PACKAGES if n != "score"]
    problems, closes, bad = _package_problems(None, records)  # the owner's plan by default
    assert problems == ["package score: no ledger record"] and bad == {"score"}
    assert list(closes) == [n for n in PACKAGES if n != "score"]
    assert PACKAGES == ("checks", "prime", "train-A", "reload-A", "train-C", "reload-C", "train-B", "reload-B",
                        "watch-C", "score")


# --- _read_steps ----------------------------------------------------------------------------------------------------


def _train(*ranks: int) -> TrainResult:
    return TrainResult.model_construct(ranks=[
        RankSummary.model_construct(rank=r, steps_file=f"steps.rank{r}.jsonl") for r in ranks])


def _lines(rank: int, steps: range, as_rank: int | None = None) -> list[str]:
    out = []
    for s in _steps(RunSpec(), "A", rank)[steps.start:steps.stop]:
        doc = json.loads(s.model_dump_json(by_alias=True))
        if as_rank is not None:
            doc["rank"] = as_rank
        out.append(json.dumps(doc))
    return out


def test_step_files_are_read_per_rank_blank_lines_skipped(tmp_path: Path) -> None:
    lines = _lines(0, range(0, 4))
    (tmp_path / "steps.rank0.jsonl").write_text("\n".join([lines[0], "", "   ", *lines[1:]]) + "\n\n")
    (tmp_path / "steps.rank3.jsonl").write_text("\n".join(_lines(3, range(0, 4))) + "\n")
    problems: list[str] = []
    out = _read_steps(tmp_path, _train(0, 3), "packages/train-A", 4, problems)
    assert problems == []
    assert sorted(out) == [0, 3]
    assert [r.step for r in out[0]] == [0, 1, 2, 3] and [r.rank for r in out[3]] == [3, 3, 3, 3]


def test_a_missing_step_file_is_named_and_its_rank_left_out(tmp_path: Path) -> None:
    (tmp_path / "steps.rank1.jsonl").write_text("\n".join(_lines(1, range(0, 2))) + "\n")
    problems: list[str] = []
    out = _read_steps(tmp_path, _train(0, 1), "packages/watch-C", 2, problems)
    assert problems == ["packages/watch-C/steps.rank0.jsonl: missing"]
    assert list(out) == [1] and len(out[1]) == 2


def test_a_malformed_step_line_is_named_by_its_line_number_and_ends_the_file(tmp_path: Path) -> None:
    lines = _lines(0, range(0, 4))
    # line 1 good, line 2 blank, line 3 not JSON, line 4 good: reading stops at line 3
    (tmp_path / "steps.rank0.jsonl").write_text("\n".join([lines[0], "", "not json", *lines[1:]]) + "\n")
    bad_rank = json.loads(lines[0])
    bad_rank["rank"] = "zero"
    (tmp_path / "steps.rank1.jsonl").write_text(json.dumps(bad_rank) + "\n")
    problems: list[str] = []
    out = _read_steps(tmp_path, _train(0, 1), "packages/train-A", 4, problems)
    assert problems == [
        "packages/train-A/steps.rank0.jsonl:3: malformed step line (document: Invalid JSON: expected ident at line 1 "
        "column 2)",
        "packages/train-A/steps.rank0.jsonl: 1 step lines, expected steps 0-3",
        "packages/train-A/steps.rank1.jsonl:1: malformed step line (rank: Input should be a valid integer, unable to "
        "parse string as an integer)",
        "packages/train-A/steps.rank1.jsonl: 0 step lines, expected steps 0-3",
    ]
    assert [r.step for r in out[0]] == [0] and out[1] == []


def test_the_step_lines_must_be_exactly_steps_0_to_n_minus_1_of_their_rank(tmp_path: Path) -> None:
    four = _lines(0, range(0, 4))
    (tmp_path / "steps.rank0.jsonl").write_text("\n".join(four) + "\n")  # one step short of 5
    (tmp_path / "steps.rank1.jsonl").write_text("\n".join(_lines(1, range(0, 4)) + _lines(1, range(3, 4))) + "\n")
    (tmp_path / "steps.rank2.jsonl").write_text("\n".join(_lines(2, range(1, 5)) + _lines(2, range(0, 1))) + "\n")
    (tmp_path / "steps.rank4.jsonl").write_text("\n".join(_lines(4, range(0, 5), as_rank=5)) + "\n")
    problems: list[str] = []
    out = _read_steps(tmp_path, _train(0, 1, 2, 4), "packages/train-B", 5, problems)
    assert problems == [
        "packages/train-B/steps.rank0.jsonl: 4 step lines, expected steps 0-4",
        "packages/train-B/steps.rank1.jsonl: 5 step lines, expected steps 0-4",  # step 3 twice, no step 4
        "packages/train-B/steps.rank4.jsonl: lines of another rank than 4",
    ]  # rank 2's lines are steps 1-4 then 0: out of order, but exactly 0-4
    assert [r.step for r in out[2]] == [1, 2, 3, 4, 0] and len(out[4]) == 5


# --- collect_evidence -----------------------------------------------------------------------------------------------


def _collect(home: Path, run_id: str = "run1") -> Any:
    return collect_evidence(resolve_home(home), run_id)


def _problems(home: Path, run_id: str = "run1") -> tuple[str, list[str]]:
    with pytest.raises(IncompleteRunError) as err:
        _collect(home, run_id)
    return err.value.message, err.value.problems


def test_a_run_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    make_run(tmp_path)
    with pytest.raises(UsageError) as err:
        _collect(tmp_path, "run9")
    runs = resolve_home(tmp_path).runs
    assert err.value.message == f"no run 'run9' under {runs}; give a run id printed by `orch launch`"
    (runs / "run8").write_text("a file, not a run directory")
    with pytest.raises(UsageError):
        _collect(tmp_path, "run8")


def test_a_complete_run_is_loaded_whole(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    make_run(tmp_path, "run2")  # another run in the same ledger: none of its records is this run's
    ev = _collect(tmp_path)
    assert ev.run_id == "run1" and ev.run_dir == run_dir and ev.run.run_id == "run1"
    assert ev.protocol.name == "synthetic" and ev.repeats == 1
    assert ev.protocol_sha256 == _sha(run_dir / "protocol.json") == ev.run.protocol_id
    assert ev.names == UNPRIMED
    assert sorted(ev.trains) == ["A", "B", "C"] and sorted(ev.reloads) == ["A", "B", "C"]
    assert all(ev.trains[lab].arm == lab and ev.reloads[lab].arm == lab for lab in "ACB")
    assert ev.watch.arm == "C" and ev.checks.precision_ok is True
    assert ev.score.sealed_file == "score.sealed.json"
    assert {lab: sorted(ranks) for lab, ranks in ev.steps.items()} == {"A": [0, 1], "C": [0, 1], "B": [0, 1]}
    assert [r.step for r in ev.steps["B"][1]] == list(range(16)) and sorted(ev.watch_steps) == [0, 1]
    assert [r.step for r in ev.watch_steps[0]] == list(range(16))
    assert len(ev.records) == 18 and {r.run_id for r in ev.records} == {"run1"}  # 9 packages, open + ok each
    assert [r.seq for r in ev.records] == sorted(r.seq for r in ev.records)
    assert sorted(ev.closes) == sorted(UNPRIMED) and all(c.status == "ok" for c in ev.closes.values())
    assert ev.result_sha256 == {n: _sha(run_dir / "packages" / n / "result.json") for n in UNPRIMED}


def test_repeats_read_their_own_plan(tmp_path: Path) -> None:
    make_run(tmp_path, spec=RunSpec(repeats=2))
    ev = _collect(tmp_path)
    assert ev.repeats == 2 and len(ev.names) == 1 + 2 * 6 + 2
    assert sorted(ev.trains) == ["A1", "A2", "B1", "B2", "C1", "C2"] and ev.watch.arm == "C1"
    assert sorted(ev.result_sha256) == sorted(ev.names)


def test_run_json_of_another_run_that_is_not_complete_gives_both_lines(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    doc = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**doc, "run_id": "run2", "status": "failed"}))
    message, problems = _problems(tmp_path)
    assert problems == ["run.json: run_id 'run2' is not 'run1'", "run status is 'failed', not 'complete'"]
    assert message == ("run run1 is not complete (2 problem(s)); no audit was written and no score is shown; "
                       "relaunch the protocol for a complete run")


def test_a_missing_run_json_is_named_and_the_rest_is_still_judged(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    (run_dir / "run.json").unlink()
    (run_dir / "packages" / "reload-C" / "result.json").unlink()
    message, problems = _problems(tmp_path)
    assert problems == ["run.json: missing (the launch never got past its start)",
                        "packages/reload-C/result.json: missing"]
    assert "(2 problem(s))" in message


def test_without_protocol_json_no_step_file_is_read(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    (run_dir / "protocol.json").unlink()
    (run_dir / "packages" / "train-A" / "steps.rank0.jsonl").unlink()  # not reported: steps need the protocol
    assert _problems(tmp_path)[1] == ["protocol.json: missing"]


def test_a_malformed_protocol_copy_is_named_after_the_packages(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    proto = json.loads((run_dir / "protocol.json").read_text())
    del proto["name"]
    (run_dir / "protocol.json").write_text(json.dumps(proto))
    doc = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**doc, "status": "interrupted"}))
    assert _problems(tmp_path)[1] == ["run status is 'interrupted', not 'complete'",
                                      "protocol.json: malformed (name: Field required)"]


def test_a_result_of_a_failed_package_is_not_named_again_but_others_are(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, spec=RunSpec(stop_at="reload-C"))
    (run_dir / "packages" / "reload-A" / "result.json").unlink()  # reload-A was ok: its missing result counts
    assert _problems(tmp_path)[1] == [
        "run status is 'interrupted', not 'complete'",
        "package reload-C: interrupted (exit -15)",
        "package train-B: not-run: not reached",
        "package reload-B: not-run: not reached",
        "package watch-C: not-run: not reached",
        "package score: not-run: not reached",
        "packages/reload-A/result.json: missing",
    ]


@pytest.mark.parametrize("name", ["checks", "score", "train-C", "reload-B", "watch-C"])
def test_each_missing_result_of_an_ok_package_is_named(tmp_path: Path, name: str) -> None:
    run_dir = make_run(tmp_path)
    (run_dir / "packages" / name / "result.json").unlink()
    message, problems = _problems(tmp_path)
    assert problems == [f"packages/{name}/result.json: missing"]
    assert message.startswith("run run1 is not complete (1 problem(s));")


def _rewrite(path: Path, **fields: Any) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_a_result_of_another_arm_is_named(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    _rewrite(run_dir / "packages" / "train-A" / "result.json", arm="B")
    _rewrite(run_dir / "packages" / "reload-C" / "result.json", arm="A")
    _rewrite(run_dir / "packages" / "watch-C" / "result.json", arm="B")
    assert _problems(tmp_path)[1] == [
        "packages/train-A/result.json: arm 'B', expected 'A'",
        "packages/reload-C/result.json: arm 'A', expected 'C'",
        "packages/watch-C/result.json: arm 'B', expected 'C'",
    ]


def test_the_watched_replay_of_a_repeated_run_is_of_c1(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, spec=RunSpec(repeats=2))
    _rewrite(run_dir / "packages" / "watch-C" / "result.json", arm="C2")
    assert _problems(tmp_path)[1] == ["packages/watch-C/result.json: arm 'C2', expected 'C1'"]


def test_step_files_of_the_trains_and_the_replay_are_checked_against_the_protocols_steps(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    path = run_dir / "packages" / "train-C" / "steps.rank1.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:15]))
    (run_dir / "packages" / "watch-C" / "steps.rank0.jsonl").unlink()
    assert _problems(tmp_path)[1] == [
        "packages/train-C/steps.rank1.jsonl: 15 step lines, expected steps 0-15",
        "packages/watch-C/steps.rank0.jsonl: missing",
    ]


def test_a_run_1_record_is_refused_naming_the_run_audited(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "run5")
    _rewrite(run_dir / "run.json", schema="orch.run/1")
    with pytest.raises(IncompleteRunError) as err:
        _collect(tmp_path, "run5")
    assert err.value.message.startswith("run run5 is an orch.run/1 run, recorded before the watched replay")


def test_run_jsons_own_word_on_a_package_counts_in_a_whole_run(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    doc = json.loads((run_dir / "run.json").read_text())
    doc["packages"] = [{**p, "status": "failed"} if p["name"] == "reload-B" else p
                       for p in doc["packages"] if p["name"] != "train-A"]
    (run_dir / "run.json").write_text(json.dumps(doc))
    assert _problems(tmp_path)[1] == [
        "package train-A: ok in the ledger but absent from run.json",
        "package reload-B: ok in the ledger but 'failed' in run.json",
    ]


def test_a_run_stopped_in_its_checks_names_the_package_not_its_missing_result(tmp_path: Path) -> None:
    make_run(tmp_path, spec=RunSpec(stop_at="checks"))
    assert _problems(tmp_path)[1] == [
        "run status is 'interrupted', not 'complete'",
        "package checks: interrupted (exit -15)",
        *(f"package {n}: not-run: not reached" for n in UNPRIMED[1:]),
    ]


@pytest.mark.parametrize("ends_after_triplets", [True, False], ids=["as-run-now", "recorded-with-watch-and-score"])
def test_an_aa_launch_is_read_with_the_packages_its_plan_ran(tmp_path: Path, ends_after_triplets: bool) -> None:
    """An A/A launch of `orch calibrate` (run.json names what it calibrates) ends after its triplet; one recorded
    before that change ran the watched replay and the scorer, and is read with them."""
    make_run(tmp_path, spec=RunSpec(calibration_of=True, ends_after_triplets=ends_after_triplets,
                                    candidate_switches={}))
    ev = _collect(tmp_path)
    assert ev.names == package_names(1, prime=False, calibration=ends_after_triplets)
    assert ("watch-C" in ev.names, "score" in ev.names) == (not ends_after_triplets, not ends_after_triplets)
    assert (ev.watch is None, ev.score is None) == (ends_after_triplets, ends_after_triplets)
    assert sorted(ev.watch_steps) == ([] if ends_after_triplets else [0, 1])
    assert sorted(ev.closes) == sorted(ev.names) and sorted(ev.result_sha256) == sorted(ev.names)


def test_only_an_aa_launch_is_read_without_its_watched_replay_and_score(tmp_path: Path) -> None:
    make_run(tmp_path, spec=RunSpec(ends_after_triplets=True))
    _, problems = _problems(tmp_path)
    assert problems == ["package reload-B: no ledger record", "package watch-C: no ledger record",
                        "package score: no ledger record"]


def test_an_aa_launch_with_a_package_after_its_triplet_in_either_record_is_read_with_the_whole_plan(
        tmp_path: Path) -> None:
    """run.json names its calibration; a watch-C in the ledger but not in run.json (or the other way round) makes it
    a run of the whole plan: the record that lacks watch-C is named, not read as a short A/A launch."""
    run_dir = make_run(tmp_path, spec=RunSpec(calibration_of=True, candidate_switches={}))
    doc = json.loads((run_dir / "run.json").read_text())
    doc["packages"] = [p for p in doc["packages"] if p["name"] != "watch-C"]  # run.json lacks it; the ledger has it
    (run_dir / "run.json").write_text(json.dumps(doc))
    _, problems = _problems(tmp_path)
    assert problems == ["package watch-C: ok in the ledger but absent from run.json"]


def test_a_primed_run_is_read_with_its_prime(tmp_path: Path) -> None:
    make_run(tmp_path, spec=RunSpec(primed=True))
    ev = _collect(tmp_path)
    assert ev.names == package_names(1) and ev.names[1] == "prime" and "prime" in ev.closes
    assert sorted(ev.result_sha256) == sorted(ev.names)
