"""What the audit reads back from paths a package could have written (ledger/verdict/decide/evidence.py), worked
case by case: a train's step files (missing, a folder, a link, not UTF-8; one rank's problem never hides the next
rank's file) and the sealed baseline cache's manifest (compile-cache.baseline.json), from a prime or from a kept
cache (issue 51), against run.json's digest and entry count."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from test_audit import RunSpec, make_run
from test_exactness_rules import _summary as rank_summary
from test_exactness_rules import _train as train_result

from ledger.verdict.decide.evidence import (
    IncompleteRunError,
    collect_evidence,
    compile_cache_manifest_problems,
    read_steps,
)
from protocol.home import resolve_home
from protocol.results import TrainResult
from protocol.run_record import CacheUse, KeptCache, PackageEntry, RunRecord

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "home" / "runs"
MANIFEST = "compile-cache.baseline.json"


def _train(ranks: int) -> TrainResult:
    """A train of `ranks` ranks whose step files are steps.rank<r>.jsonl (read_steps is given the step count)."""
    return train_result("A", [rank_summary(r, {}) for r in range(ranks)])


def test_a_missing_steps_file_or_a_folder_is_missing_and_the_next_rank_is_still_read(tmp_path: Path) -> None:
    (tmp_path / "steps.rank1.jsonl").write_text("")
    problems: list[str] = []
    assert read_steps(tmp_path, _train(2), "packages/train-A", 0, problems) == {1: []}
    assert problems == ["packages/train-A/steps.rank0.jsonl: missing"]
    (tmp_path / "steps.rank0.jsonl").mkdir()
    problems = []
    assert read_steps(tmp_path, _train(2), "packages/train-A", 0, problems) == {1: []}
    assert problems == ["packages/train-A/steps.rank0.jsonl: missing"]


def test_a_linked_steps_file_or_folder_is_unreadable_never_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real.jsonl").write_text("")
    (tmp_path / "steps.rank0.jsonl").symlink_to(tmp_path / "real")  # a link to a folder is not "missing"
    (tmp_path / "steps.rank1.jsonl").symlink_to(tmp_path / "real.jsonl")
    (tmp_path / "steps.rank2.jsonl").write_text("")
    problems: list[str] = []
    assert read_steps(tmp_path, _train(3), "p", 0, problems) == {2: []}  # rank 2 is read after two refusals
    assert problems == ["p/steps.rank0.jsonl: unreadable (a link, not a regular file)",
                        "p/steps.rank1.jsonl: unreadable (a link, not a regular file)"]


def test_a_steps_file_that_is_not_utf8_is_unreadable_with_the_decoders_words(tmp_path: Path) -> None:
    (tmp_path / "steps.rank0.jsonl").write_bytes(b"\xff\xfe{}")
    problems: list[str] = []
    assert read_steps(tmp_path, _train(1), "p", 0, problems) == {}
    assert problems == ["p/steps.rank0.jsonl: unreadable ('utf-8' codec can't decode byte 0xff in position 0: "
                        "invalid start byte)"]


def _run() -> RunRecord:
    return RunRecord.model_validate_json(next(GOLDEN.glob("*/run.json")).read_bytes())


def _manifest(run_dir: Path, files: int = 2, folders: int = 1, raw: bytes | None = None) -> str:
    doc = {"files": {f"inductor/ab/f{i}.py": "0" * 64 for i in range(files)},
           "folders": [f"inductor/d{i}" for i in range(folders)]}  # fmt: skip
    data = raw if raw is not None else json.dumps(doc).encode()
    (run_dir / MANIFEST).write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _sealed(sha: str | None, entries: int | None) -> CacheUse:
    return CacheUse(baseline_files=2, baseline_tuned=0, taken=0, taken_tuned=0, made=2, made_tuned=0, changed=0,
                    baseline_tuned_sha256="t", tuned_sha256="t", own_kernels=[], sealed_entries=entries,
                    manifest_sha256=sha)  # fmt: skip


def _with_prime(use: CacheUse | None, kept: KeptCache | None = None) -> RunRecord:
    prime = PackageEntry(name="prime", kind="prime", arm_label=None, arm=None, env={}, status="ok",
                         compile_cache=use)  # fmt: skip
    return _run().updated(packages=[prime], compile_cache=kept)


def _kept(sha: str, entries: int, reused: bool = True) -> KeptCache:
    return KeptCache(key="k" * 64, name="baseline-kkkk-r0", reused=reused, sealed_by="r0", sealed_at="2026-12-07",
                     manifest_sha256=sha, entries=entries, files=2, tuned=0, tuned_sha256="t", prime_steps=2,
                     launch_steps=16, prime_gpu_seconds=1.0)  # fmt: skip


def test_the_primes_manifest_read_back_equal_in_digest_and_count(tmp_path: Path) -> None:
    sha = _manifest(tmp_path)
    assert compile_cache_manifest_problems(tmp_path, _with_prime(_sealed(sha, 3))) == []
    assert compile_cache_manifest_problems(tmp_path, _with_prime(_sealed(sha, None))) == []  # no count recorded
    assert compile_cache_manifest_problems(tmp_path, _with_prime(_sealed(sha, 4))) == [
        f"{MANIFEST}: lists 3 entries, the prime sealed 4"]
    assert compile_cache_manifest_problems(tmp_path, _with_prime(_sealed("0" * 64, 3))) == [
        f"{MANIFEST}: its sha256 is not the one the prime recorded in run.json"]


def test_nothing_to_read_back_without_a_recorded_digest(tmp_path: Path) -> None:
    assert compile_cache_manifest_problems(tmp_path, None) == []
    assert compile_cache_manifest_problems(tmp_path, _with_prime(None)) == []
    assert compile_cache_manifest_problems(tmp_path, _with_prime(_sealed(None, 3))) == []  # before the digest
    # a kept cache this run sealed itself (not reused) and no prime entry: nothing was loaded from it
    assert compile_cache_manifest_problems(tmp_path, _with_prime(None, _kept("0" * 64, 3, reused=False))) == []


def test_a_missing_or_malformed_manifest_is_named(tmp_path: Path) -> None:
    assert compile_cache_manifest_problems(tmp_path, _with_prime(_sealed("0" * 64, 3))) == [
        f"{MANIFEST}: missing (the prime sealed the baseline's compile cache)"]
    for raw in (b"not json", json.dumps({"files": {}}).encode(), json.dumps([1]).encode()):
        sha = _manifest(tmp_path, raw=raw)
        assert compile_cache_manifest_problems(tmp_path, _with_prime(_sealed(sha, 3))) == [f"{MANIFEST}: malformed"]
    (tmp_path / MANIFEST).unlink()
    (tmp_path / MANIFEST).mkdir()
    (problem,) = compile_cache_manifest_problems(tmp_path, _with_prime(_sealed("0" * 64, 3)))
    assert problem.startswith(f"{MANIFEST}: unreadable (") and "None" not in problem


def test_a_reused_kept_cache_is_read_back_as_the_sealed_one(tmp_path: Path) -> None:
    sha = _manifest(tmp_path, files=3, folders=2)
    assert compile_cache_manifest_problems(tmp_path, _with_prime(None, _kept(sha, 5))) == []
    assert compile_cache_manifest_problems(tmp_path, _with_prime(None, _kept(sha, 6))) == [
        f"{MANIFEST}: lists 5 entries, the prime sealed 6"]
    assert compile_cache_manifest_problems(tmp_path, _with_prime(None, _kept("1" * 64, 5))) == [
        f"{MANIFEST}: its sha256 is not the one the prime recorded in run.json"]


def test_a_run_whose_kept_cache_is_not_its_primes_is_named(tmp_path: Path) -> None:
    sha = _manifest(tmp_path)
    assert compile_cache_manifest_problems(tmp_path, _with_prime(_sealed(sha, 3), _kept(sha, 3, reused=False))) == []
    assert compile_cache_manifest_problems(tmp_path, _with_prime(_sealed(sha, 3), _kept("2" * 64, 3))) == [
        "run.json: the compile cache it says every package loaded is not the one its prime sealed"]


@pytest.mark.parametrize("entries", [0, 1])
def test_an_empty_manifest_counts_zero(tmp_path: Path, entries: int) -> None:
    sha = _manifest(tmp_path, files=0, folders=0)
    got = compile_cache_manifest_problems(tmp_path, _with_prime(_sealed(sha, entries)))
    assert got == ([] if entries == 0 else [f"{MANIFEST}: lists 0 entries, the prime sealed 1"])


def test_a_whole_runs_evidence_reads_its_primes_manifest_back_from_its_own_folder(tmp_path: Path) -> None:
    """collect_evidence refuses a primed run whose sealed manifest is not in its run folder, and takes it once it is."""
    run_dir = make_run(tmp_path, "run1", RunSpec(primed=True))
    run = RunRecord.model_validate_json((run_dir / "run.json").read_bytes())
    manifest = tmp_path / "manifest.json"
    sha = _manifest(tmp_path)
    (tmp_path / MANIFEST).rename(manifest)
    packages = [p.model_copy(update={"compile_cache": _sealed(sha, 3)}) if p.name == "prime" else p
                for p in run.packages]
    (run_dir / "run.json").write_text(run.updated(packages=packages).model_dump_json(by_alias=True))
    with pytest.raises(IncompleteRunError) as err:
        collect_evidence(resolve_home(tmp_path), "run1")
    assert err.value.problems == [f"{MANIFEST}: missing (the prime sealed the baseline's compile cache)"]
    manifest.rename(run_dir / MANIFEST)
    assert collect_evidence(resolve_home(tmp_path), "run1").run.package("prime").compile_cache == _sealed(sha, 3)
