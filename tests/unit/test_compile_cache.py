"""orchestrator/isolation/compile_cache.py and the audit's compile-cache block: the sealed baseline cache, the packages'
copies, what a package took, made and rewrote, the kernels it tuned itself, and the diagnosis a user reads."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from ledger.verdict.documents.compile_cache_doc import compile_cache_doc, diagnosis
from orchestrator.isolation.compile_cache import MANIFEST, RunCaches, inventory, kernel_name, tuned_digest, tuned_pick
from protocol.errors import FailedError
from protocol.run_record import CacheUse, KeptCache, PackageEntry, RunRecord

KERNEL = "import triton\n@triton.jit\ndef triton_red_fused_sum_0(in_ptr, XBLOCK):\n    pass\n"


def _primed(tmp_path: Path, picks: dict[str, int] | None = None) -> RunCaches:
    caches = RunCaches.for_run({}, tmp_path / "scratch", tmp_path / "run", "a" * 64, "r1")
    (tmp_path / "run").mkdir(parents=True)
    folder = caches.prepare("prime", "prime")
    for key, block in (picks or {"ab/k1": 64, "cd/k2": 128}).items():
        path = folder / "inductor" / f"{key}.best_config"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"XBLOCK": block, "num_warps": 4, "time_taken_ms": 0.01}))
        path.with_suffix(".py").write_text(KERNEL.replace("_0", f"_{key[-1]}"))
    (folder / "triton" / "x.cubin").write_bytes(b"\x00kernel")
    return caches


def test_the_caches_live_in_scratch_unless_the_protocol_declares_a_folder(tmp_path: Path) -> None:
    own = RunCaches.for_run({"TORCHINDUCTOR_CACHE_DIR": "relative"}, tmp_path / "s", tmp_path / "r", "f" * 64, "r9")
    assert own.root == tmp_path / "s" / "compile-cache" and own.baseline.name == f"baseline-{'f' * 16}-r9"
    declared = RunCaches.for_run({"TRITON_CACHE_DIR": "/cache"}, tmp_path / "s", tmp_path / "r", "f" * 64, "r9")
    assert declared.root == Path("/cache") and declared.work == tmp_path / "s" / "compile-cache" / "packages"
    assert RunCaches.env(tmp_path) == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                                       "TRITON_CACHE_DIR": str(tmp_path / "triton")}


def test_before_the_prime_a_package_gets_an_empty_folder_after_it_a_copy(tmp_path: Path) -> None:
    caches = RunCaches.for_run({}, tmp_path / "scratch", tmp_path / "run", "a" * 64, "r1")
    checks = caches.prepare("checks", "checks")
    assert inventory(checks) == {} and caches.use("checks", "checks") is None
    caches = _primed(tmp_path / "p")
    sealed = caches.seal_baseline()
    assert (sealed.baseline_files, sealed.baseline_tuned, sealed.made_tuned) == (5, 2, 2)
    manifest = json.loads(caches.manifest_path.read_text())
    assert manifest["files"] == inventory(caches.baseline) and manifest["schema"] == "orch.compile-cache/2"
    assert manifest["folders"] == ["inductor", "inductor/ab", "inductor/cd", "triton"]
    assert sealed.sealed_entries == 9 and sealed.manifest_sha256 == hashlib.sha256(
        caches.manifest_path.read_bytes()).hexdigest()
    assert caches.manifest_path.name == MANIFEST
    copy = caches.prepare("train-A", "train")
    assert inventory(copy) == inventory(caches.baseline)
    for path in copy.rglob("*"):  # a copy, never a link: writing it leaves the baseline's file alone
        assert not path.is_symlink() and (path.is_dir() or os.stat(path).st_ino != os.stat(
            caches.baseline / path.relative_to(copy)).st_ino)
        assert os.access(path, os.W_OK)
    assert not any(os.stat(p).st_mode & 0o222 for p in [caches.baseline, *caches.baseline.rglob("*")])  # folders too
    caches.check_copy(copy)  # the fresh copy is the seal, entry for entry


def test_a_changed_baseline_cache_is_refused_naming_the_file(tmp_path: Path) -> None:
    caches = _primed(tmp_path)
    caches.seal_baseline()
    caches.check_baseline("train-A")
    target = caches.baseline / "inductor" / "ab" / "k1.best_config"
    target.chmod(0o644)
    target.write_text('{"XBLOCK": 8}')
    (caches.baseline / "triton" / "planted.so").write_text("slow")
    with pytest.raises(FailedError) as err:
        caches.check_baseline("during train-C")
    assert err.value.message.startswith("the baseline's compile cache changed during train-C: 2 entries "
                                        "(inductor/ab/k1.best_config (changed), triton/planted.so (added))")
    caches.prepare("prime", "prime")  # a prime starts from an empty folder, whatever an earlier attempt left
    assert inventory(caches.baseline) == {}


def test_a_package_that_tunes_a_kernel_itself_is_named_with_both_picks(tmp_path: Path) -> None:
    caches = _primed(tmp_path)
    caches.seal_baseline()
    folder = caches.prepare("train-C", "train")
    own = folder / "inductor" / "ef" / "k1.best_config"  # another key, the same kernel's name (its own source)
    own.parent.mkdir()
    own.write_text(json.dumps({"XBLOCK": 32, "num_warps": 4, "time_taken_ms": 0.5}))
    own.with_suffix(".py").write_text(KERNEL.replace("_0", "_1"))
    (folder / "triton" / "x.cubin").write_bytes(b"\x00other")  # a rewritten compiled artifact
    use = caches.use("train-C", "train")
    assert use is not None
    assert (use.taken, use.taken_tuned, use.made, use.made_tuned, use.changed) == (4, 2, 2, 1, 1)
    assert use.baseline_tuned_sha256 == tuned_digest(caches.baseline, caches.sealed or {})
    assert use.tuned_sha256 != use.baseline_tuned_sha256
    [kernel] = use.own_kernels
    assert kernel.kernel == "triton_red_fused_sum_1" and kernel.file == "inductor/ef/k1.best_config"
    assert kernel.pick == "XBLOCK 32, num_warps 4" and kernel.baseline_pick == "XBLOCK 64, num_warps 4"
    assert not kernel.rewritten
    caches.remove_work("train-C", "train")
    assert not folder.exists() and caches.baseline.is_dir()


def test_a_pick_is_its_configuration_without_its_timings(tmp_path: Path) -> None:
    a, b = tmp_path / "a.best_config", tmp_path / "b.best_config"
    a.write_text(json.dumps({"XBLOCK": 64, "time_taken_ms": 0.1, "triton_cache_hash": "x"}))
    b.write_text(json.dumps({"XBLOCK": 64, "time_taken_ms": 0.2}))
    assert tuned_pick(tmp_path, "a.best_config") == tuned_pick(tmp_path, "b.best_config") == {"XBLOCK": 64}
    assert tuned_digest(tmp_path, {"a.best_config": "", "x.py": ""}) == tuned_digest(tmp_path, {"a.best_config": ""})
    (tmp_path / "fused_add.autotune.json").write_text("{}")
    assert kernel_name(tmp_path, "fused_add.autotune.json") == "fused_add"  # Triton's autotuner names its file
    assert kernel_name(tmp_path, "zz/missing.best_config") == "missing"  # no source beside it: the file's stem


def _golden_run() -> RunRecord:
    """The golden home's run.json, the base the audit-block tests vary."""
    golden = Path(__file__).resolve().parents[1] / "golden" / "home" / "runs"
    return RunRecord.model_validate_json(next(golden.glob("*/run.json")).read_bytes())


