"""Package isolation on real packages (a checks package whose prepare command plays a candidate caching in the
shared /tmp): private TMPDIR and HOME, a read-only /tmp in the package's mount namespace, and the scan fallback."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.isolation.package_isolation import fresh_folders, isolate, namespaces_work, protected_dirs
from orchestrator.isolation.packages import package_env, run_package
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


def _spec(tmp_path: Path, target: str, script: str = CHEAT, args: tuple[str, ...] = ()) -> ChecksSpec:
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
        "prepare": [{"name": "cache", "argv": [sys.executable, "-c", script, target, str(seen), *args]}],
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
    # TMPDIR: short whatever the home's path (AF_UNIX socket paths under it), made for the package, removed after it
    assert seen["tmpdir"].startswith("/tmp/orch-") and len(seen["tmpdir"]) <= 64
    assert seen["home"] == str(private / "home")
    assert not os.path.exists(seen["tmpdir"])
    assert seen["pidns"] == "1"  # told it runs in its own PID namespace (its quiet-host snapshot cannot see others)
    # the cache write was impossible: it failed inside the package and nothing reached the host's /tmp
    assert seen["shared"] == "OSError: Read-only file system"
    assert not os.path.exists(target)


def test_scan_fallback_fails_the_package_naming_the_path(tmp_path: Path) -> None:
    shared = tmp_path.resolve() / "shared"  # stands for /tmp: private, so no other process on the host adds to it
    shared.mkdir()
    target = str(shared / "orch-cheat")
    spec = _spec(tmp_path, target)
    outcome = run_package(spec, _env(), 120, isolation="scan", shared=[str(shared)])
    assert outcome.extra["isolation"] in ("scan+cgroup", "scan+token-scan")
    seen = json.loads((Path(spec.package_dir) / "seen.json").read_text())
    assert seen["shared"] == "written" and seen["pidns"] is None  # scan mode: the host's own PID namespace
    assert outcome.status == "failed" and outcome.extra["written_outside"] == [target]
    assert outcome.note is not None and "\n" not in outcome.note
    assert outcome.note.startswith(f"new entries outside the run directory and scratch while it ran: {target} (")
    assert "scan mode cannot tell which process made an entry" in outcome.note


# the package writes six entries into the shared folder, then lets another process add its own and waits for it
SIX = """
import os, sys, time
for i in range(6):
    open(f"{sys.argv[1]}-{i}", "w").write("the package's own")
open(sys.argv[3], "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[4]) and time.monotonic() < deadline:
    time.sleep(0.01)
open(sys.argv[2], "w").write("{}")
"""
# another process of the same user, outside the package: once the package says so, it makes one entry it keeps open
# and one it removes right after orch's first listing of the folder after the package (inotify: the folder itself
# closed after reading), before the re-listing
FOREIGN = """
import ctypes, os, struct, sys, time
shared, go, done = sys.argv[1:4]
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.01)
held = open(os.path.join(shared, "held-by-another-process"), "w")
gone = os.path.join(shared, "gone-before-the-re-listing")
open(gone, "w").close()
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
assert fd >= 0 and libc.inotify_add_watch(fd, shared.encode(), 0x10) >= 0  # IN_CLOSE_NOWRITE
open(done, "w").close()
listed = False
while not listed:
    buf, at = os.read(fd, 65536), 0
    while at < len(buf):
        _, mask, _, size = struct.unpack_from("iIII", buf, at)
        listed = listed or size == 0  # no name: the watched folder itself, closed after a listing
        at += 16 + size
