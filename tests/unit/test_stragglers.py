"""A process that leaves the package's session (as wandb's service does) is still ended after the package."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from orchestrator.isolation.stragglers import TOKEN_VAR, end_stragglers, find_stragglers, new_token

# the child forks a grandchild in a new session, then exits: the grandchild is reparented, out of any group
DAEMON = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    open(sys.argv[1], "w").write(str(os.getpid()))
    time.sleep(120)
    os._exit(0)
"""


def _start_daemon(tmp_path: Path, token: str | None) -> int:
    env = dict(os.environ)
    if token is not None:
        env[TOKEN_VAR] = token
    pid_file = tmp_path / f"daemon.{token}.pid"
    subprocess.run([sys.executable, "-c", DAEMON, str(pid_file)], env=env, check=True, start_new_session=True)
    deadline = time.monotonic() + 10
    while not (pid_file.is_file() and pid_file.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return int(pid_file.read_text())


def test_a_daemon_carrying_the_token_is_ended_and_nothing_else(tmp_path: Path) -> None:
    token, other = new_token(), new_token()
    ours = _start_daemon(tmp_path, token)
    theirs = _start_daemon(tmp_path, other)  # another package's (or anyone's): never touched
    try:
        assert psutil.Process(ours).ppid() != os.getpid()  # not our child: a process group kill misses it
        assert [p.pid for p in find_stragglers(token)] == [ours]
        names = end_stragglers(token, grace_s=2)
        assert names and all(n.startswith("python") for n in names)
        assert not psutil.pid_exists(ours) or psutil.Process(ours).status() == psutil.STATUS_ZOMBIE
        assert psutil.pid_exists(theirs)
        assert end_stragglers(token) == []
    finally:
        end_stragglers(other, grace_s=2)


def test_the_token_scan_mode_names_and_fails_what_the_package_left_in_its_group(tmp_path: Path) -> None:
    """The last fallback (no namespaces, no cgroup): a process left in the package's group is named and ends it."""
    from orchestrator.isolation.packages import package_env, run_package
    from protocol.package import ChecksSpec

    run_dir = tmp_path / "home" / "runs" / "r1"
    (run_dir / "packages" / "checks").mkdir(parents=True)
    (tmp_path / "home" / "scratch" / "r1").mkdir(parents=True)
    pkg = run_dir / "packages" / "checks"
    spec = ChecksSpec.model_validate({
        "run_id": "r1", "name": "checks", "kind": "checks", "package_dir": str(pkg), "sealed_dir": str(tmp_path),
        "scratch_dir": str(tmp_path / "home" / "scratch" / "r1"), "result_path": str(pkg / "result.json"),
        "device": "cpu", "precision": "fp32",
        "prepare": [{"name": "bg", "argv": ["sh", "-c", "sleep 60 </dev/null >/dev/null 2>&1 &"]}],
    })
    outcome = run_package(spec, package_env(os.environ, {}, {}, {}, "r1"), 120, isolation="scan+token-scan")
    assert outcome.extra["isolation"] == "scan+token-scan"
    assert outcome.status == "failed" and outcome.note is not None
    # scan mode sees every new entry of the shared /tmp, also a parallel test's (gcc's /tmp/cc*.s): the survivor's
    # line is in the note, wherever the scan's line put it
    assert ("left 1 process(es) running after its main process ended, ended by orch (token-scan): sleep (pid "
            in outcome.note)