def _entry(name: str, kind: str, label: str | None, use: CacheUse | None) -> PackageEntry:
    arm = None if label is None else ("candidate" if label.startswith("C") else "baseline")
    return PackageEntry(name=name, kind=kind, arm_label=label, arm=arm, env={}, status="ok",  # type: ignore[arg-type]
                        compile_cache=use)


def _use(tuned: str, own: list[dict[str, object]] | None = None, made: int = 0) -> CacheUse:
    return CacheUse.model_validate({
        "baseline_files": 5, "baseline_tuned": 2, "taken": 5 - made, "taken_tuned": 2, "made": made,
        "made_tuned": len(own or []), "changed": 0, "baseline_tuned_sha256": tuned, "tuned_sha256": tuned,
        "own_kernels": own or []})


def test_the_audit_block_and_its_diagnosis(tmp_path: Path) -> None:
    own = [{"kernel": "triton_red_fused_sum_1", "file": "f", "pick": "XBLOCK 32", "baseline_pick": "XBLOCK 64",
            "rewritten": False}]
    run = _golden_run()
    packages = [_entry("checks", "checks", None, None), _entry("prime", "prime", None, _use("d0")),
                _entry("train-A", "train", "A", _use("d0")), _entry("train-C", "train", "C", _use("d0", own, 1)),
                _entry("train-B", "train", "B", _use("d0")), _entry("watch-C", "replay", "C", _use("d1"))]
    run = run.updated(packages=packages)
    doc = compile_cache_doc(run, {"prime": 30.0, "train-A": 70.0}, exact=False)
    assert doc is not None and doc["prime_gpu_seconds"] == 30.0 and doc["prime_share"] == pytest.approx(0.3)
    assert doc["same_baseline_picks"] == ["train-A", "train-B", "train-C"]
    assert doc["differing_baseline_picks"] == ["watch-C"]
    assert doc["diagnosis"][0].startswith("train-C tuned 1 kernel(s) itself instead of the baseline's primed pick: "
                                          "triton_red_fused_sum_1 (XBLOCK 32; the baseline's: XBLOCK 64)")
    assert compile_cache_doc(run, {}, exact=True)["diagnosis"] == []  # type: ignore[index]
    assert compile_cache_doc(run.updated(packages=packages[:1]), {}, exact=False) is None  # recorded before prime
    launches = {"train-C": {"own_kernels": [], "made": 3}, "train-A": {"own_kernels": [], "made": 0}}
    arms = {"train-C": "candidate", "train-A": "baseline"}
    assert "consistent with compile-time code generation" in diagnosis(launches, arms)[0]
    launches["train-C"]["made"] = 0
    assert "not explained by compile-time tuning" in diagnosis(launches, arms)[0]
    launches["train-A"]["made"] = 2
    assert diagnosis(launches, arms)[0].startswith("train-A (baseline) compiled or tuned what the prime did not reach")