os.unlink(gone)
time.sleep(600)
"""


def test_scan_mode_blames_only_new_entries_that_stay_and_no_other_process_holds(tmp_path: Path) -> None:
    shared, sync = tmp_path.resolve() / "shared", tmp_path / "sync"
    shared.mkdir()
    sync.mkdir()
    go, done = str(sync / "go"), str(sync / "done")
    spec = _spec(tmp_path, str(shared / "own"), SIX, (go, done))
    foreign = subprocess.Popen([sys.executable, "-c", FOREIGN, str(shared), go, done])
    try:
        outcome = run_package(spec, _env(), 120, isolation="scan", shared=[str(shared)])
        assert foreign.poll() is None  # it still holds its entry open
    finally:
        foreign.kill()
        foreign.wait()
    assert Path(done).exists() and (shared / "held-by-another-process").exists()
    assert not (shared / "gone-before-the-re-listing").exists()  # there at the first listing, removed since
    own = [str(shared / f"own-{i}") for i in range(6)]
    assert outcome.status == "failed" and outcome.extra["written_outside"] == own  # all six, and no other
    assert outcome.note is not None and ", ".join(own[:5]) + " and 1 more (" in outcome.note
    assert "another-process" not in outcome.note and "re-listing" not in outcome.note


def test_a_package_whose_private_folders_exist_already_fails_naming_them(tmp_path: Path) -> None:
    spec = _spec(tmp_path, str(tmp_path / "never"))
    planted = Path(spec.scratch_dir) / "isolated" / "checks"
    (planted / "home").mkdir(parents=True)  # an earlier package's HOME for this one (.cache, a shell rc ...)
    outcome = run_package(spec, _env(), 120, isolation="scan")
    assert outcome.status == "failed" and outcome.extra["planted"] == [str(planted)]
    assert outcome.note == (f"its private folders existed before it started: {planted} (orch makes them anew for "
                            "every package; an earlier package may have planted them)")
    assert not (Path(spec.package_dir) / "seen.json").exists()  # it never ran
    scratch = tmp_path / "scratch"
    assert fresh_folders(str(scratch), "train-B", trainer=True) == []  # made anew: isolated/train-B, trainer/train-B
    assert (scratch / "isolated" / "train-B").is_dir() and (scratch / "trainer" / "train-B").is_dir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (scratch / "trainer" / "train-C").symlink_to(elsewhere)  # a link, never followed
    assert fresh_folders(str(scratch), "train-C", trainer=True) == [str(scratch / "trainer" / "train-C")]
    other = tmp_path / "other"
    (other / "isolated").mkdir(parents=True)
    (other / "trainer").symlink_to(elsewhere)  # a link above: whatever it points to is not orch's scratch
    assert fresh_folders(str(other), "train-B", trainer=True) == [str(other / "trainer")]
    assert fresh_folders(str(other), "checks", trainer=False) == []
    assert list(elsewhere.iterdir()) == []


def test_the_run_directory_and_scratch_are_the_only_writable_holes(tmp_path: Path) -> None:
    iso = isolate(str(tmp_path / "scratch"), "train-C", [str(tmp_path / "run"), str(tmp_path / "scratch")], "scan")
    assert iso.tmpdir == tmp_path / "scratch" / "isolated" / "train-C" / "tmp"
    assert "/tmp" in protected_dirs() and iso.protected == protected_dirs()
    ns = isolate(str(tmp_path), "x", [str(tmp_path)], "namespace")
    ns.start()
    cmd = ns.command(["python", "-V"], str(tmp_path))
    assert cmd[-3:] == ["--", "python", "-V"] and cmd[1:3] == ["-I", "-S"] and cmd[3].endswith("ns_init.py")
    holes = json.loads(cmd[4])["holes"]
    assert ns.ending == "pid-namespace" and holes == [str(tmp_path.resolve()), str(ns.root), str(ns.tmpdir)]
    assert ns.tmpdir.parent == Path("/tmp") and ns.tmpdir.is_dir() and ns.tmpdir.name.startswith("orch-")
    ns.spawned()
    ns.finish()
    assert not ns.tmpdir.exists()
    with pytest.raises(ValueError):
        isolate(str(tmp_path), "x", [], "none")


@pytest.mark.skipif(not namespaces_work(), reason="this kernel or user cannot make a mount namespace")
def test_a_package_may_write_its_own_compile_cache_folder_and_no_other(tmp_path: Path) -> None:
    root = f"/tmp/orch-compile-cache-{secrets.token_hex(6)}"  # a folder the protocol declares (orch rehearse)
    own, baseline = f"{root}/packages/checks", f"{root}/baseline-x"  # orchestrator/isolation/compile_cache.py's layout
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
