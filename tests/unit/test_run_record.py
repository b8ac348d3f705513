"""protocol/run_record.py (run.json, orch.run/2) and the probe summary (orch.probe/2): one model each, used by
the writer and every reader; the recorded run reads and writes back byte for byte."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from test_audit import make_run

from ledger.verdict.decide.evidence import IncompleteRunError, collect_evidence
from protocol.home import resolve_home
from protocol.package import TrainSpec
from protocol.results import ObservedRecipe, ProbeSummary
from protocol.run_record import ArmRecord, EarlierRun, HostFingerprint, LockRecord, PackageEntry, RunRecord
from workers.common import WorkerFailed
from workers.train import collect

GOLDEN_RUN = Path(__file__).resolve().parents[1] / "golden" / "home" / "runs" / "20261201T151531Z-65f0dacd-f08f"
HOST = HostFingerprint(gpu_model="none", gpu_count=0, driver="none", cuda="none", torch="2.13.0", triton="3.5.1",
                       python="3.11.7", host_hash="ab" * 32)
ARM = ArmRecord(commitment="manifests/r3_mini.json", commitment_root="c" * 64, sources_root="c" * 64,
                switches={"R3_FUSE_X": "1"}, config={}, source="tree", under_evaluation=False, note=None)


def _begun() -> RunRecord:
    return RunRecord.begin("r1", "p" * 64, "r3-mini", "2026-12-01T00:00:00Z", HOST, {"candidate": ARM})


def test_the_recorded_run_json_reads_and_writes_back_byte_for_byte() -> None:
    data = (GOLDEN_RUN / "run.json").read_bytes()
    record = RunRecord.model_validate_json(data)
    assert record.to_bytes() == data
    assert [p.name for p in record.packages][:3] == ["checks", "train-A", "reload-A"]
    assert record.package("train-A") is not None and record.package("train-A").trainer_outputs is not None  # type: ignore[union-attr]
    assert record.package("reload-A").trainer_outputs is None  # type: ignore[union-attr]
    assert record.lock == LockRecord(kind="cpu-slot", devices=[0, 1], wait_s=6.9e-05)


def test_a_new_record_has_what_the_launch_knows_and_nothing_unset() -> None:
    doc = json.loads(_begun().to_bytes())
    assert doc == {
        "schema": "orch.run/2", "run_id": "r1", "protocol_id": "p" * 64, "protocol_name": "r3-mini",
        "started": "2026-12-01T00:00:00Z", "ended": None, "status": "running",
        "host": HOST.model_dump(exclude_unset=True), "lock": None, "packages": [],
        "arms": {"candidate": ARM.model_dump(exclude_unset=True)},
    }  # fmt: skip
    assert "sealed_root" not in doc["arms"]["candidate"] and "calibration_of" not in doc
    # canonical bytes: sorted keys, one-space indents, ASCII, a final newline
    assert _begun().to_bytes().startswith(b'{\n "arms": {\n  "candidate": {\n   "commitment": ')
    assert _begun().to_bytes().endswith(b'"status": "running"\n}\n')


def test_a_package_entry_gains_its_end_fields_only_when_it_has_ended() -> None:
    start = PackageEntry(name="train-A", kind="train", arm_label="A", arm="baseline", env={"LANG": "C.UTF-8"},
                         status="running")
    run = _begun().with_package(start)
    entry = json.loads(run.to_bytes())["packages"][0]
    assert sorted(entry) == ["arm", "arm_label", "env", "kind", "name", "status"]
    done = start.finish(status="ok", exit_code=0, started="s", ended="e", wall_s=1.5, gpus=0, gpu_seconds=0.0,
                        result_sha256="d" * 64, note=None, isolation=None)
    run = run.with_package(PackageEntry(name="reload-A", kind="reload", arm_label="A", arm="baseline", env={},
                                        status="running")).with_package(done)
    entries = json.loads(run.to_bytes())["packages"]
    assert [e["name"] for e in entries] == ["train-A", "reload-A"]  # replaced in place, not appended
    assert entries[0]["note"] is None and entries[0]["wall_s"] == 1.5 and "trainer_outputs" not in entries[0]
    with pytest.raises(ValidationError):
        start.finish(status="finished")  # not a package status
    with pytest.raises(ValidationError):
        start.finish(trainer_outputs={"files": 1})  # an incomplete summary of the trainer's outputs


def test_updates_are_validated_and_the_record_never_changes_in_place() -> None:
    run = _begun()
    sealed = run.with_arm("candidate", sealed_root="e" * 64)
    assert run.arms["candidate"].sealed_root is None and sealed.arms["candidate"].sealed_root == "e" * 64
    assert json.loads(sealed.to_bytes())["arms"]["candidate"]["sealed_root"] == "e" * 64
    with pytest.raises(ValidationError):
        run.updated(status="done")
    with pytest.raises(ValidationError):
        run.status = "complete"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        RunRecord.model_validate({**json.loads(run.to_bytes()), "extra": 1})
    with pytest.raises(ValidationError):
        RunRecord.model_validate({**json.loads(run.to_bytes()), "schema": "orch.run/1"})


def test_the_audit_reads_run_json_through_the_model(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    doc = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**doc, "host": {"host_hash": "ab" * 32}}))
    with pytest.raises(IncompleteRunError) as err:
        collect_evidence(resolve_home(tmp_path), "run1")
    assert err.value.problems == ["run.json: malformed (host.gpu_model: Field required)"]
    (run_dir / "run.json").write_text("[]")
    with pytest.raises(IncompleteRunError) as err:
        collect_evidence(resolve_home(tmp_path), "run1")
    assert err.value.problems == ["run.json: not an orch.run/2 document"]


# the probe summary


RECIPE = {"optimizer": "AdamW", "lr": 5e-06, "betas": [0.9, 0.95], "eps": 1e-08, "weight_decay": 0.0}


def _package(tmp: Path, summaries: list[dict[str, object]], steps: int = 2) -> TrainSpec:
    pkg = tmp / "pkg"
    pkg.mkdir()
    (tmp / "scratch").mkdir()
    for rank, fields in enumerate(summaries):
        lines = "".join(json.dumps({"rank": rank, "world_size": len(summaries), "step": s, "duration_s": 0.1,
                                    "probe_s": 0.0, "lr": [5e-06], "rng": {"cpu": "0"}}) + "\n"
                        for s in range(steps))
        (pkg / f"steps.rank{rank}.jsonl").write_text(lines)
        summary = {"schema": "orch.probe/2", "rank": rank, "world_size": len(summaries), "complete": True,
                   "steps": steps, "steps_file": f"steps.rank{rank}.jsonl",
                   "steps_sha256": hashlib.sha256(lines.encode()).hexdigest(), "final_digests": {"param/w": "1"},
                   "final_combined": "f", "observed_recipe": RECIPE, "watched_steps": [0, 1], **fields}
        (pkg / f"probe.rank{rank}.json").write_text(json.dumps(summary))
    return TrainSpec(run_id="r", name="train-A", arm_label="A", arm="baseline", package_dir=str(pkg),
                     sealed_dir=str(tmp), scratch_dir=str(tmp / "scratch"), result_path=str(pkg / "result.json"),
                     device="cpu", precision="fp32", nproc=len(summaries), script="t.py", steps=steps, warmup=0,
                     window=1, digest_first=0, digest_last=1)


def test_the_train_worker_reads_each_rank_summary_through_the_model(tmp_path: Path) -> None:
    result = collect(_package(tmp_path, [{}, {"peak_allocated": 7}]), stopped_cleanly=True)
    assert result.observed_recipe == ObservedRecipe.model_validate(RECIPE)
    assert [r.peak_allocated for r in result.ranks] == [None, 7] and result.watched_steps == [0, 1]
    assert result.ranks[1].final_digests == {"param/w": "1"} and result.ranks[0].checkpoint_sha256 is None


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ({"complete": False, "steps": 1}, "rank 1 stopped after 1 of 2 steps"),
        ({"schema": "orch.probe/1"}, "rank 1: malformed probe summary probe.rank1.json"),
        ({"peak_allocated": "a lot"}, "rank 1: malformed probe summary probe.rank1.json"),
        ({"observed_recipe": {**RECIPE, "eps": 1e-06}}, "ranks observed different recipes"),
        ({"watched_steps": [0]}, "ranks watched different steps"),
    ],
)
def test_a_summary_off_the_model_or_off_rank_0_is_refused(
    tmp_path: Path, second: dict[str, object], message: str
) -> None:
    with pytest.raises(WorkerFailed, match=message):
        collect(_package(tmp_path, [{}, second]), stopped_cleanly=True)


def test_a_probe_that_saw_no_optimizer_step_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkerFailed, match="the probe observed no optimizer step"):
        collect(_package(tmp_path, [{"observed_recipe": None}, {"observed_recipe": None}]), stopped_cleanly=True)
    assert ProbeSummary.model_validate_json((tmp_path / "pkg" / "probe.rank0.json").read_bytes()).complete


# what a launch reads of earlier runs


def test_an_earlier_run_of_any_version_is_read_for_its_fingerprint_checks_and_end(tmp_path: Path) -> None:
    golden = EarlierRun.read(GOLDEN_RUN / "run.json")
    assert golden is not None and (golden.status, golden.started, golden.packages[0].name) == (
        "complete", "2026-12-01T15:15:31Z", "checks")
    assert golden.host is not None and golden.host["gpu_count"] == 0
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": "orch.run/1", "run_id": "r0", "status": "failed", "extra": [1],
                               "packages": [{"name": "checks", "status": "ok", "env": {}}]}))
    run = EarlierRun.read(old)
    assert run is not None and (run.run_id, run.status, run.host, run.started) == ("r0", "failed", None, "")
    for junk in ("[]", "{not json", json.dumps({"host": "a host name"}), json.dumps({"packages": [1]})):
        old.write_text(junk)
        assert EarlierRun.read(old) is None
    assert EarlierRun.read(tmp_path / "absent.json") is None