def test_a_run_with_the_prime_package_is_read_with_it_and_one_without_it_as_recorded(tmp_path: Path) -> None:
    from test_audit import RunSpec, make_run

    from ledger.verdict.decide.evidence import collect_evidence
    from ledger.verdict.documents.audit import audit_run
    from protocol.home import resolve_home

    make_run(tmp_path / "new", spec=RunSpec(calibrated=True, primed=True))
    ev = collect_evidence(resolve_home(tmp_path / "new"), "run1")
    assert ev.names[:3] == ("checks", "prime", "train-A") and "prime" in ev.closes
    doc = audit_run(tmp_path / "new", "run1").document
    assert doc["verdict"] == "accepted" and "prime" in doc["cost"]["gpu_seconds"]
    assert "compile_cache" not in doc  # its prime entry recorded no cache use
    make_run(tmp_path / "old", spec=RunSpec(calibrated=True))
    assert "prime" not in collect_evidence(resolve_home(tmp_path / "old"), "run1").names


def test_compile_none_passes_an_empty_folder_and_refuses_one_that_compiled(tmp_path: Path) -> None:
    caches = RunCaches.for_run({}, tmp_path / "scratch", tmp_path / "run", "a" * 64, "r1")
    caches.prepare("train-A", "train")
    caches.check_compiled_nothing("train-A")  # the empty inductor/ and triton/ folders are nothing compiled
    folder = caches.prepare("train-C", "train")
    (folder / "inductor" / "ab").mkdir()
    (folder / "inductor" / "ab" / "k1.py").write_text(KERNEL)
    (folder / "inductor" / "ab" / "k1.best_config").write_text(json.dumps({"XBLOCK": 64}))
    (folder / "triton" / "x.lock").write_text("")  # a writer's lock file is not a compiled artifact
    with pytest.raises(FailedError) as err:
        caches.check_compiled_nothing("train-C")
    assert err.value.message.startswith(
        "train-C compiled 2 file(s) into its compile cache (1 tuned pick(s): inductor/ab/k1.best_config, "
        "inductor/ab/k1.py) but the protocol says measurement.compile: none"), err.value.message
    assert err.value.message.endswith("set measurement.compile: prime (the default)")


