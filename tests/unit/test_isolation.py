"""Package isolation on real packages (a checks package whose prepare command plays a candidate caching in the
shared /tmp): private TMPDIR and HOME, a read-only /tmp in the package's mount namespace, and the scan fallback."""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

import pytest

from orchestrator.isolation import isolate, namespaces_work, protected_dirs
from orchestrator.packages import package_env, run_package
from protocol.package import ChecksSpec

CHEAT = """
import json, os, sys
out = {"tmpdir": os.environ.get("TMPDIR"), "home": os.environ.get("HOME"),
       "pidns": os.environ.get("ORCH_PACKAGE_PID_NAMESPACE")}
open(os.path.join(os.environ["TMPDIR"], "private.txt"), "w").write("allowed")
try:
    open(sys.argv[1], "w").write("cached work for the next launch")
    out["shared"] = "written"
except OSError as exc:
    out["shared"] = f"{type(exc).__name__}: {exc.strerror}"
open(sys.argv[2], "w").write(json.dumps(out))
"""


def _spec(tmp_path: Path, target: str) -> ChecksSpec:
    run_dir = tmp_path / "home" / "runs" / "r1"
    pkg_dir = run_dir / "packages" / "checks"
    pkg_dir.mkdir(parents=True)
    scratch = tmp_path / "home" / "scratch" / "r1"
    scratch.mkdir(parents=True)
    seen = pkg_dir / "seen.json"
    return ChecksSpec.model_validate({
        "run_id": "r1", "name": "checks", "kind": "checks", "package_dir": str(pkg_dir),
        "sealed_dir": str(tmp_path), "scratch_dir": str(scratch), "result_path": str(pkg_dir / "result.json"),
        "device": "cpu", "precision": "fp32",
        "prepare": [{"name": "cache", "argv": [sys.executable, "-c", CHEAT, target, str(seen)]}],
    })


def _env() -> dict[str, str]:
    return package_env(os.environ, {}, {}, {}, "r1")


@pytest.mark.skipif(not namespaces_work(), reason="this kernel or user cannot make a mount namespace")
def test_namespace_makes_the_shared_tmp_read_only_and_keeps_tmpdir_home_private(tmp_path: Path) -> None:
    target = f"/tmp/orch-cheat-{secrets.token_hex(6)}"
    spec = _spec(tmp_path, target)
    outcome = run_package(spec, _env(), 120)
    assert outcome.status == "ok", outcome.note
    assert outcome.extra["isolation"] == "namespace"
    seen = json.loads((Path(spec.package_dir) / "seen.json").read_text())
    private = Path(spec.scratch_dir) / "isolated" / "checks"
    assert seen["tmpdir"] == str(private / "tmp") and seen["home"] == str(private / "home")
    assert seen["pidns"] == "1"  # told it runs in its own PID namespace (its quiet-host snapshot cannot see others)
    assert (private / "tmp" / "private.txt").read_text() == "allowed"
    # the cache write was impossible: it failed inside the package and nothing reached the host's /tmp
    assert seen["shared"] == "OSError: Read-only file system"
    assert not os.path.exists(target)


def test_scan_fallback_fails_the_package_naming_the_path(tmp_path: Path) -> None:
    name = f"orch-cheat-{secrets.token_hex(6)}"
    target = f"/tmp/{name}"
    spec = _spec(tmp_path, target)
    try:
        outcome = run_package(spec, _env(), 120, isolation="scan")
        assert outcome.extra["isolation"] in ("scan+cgroup", "scan+token-scan")
        seen = json.loads((Path(spec.package_dir) / "seen.json").read_text())
        assert seen["shared"] == "written" and seen["pidns"] is None  # scan mode: the host's own PID namespace
        assert outcome.status == "failed"
        assert outcome.note is not None and "wrote outside the run directory and scratch: " in outcome.note
        assert target in outcome.note and "\n" not in outcome.note
    finally:
        if os.path.exists(target):
            os.unlink(target)


def test_the_run_directory_and_scratch_are_the_only_writable_holes(tmp_path: Path) -> None:
    iso = isolate(str(tmp_path / "scratch"), "train-C", [str(tmp_path / "run"), str(tmp_path / "scratch")], "scan")
    assert iso.tmpdir == tmp_path / "scratch" / "isolated" / "train-C" / "tmp"
    assert "/tmp" in protected_dirs() and iso.protected == protected_dirs()
    ns = isolate(str(tmp_path), "x", [str(tmp_path)], "namespace")
    ns.start()
    cmd = ns.command(["python", "-V"], str(tmp_path))
    assert cmd[-3:] == ["--", "python", "-V"] and cmd[1:3] == ["-I", "-S"] and cmd[3].endswith("ns_init.py")
    assert ns.ending == "pid-namespace" and json.loads(cmd[4])["holes"] == [str(tmp_path.resolve()), str(ns.root)]
    ns.spawned()
    ns.finish()
    with pytest.raises(ValueError):
        isolate(str(tmp_path), "x", [], "none")


@pytest.mark.skipif(not namespaces_work(), reason="this kernel or user cannot make a mount namespace")
def test_a_package_may_write_its_own_compile_cache_folder_and_no_other(tmp_path: Path) -> None:
    root = f"/tmp/orch-compile-cache-{secrets.token_hex(6)}"  # a folder the protocol declares (orch rehearse)
    own, baseline = f"{root}/packages/checks", f"{root}/baseline-x"  # orchestrator/compile_cache.py's layout
    os.makedirs(own)
    os.makedirs(baseline)
    try:
        spec = _spec(tmp_path, f"{own}/inductor-entry")
        outcome = run_package(spec, _env(), 120, cache=own)
        assert outcome.status == "ok", outcome.note
        seen = json.loads((Path(spec.package_dir) / "seen.json").read_text())
        assert seen["shared"] == "written" and Path(own, "inductor-entry").is_file()
        for target in (f"{baseline}/inductor-entry", f"{root}/inductor-entry"):  # the baseline's, the root itself
            spec = _spec(tmp_path / secrets.token_hex(4), target)
            outcome = run_package(spec, _env(), 120, cache=own)
            seen = json.loads((Path(spec.package_dir) / "seen.json").read_text())
            assert seen["shared"] == "OSError: Read-only file system" and not Path(target).exists()
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(not namespaces_work(), reason="this kernel or user cannot make a mount namespace")
def test_orchs_home_is_read_only_to_a_package_even_outside_tmp(tmp_path: Path) -> None:
    # found by the attack battery: with the home in a project checkout (./.orch, the default), a candidate's package
    # appended a well-formed record to the ledger mid-run; tmp_path is under /tmp, so the home goes under the repo
    base = Path(__file__).resolve().parents[2] / ".orch" / f"isolation-{secrets.token_hex(6)}"
    try:
        spec = _spec(base, str(base / "home" / "ledger" / "ledger.arrows"))
        (base / "home" / "ledger").mkdir()
        outcome = run_package(spec, _env(), 120)
        assert outcome.status == "ok", outcome.note
        seen = json.loads((Path(spec.package_dir) / "seen.json").read_text())
        assert seen["shared"] == "OSError: Read-only file system"  # the run directory itself stayed writable
        assert not (base / "home" / "ledger" / "ledger.arrows").exists()
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
