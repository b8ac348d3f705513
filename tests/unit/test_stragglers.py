"""A process that leaves the package's session (as wandb's service does) is still ended after the package."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from orchestrator.stragglers import TOKEN_VAR, end_stragglers, find_stragglers, new_token

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