def test_the_audit_block_of_a_compile_none_run_names_the_packages_checked(tmp_path: Path) -> None:
    run = _golden_run()
    run = run.updated(packages=[_entry("checks", "checks", None, None), _entry("train-A", "train", "A", None)])
    doc = compile_cache_doc(run, {"train-A": 3.0}, True, "none")
    assert doc == {"mode": "none", "checked": ["checks", "train-A"], "prime_gpu_seconds": 0.0, "prime_share": 0.0,
                   "diagnosis": []}
    from ledger.verdict.documents.report import compile_cache_lines

    assert compile_cache_lines({"compile_cache": doc}) == [
        "compile cache: measurement.compile none: no prime; 2 package(s) checked, each compiled and tuned nothing"]


def test_a_shortened_prime_names_every_baseline_launch_that_compiled_what_it_did_not_reach() -> None:
    """measurement.prime_steps: the audit block records how many steps the prime ran, and `unprimed` names each
    baseline launch that compiled or tuned anything of its own (the candidate's own kernels are not named there)."""
    own = [{"kernel": "triton_red_fused_sum_1", "file": "f", "pick": "XBLOCK 32", "baseline_pick": None,
            "rewritten": False}]
    run = _golden_run()
    packages = [_entry("checks", "checks", None, None), _entry("prime", "prime", None, _use("d0")),
                _entry("train-A", "train", "A", _use("d0", made=2)),
                _entry("train-C", "train", "C", _use("d0", own, 1)),
                _entry("train-B", "train", "B", _use("d0", own, 1)), _entry("watch-C", "replay", "C", _use("d0"))]
    run = run.updated(packages=packages)
    full = compile_cache_doc(run, {"prime": 30.0}, exact=True)
    assert full is not None and "prime_steps" not in full and "unprimed" not in full  # the full prime: as before
    doc = compile_cache_doc(run, {"prime": 30.0}, exact=True, prime_steps=(2, 16))
    assert doc is not None and doc["prime_steps"] == 2
    assert doc["unprimed"] == [
        "train-A compiled or tuned what the prime's 2 of 16 steps did not reach: 2 compiled artifact(s)",
        "train-B compiled or tuned what the prime's 2 of 16 steps did not reach: triton_red_fused_sum_1 (XBLOCK 32; "
        "not in the baseline's cache)"]
    clean = run.updated(packages=[*packages[:2], _entry("train-A", "train", "A", _use("d0")),
                                  _entry("train-C", "train", "C", _use("d0", own, 1)),
                                  _entry("train-B", "train", "B", _use("d0"))])
    assert compile_cache_doc(clean, {}, exact=True, prime_steps=(2, 16))["unprimed"] == []  # type: ignore[index]
    from ledger.verdict.documents.report import compile_cache_lines

    lines = compile_cache_lines({"compile_cache": doc})
    assert lines[0].endswith("; the prime ran 2 of the steps (measurement.prime_steps)")
    assert lines[-1] == f"compile cache: not reached by the prime: {doc['unprimed'][1]}"


# issue 49, hole 3: what Inductor and Triton load is what the seal sees. Each planted entry passed check_baseline and
# reached B's copy before the fix (inventory skipped lock files, tmp names, links and folders; copies kept links)
@pytest.mark.parametrize("plant", ["lock-pickle", "tmp-name", "key-folder-link", "triton-swapped-for-link",
                                   "empty-folder", "fifo"])
