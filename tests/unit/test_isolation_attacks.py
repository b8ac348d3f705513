"""Issue 27's attacks on real packages (a checks package whose prepare command plays the candidate): a `.pth` in
the interpreter's own site-packages, a double-forked process in a new session with a cleared environment, and a
poisoned compile cache; in the namespace (as root and, through ns_init directly, as an unprivileged user) and in
scan mode."""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.isolation.compile_cache import RunCaches
from orchestrator.isolation.package_isolation import NS_INIT, cgroups_work, namespaces_work, ns_command, read_report
from orchestrator.isolation.packages import package_env, run_package
from protocol.package import ChecksSpec

needs_ns = pytest.mark.skipif(not namespaces_work(), reason="this kernel or user cannot make the namespaces")

# writes a one-line .pth (a comment: harmless if it ever stays) into site-packages; as root it first tries to make
# the root writable again
PTH = """
import json, subprocess, sys
out = {"remount": subprocess.run(["mount", "-o", "remount,rw", "/"], capture_output=True).returncode}
try:
    open(sys.argv[1], "w").write("# orch attack test\\n")
    out["pth"] = "written"
except OSError as exc:
    out["pth"] = f"{type(exc).__name__}: {exc.strerror}"
open(sys.argv[2], "w").write(json.dumps(out))
"""
# a helper (subprocess.run) starts the real process in a new session with only PATH, then exits; the process
# outlives the package's main process unless something ends it
DOUBLE_FORK = """
import os, subprocess, sys
helper = ("import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True, env={'PATH': '/usr/bin'}, "
          "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)")
subprocess.run([sys.executable, "-c", helper, sys.executable, "-c", "import time; time.sleep(120)", sys.argv[1]])
open(sys.argv[2], "w").write("{}")
"""
# the candidate writes a kernel into every compile cache folder it can reach; the baseline lists what it finds
POISON = """
import json, os, sys
out = {}
cache = os.environ["TRITON_CACHE_DIR"]
for target in [cache, os.path.dirname(cache), *[os.path.join(os.path.dirname(cache), d) for d in sys.argv[3:]]]:
    try:
        os.makedirs(target, exist_ok=True)
        open(os.path.join(target, "poisoned_kernel.so"), "w").write("slow")
        out[target] = "written"
    except OSError as exc:
        out[target] = exc.strerror
open(sys.argv[2], "w").write(json.dumps(out))
"""
# a SysV shared memory segment outlives its creator: 1 GiB of it left behind would press on baseline B's memory
SHM = """
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
shmid = libc.shmget(int(sys.argv[1]), 4096, 0o1000 | 0o600)
open(sys.argv[2], "w").write(json.dumps({"shmid": shmid}))
"""
LIST_CACHE = """
import json, os, sys
cache = os.environ["TRITON_CACHE_DIR"]
open(sys.argv[2], "w").write(json.dumps(sorted(os.listdir(cache)) if os.path.isdir(cache) else []))
"""


def _spec(base: Path, code: str, *args: str, arm: str | None = None) -> ChecksSpec:
    run_dir = base / "home" / "runs" / "r1"
    pkg_dir = run_dir / "packages" / "checks"
    pkg_dir.mkdir(parents=True)
    scratch = base / "home" / "scratch" / "r1"
    scratch.mkdir(parents=True)
    return ChecksSpec.model_validate({
        "run_id": "r1", "name": "checks", "kind": "checks", "arm": arm, "package_dir": str(pkg_dir),
        "sealed_dir": str(base), "scratch_dir": str(scratch), "result_path": str(pkg_dir / "result.json"),
        "device": "cpu", "precision": "fp32",
        "prepare": [{"name": "attack", "argv": [sys.executable, "-c", code, args[0], str(pkg_dir / "seen.json"),
                                                *args[1:]]}],
    })


def _seen(spec: ChecksSpec) -> object:
    return json.loads((Path(spec.package_dir) / "seen.json").read_text())


def _env(**more: str) -> dict[str, str]:
    return {**package_env(os.environ, {}, {}, {}, "r1"), **more}


def _pth() -> Path:
    return Path(site.getsitepackages()[0]) / f"orch-attack-{secrets.token_hex(6)}.pth"


