"""orch's home: run ids that stay inside runs/, and the owner lock that tells a live run from a dead one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cliutil import orch
from test_audit import make_run

from protocol.errors import UsageError
from protocol.home import resolve_home

REPO = Path(__file__).resolve().parents[2]


def _orch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return orch(*args, cwd=cwd)  # in this process (tests/cliutil.py): same entry point, no new interpreter


@pytest.mark.parametrize("run_id", ["../outside/runs/run1", "/abs/run1", "run1/..", "..", ".", "a/b", ""])
def test_run_ids_are_one_folder_name_under_runs(tmp_path: Path, run_id: str) -> None:
    with pytest.raises(UsageError, match="is not a run id"):
        resolve_home(tmp_path).run_dir(run_id)


def test_audit_of_a_run_id_with_dotdot_segments_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    decoy = make_run(tmp_path / "outside")  # a complete run, but not under this home's runs/
    proc = _orch("audit", "../../outside/runs/run1", "--home", str(home), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1 and "is not a run id" in proc.stderr
    assert not (decoy / "audit.json").exists()
    proc = _orch("publish", "../../outside/runs/run1", "--to", "docs/validation/e.json", "--home", str(home),
                 cwd=REPO)
    assert proc.returncode == 2 and "is not a run id" in proc.stderr


def test_owner_lock_tells_a_live_run_from_a_killed_one(tmp_path: Path) -> None:
    home = resolve_home(tmp_path)
    assert home.run_is_live("r1") is None  # no owner lock: a run of an older orch, or one that ended
    holder = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from protocol.home import resolve_home
        with resolve_home(Path({str(tmp_path)!r})).hold_owner(sys.argv[1]):
            print("held", flush=True)
            time.sleep(float(sys.argv[2]))
    """)
    killed = subprocess.Popen([sys.executable, "-c", holder, "r1", "600"], stdout=subprocess.PIPE, text=True)
    try:
        assert killed.stdout is not None and killed.stdout.readline() == "held\n"
        assert home.run_is_live("r1") is True
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
    finally:
        if killed.poll() is None:
            killed.kill()
    assert home.run_is_live("r1") is False  # the kernel dropped the lock; the file stays behind
    ended = subprocess.run([sys.executable, "-c", holder, "r2", "0"], capture_output=True, text=True, check=True)
    assert ended.stdout == "held\n" and home.run_is_live("r2") is None  # an orderly end removes the lock file
