"""protocol.process.die_with_parent with real processes: the signal arrives when the parent dies, at once if gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]

# a parent that starts `sleep` with die_with_parent(SIGTERM) as preexec_fn, prints the child's pid, then waits
PARENT = """
import signal, subprocess, sys
from protocol.process import die_with_parent
child = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent(signal.SIGTERM))
print(child.pid, flush=True)
child.wait()
"""


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_child_gets_the_signal_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert psutil.Process(child).is_running()
    parent.kill()
    parent.wait()
    assert _gone(child), "the child outlived its SIGKILLed parent"


def test_a_process_whose_parent_is_already_gone_dies_at_once() -> None:
    # armed about itself with a parent pid that is not its parent: as if the parent had died before prctl
    code = (
        "import os, signal\nfrom protocol.process import die_with_parent\n"
        f"die_with_parent(signal.SIGTERM, parent={os.getpid() + 10**6})()\nprint('survived')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL and "survived" not in out.stdout


def test_a_process_armed_about_its_live_parent_keeps_running() -> None:
    code = "import os, signal\nfrom protocol.process import die_with_parent\n" \
           "die_with_parent(parent=os.getppid())()\nprint('alive')\n"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "alive"