def _alive_with(tag: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if tag in (p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p.info["pid"])
    return out


@needs_ns
def test_a_pth_into_the_interpreters_site_packages_is_refused_even_as_root(tmp_path: Path) -> None:
    target = _pth()
    spec = _spec(tmp_path, PTH, str(target))
    try:
        outcome = run_package(spec, _env(), 120)
        assert outcome.status == "ok", outcome.note
        seen = _seen(spec)
        assert isinstance(seen, dict) and seen["remount"] != 0  # root in the package cannot make / writable again
        assert seen["pth"] == "OSError: Read-only file system" and not target.exists()
    finally:
        target.unlink(missing_ok=True)


def test_scan_mode_fails_the_package_that_added_a_pth_naming_it(tmp_path: Path) -> None:
    target = _pth()
    spec = _spec(tmp_path, PTH, str(target))
    try:
        outcome = run_package(spec, _env(), 120, isolation="scan")
        assert outcome.extra["isolation"].startswith("scan+") and _seen(spec)["pth"] == "written"  # type: ignore[index]
        assert outcome.status == "failed" and outcome.note is not None
        assert f"changed the interpreter's startup surface: {target} (added)" in outcome.note
        assert outcome.extra["surface_changed"] == [f"{target} (added)"]
    finally:
        target.unlink(missing_ok=True)


@pytest.mark.parametrize("mode", ["namespace", "cgroup"])
def test_a_double_forked_process_with_a_cleared_environment_is_ended_and_named(tmp_path: Path, mode: str) -> None:
    if mode == "namespace" and not namespaces_work():
        pytest.skip("this kernel or user cannot make the namespaces")
    if mode == "cgroup" and not cgroups_work():
        pytest.skip("no cgroup v2 with cgroup.kill writable here")
    tag = f"orch-survivor-{secrets.token_hex(6)}"
    spec = _spec(tmp_path, DOUBLE_FORK, tag)
    try:
        outcome = (run_package(spec, _env(), 120) if mode == "namespace"
                   else run_package(spec, _env(), 120, isolation="scan"))
        assert outcome.extra["ending"] == ("pid-namespace" if mode == "namespace" else "cgroup")
        assert outcome.status == "failed" and outcome.note is not None
        # (in scan mode a parallel test's new /tmp entry may be named first: the survivor's line is in the note)
        assert "left 1 process(es) running after its main process ended, ended by orch" in outcome.note
        assert "(pid " in outcome.note and "python" in outcome.note
        assert _alive_with(tag) == []  # checked here, not only reported
    finally:
        for pid in _alive_with(tag):
            psutil.Process(pid).kill()


@needs_ns
def test_a_candidate_cannot_poison_the_baselines_compile_cache(tmp_path: Path) -> None:
    caches = RunCaches.for_run({}, tmp_path / "scratch", tmp_path, "b" * 64, "r1")  # orch's own, in scratch
    prime = caches.prepare("prime", "prime")
    (prime / "inductor" / "k.best_config").write_text('{"XBLOCK": 64}')  # what the prime tuned
    caches.seal_baseline()
    own = caches.prepare("train-C", "train")
    env = _env(**caches.env(own))
    candidate = _spec(tmp_path / "c", POISON, "x", "../../baseline-" + "b" * 16 + "-r1/triton", arm="candidate")
    outcome = run_package(candidate, env, 120, cache=str(own))
    assert outcome.status == "ok", outcome.note
    tried = {os.path.relpath(k, caches.root): v for k, v in _seen(candidate).items()}  # type: ignore[union-attr]
    assert tried == {"packages/train-C/triton": "written", "packages/train-C": "written",
                     f"baseline-{'b' * 16}-r1/triton": "Read-only file system"}
    caches.check_baseline("train-C")  # raises if anything of the baseline's changed
    use = caches.use("train-C", "train")
    assert use is not None and (use.taken, use.taken_tuned, use.made, use.changed) == (1, 1, 2, 0)
    baseline = _spec(tmp_path / "b", LIST_CACHE, "x", arm="baseline")
    b_own = caches.prepare("train-B", "train")
    assert run_package(baseline, _env(**caches.env(b_own)), 120, cache=str(b_own)).status == "ok"
    assert _seen(baseline) == []  # B's copy holds nothing of the candidate's
    assert sorted(p.name for p in caches.baseline.rglob("*") if p.is_file()) == ["k.best_config"]


@needs_ns
def test_a_sysv_shared_memory_segment_ends_with_its_package(tmp_path: Path) -> None:
    key = secrets.randbelow(2**30) + 1
    spec = _spec(tmp_path, SHM, str(key))
    outcome = run_package(spec, _env(), 120)
    assert outcome.status == "ok", outcome.note
    assert _seen(spec)["shmid"] >= 0  # type: ignore[index]
    libc = ctypes.CDLL(None, use_errno=True)
    left = libc.shmget(key, 0, 0)
    if left >= 0:  # the host's IPC namespace holds it: remove it, then fail
        libc.shmctl(left, 0, None)  # IPC_RMID
    assert left == -1


@pytest.mark.skipif(not namespaces_work() or shutil.which("setpriv") is None, reason="no namespaces or no setpriv")
def test_as_an_unprivileged_user_the_root_is_read_only_and_survivors_are_named() -> None:
    """ns_init itself as user nobody: a write into site-packages fails, a process left in a new session is named."""
    base = Path(tempfile.mkdtemp(prefix="orch-nobody-"))  # pytest's tmp_path is private to root
    os.chmod(base, 0o755)
    for sub in ("dev", "hole"):
        (base / sub).mkdir()
        shutil.chown(base / sub, 65534, 65534)
    target = _pth()
    script = (f"echo x > {base}/hole/ok; echo y > {target} || echo refused > {base}/hole/pth; "
              "setsid sleep 60 & sleep 0.2")
    read_fd, write_fd = os.pipe()
    argv = ns_command([str(base / "hole")], str(base / "dev"), write_fd, str(base), ["sh", "-c", script])
    try:
        proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *argv],
                              capture_output=True, timeout=60, pass_fds=(write_fd,), check=False)
        os.close(write_fd)
        report = read_report(read_fd)
        if proc.returncode == 125 and b"unshare" in proc.stderr:
            pytest.skip(f"unprivileged user namespaces are not allowed here: {proc.stderr.decode().strip()}")
        assert proc.returncode == 0, proc.stderr
        assert (base / "hole" / "ok").is_file() and (base / "hole" / "pth").read_text() == "refused\n"
        assert not target.exists()
        assert report is not None and [s["name"] for s in report["survivors"]] == ["sleep"]
    finally:
        target.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)
    assert NS_INIT.is_file()
    deadline = time.monotonic() + 5
    while any(p.info["name"] == "sleep" and p.info["username"] == "nobody"
              for p in psutil.process_iter(["name", "username"])):
        assert time.monotonic() < deadline
        time.sleep(0.05)