def test_every_entry_planted_in_the_sealed_cache_is_named(tmp_path: Path, plant: str) -> None:
    caches = _primed(tmp_path)
    caches.seal_baseline()
    base = caches.baseline
    for folder in [base, *(p for p in base.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)  # what a same-user package in scan mode can do: the modes do not stop it
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    if plant == "lock-pickle":  # Inductor's FX-graph lookup unpickles every file of a key folder, 0.lock included
        (base / "inductor" / "ab" / "0.lock").write_bytes(b"\x80\x04planted")
        named = "inductor/ab/0.lock (added)"
    elif plant == "tmp-name":
        (base / "inductor" / "ab" / "tmpk1").write_bytes(b"planted")
        named = "inductor/ab/tmpk1 (added)"
    elif plant == "key-folder-link":
        (base / "inductor" / "ef").symlink_to(outside)
        named = "inductor/ef (added: a link)"
    elif plant == "triton-swapped-for-link":
        os.rename(base / "triton", tmp_path / "moved")
        (base / "triton").symlink_to(outside)
        named = "triton (changed into a link)"
    elif plant == "empty-folder":
        (base / "inductor" / "zz").mkdir()
        named = "inductor/zz (added: a folder)"
    else:  # a FIFO is named, never waited on
        os.mkfifo(base / "inductor" / "ab" / "k9.best_config")
        named = "inductor/ab/k9.best_config (added: a FIFO)"
    with pytest.raises(FailedError) as err:
        caches.check_baseline("during train-C")
    assert named in err.value.message
    if plant != "empty-folder":  # and a copy made from it anyway is refused before the package starts
        with pytest.raises(FailedError) as err:
            copy = caches.prepare("train-B", "train")
            caches.check_copy(copy)
        assert "compile cache" in err.value.message


def test_a_prime_that_leaves_a_link_or_a_fifo_fails_naming_it(tmp_path: Path) -> None:
    caches = _primed(tmp_path)
    (caches.baseline / "inductor" / "ab" / "k3.best_config").symlink_to(tmp_path / "anywhere")
    os.mkfifo(caches.baseline / "triton" / "pipe")
    with pytest.raises(FailedError) as err:
        caches.seal_baseline()
    assert err.value.message.startswith("the prime left 2 link(s) or special file(s) in the baseline's compile "
                                        "cache: inductor/ab/k3.best_config (link), triton/pipe (FIFO)")
    assert caches.seal is None and not caches.manifest_path.exists()


def test_a_copy_written_after_orch_made_it_is_refused_before_the_package(tmp_path: Path) -> None:
    caches = _primed(tmp_path)
    caches.seal_baseline()
    copy = caches.prepare("train-B", "train")
    caches.check_copy(copy)
    (copy / "inductor" / "ab" / "k1.best_config").write_text('{"XBLOCK": 8}')  # e.g. a process left outside
    with pytest.raises(FailedError) as err:
        caches.check_copy(copy)
    assert err.value.message == ("the copy of the baseline's compile cache for train-B is not the sealed cache: "
                                 "inductor/ab/k1.best_config (changed); something wrote it after orch made it")


def test_reading_a_package_copy_never_waits_on_a_fifo_or_follows_a_link(tmp_path: Path) -> None:
    caches = _primed(tmp_path)
    caches.seal_baseline()
    copy = caches.prepare("train-C", "train")
    source = copy / "inductor" / "ab" / "k1.py"
    source.unlink()
    os.mkfifo(source)  # kernel_name reads <hash>.py beside a tuned file: a FIFO there hung orch
    (copy / "inductor" / "ab" / "k1.best_config").write_text(json.dumps({"XBLOCK": 16}))
    (copy / "inductor" / "cd" / "k2.best_config").unlink()
    (copy / "inductor" / "cd" / "k2.best_config").symlink_to("/dev/zero")
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(caches.use("train-C", "train")), daemon=True)
    worker.start()
    worker.join(30)
    assert done, "use() blocked on a FIFO or a device"
    use = done[0]
    assert isinstance(use, CacheUse) and use.changed == 1 and use.own_kernels[0].kernel == "k1"
    assert stat.S_ISFIFO(os.lstat(source).st_mode)


def test_the_audit_reads_the_manifest_back(tmp_path: Path) -> None:
    from ledger.verdict.decide.evidence import compile_cache_manifest_problems

    caches = _primed(tmp_path)
    use = caches.seal_baseline()
    run = _golden_run()
    run = run.updated(packages=[_entry("prime", "prime", None, use)])
    run_dir = caches.manifest_path.parent
    assert compile_cache_manifest_problems(run_dir, run) == []
    data = json.loads(caches.manifest_path.read_text())
    data["files"]["inductor/ab/0.lock"] = "0" * 64  # an entry added to the list after the seal
    caches.manifest_path.write_text(json.dumps(data))
    assert compile_cache_manifest_problems(run_dir, run) == [
        "compile-cache.baseline.json: its sha256 is not the one the prime recorded in run.json"]
    caches.manifest_path.unlink()
    caches.manifest_path.symlink_to(tmp_path / "elsewhere.json")
    assert compile_cache_manifest_problems(run_dir, run) == [
        "compile-cache.baseline.json: unreadable (a link, not a regular file)"]
    old = run.updated(packages=[_entry("prime", "prime", None, use.model_copy(update={"manifest_sha256": None}))])
    assert compile_cache_manifest_problems(run_dir, old) == []  # recorded before the digest: nothing to compare


def test_the_audit_names_the_kept_cache_a_run_loaded_instead_of_a_prime_and_the_one_a_prime_kept() -> None:
    """A run that loaded a kept cache ran no prime: the audit says which cache, which run sealed it and when, what its
    prime cost there, and that every entry was checked; it never reports a prime of 0 GPU-s (issue 51)."""
    from ledger.verdict.documents.report import compile_cache_lines

    run = _golden_run()
    kept = KeptCache(key="k" * 64, name="baseline-kkkk-r0", reused=True, sealed_by="r0",
                     sealed_at="2026-12-07T08:24:16Z", manifest_sha256="m" * 64, entries=7, files=5, tuned=2,
                     tuned_sha256="d0" * 32, prime_steps=3, launch_steps=16, prime_gpu_seconds=284.7, checked_s=0.12)
    trainers = [_entry("checks", "checks", None, None), _entry("train-A", "train", "A", _use("d0" * 32)),
                _entry("train-C", "train", "C", _use("d0" * 32)), _entry("train-B", "train", "B", _use("d0" * 32))]
    doc = compile_cache_doc(run.updated(packages=trainers, compile_cache=kept), {"train-A": 9.0}, exact=True)
    assert doc is not None and doc["prime_gpu_seconds"] == 0.0 and doc["loaded"]["sealed_by"] == "r0"
    lines = compile_cache_lines({"compile_cache": doc})
    assert lines[:2] == [
        "compile cache: no prime; loaded the kept cache baseline-kkkk-r0, sealed by run r0 at 2026-12-07T08:24:16Z "
        "(its prime ran 3 step(s), 284.7 GPU-s paid in that run): 5 file(s), 2 tuned pick(s) (sha256 d0d0d0d0d0d0); "
        "7 entries checked against its manifest in 0.1 s",
        "compile cache: 3 of 3 trainer launch(es) ran the baseline's picks"]
    older = kept.model_copy(update={"prime_steps": None, "prime_gpu_seconds": None, "checked_s": None})
    doc = compile_cache_doc(run.updated(packages=trainers, compile_cache=older), {}, exact=True)
    assert compile_cache_lines({"compile_cache": doc})[0] == (
        "compile cache: no prime; loaded the kept cache baseline-kkkk-r0, sealed by run r0 at 2026-12-07T08:24:16Z: 5 "
        "file(s), 2 tuned pick(s) (sha256 d0d0d0d0d0d0); 7 entries checked against its manifest")
    # the run that primed and kept its cache: the prime's line, then where it was kept and why this run primed
    sealer = kept.model_copy(update={"reused": False, "sealed_by": run.run_id, "checked_s": None,
                                     "reason": "no kept compile cache of key kkkk (the first run of this baseline)"})
    primed = [trainers[0], _entry("prime", "prime", None, _use("d0" * 32)), *trainers[1:]]
    doc = compile_cache_doc(run.updated(packages=primed, compile_cache=sealer), {"prime": 30.0, "train-A": 10.0},
                            exact=True)
    assert compile_cache_lines({"compile_cache": doc})[:2] == [
        "compile cache: the prime sealed 5 file(s), 2 tuned pick(s) (sha256 d0d0d0d0d0d0) in 30.0 GPU-s (75.0% of the "
        "run)",
        "compile cache: kept as baseline-kkkk-r0; later runs of its key load it; a fresh prime: no kept compile cache "
        "of key kkkk (the first run of this baseline)"]
