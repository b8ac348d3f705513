"""End-to-end tests of the `gpu-run` command: real processes, real flock(2) files, util-linux `flock`.

CPU slots stand in for GPUs (a fake NVML file with no devices); a fake NVML file presents busy GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from lockutil import gone, is_free

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
FLOCK = shutil.which("flock")
needs_flock = pytest.mark.skipif(FLOCK is None, reason="util-linux flock is not installed")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """gpu-run's environment: a private lock directory and no GPUs (so CPU slots are locked)."""
    fake = tmp_path / "no-gpu.json"
    fake.write_text(json.dumps({"devices": []}))
    out = dict(os.environ)
    out.update(
        GPU_RUN_FAKE_NVML=str(fake),
        GPU_RUN_LOCK_DIR=str(tmp_path / "locks"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    out.pop("GPU_RUN_SLOTS", None)
    return out


def _gpu_run(args: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli.gpu_run", *args], env=env, cwd=ROOT, text=True,
                            **kw)


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.gpu_run", *args],
        env=env,
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=30,
    )


def _until(cond: Callable[[], bool], bound_s: float = 15.0) -> bool:
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _read_pid(path: Path) -> Callable[[], bool]:
    return lambda: path.exists() and path.read_text().strip().isdigit()


def _waiting_line(stream: IO[str]) -> str:
    line = stream.readline()
    assert "waiting for" in line, line
    return line


@pytest.fixture
def flock_holder(env: dict[str, str]) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Start util-linux `flock LOCKFILE sleep 60` (a foreign holder) in its own group; kill it at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        lock = Path(env["GPU_RUN_LOCK_DIR"]) / name
        lock.parent.mkdir(parents=True, exist_ok=True)
        assert FLOCK is not None
        proc = subprocess.Popen([FLOCK, str(lock), "sleep", "60"], start_new_session=True)
        started.append(proc)
        assert _until(lambda: not is_free(lock))
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # we started this group
        proc.wait()


@needs_flock
def test_foreign_flock_holder_is_named_and_never_killed_on_timeout(
    env: dict[str, str], flock_holder: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    holder = flock_holder("slot0.lock")
    record = tmp_path / "rec.json"
    done = _run(["--slots", "1", "--timeout", "2", "--record", str(record), "--", "true"], env)
    assert done.returncode == 75, done.stderr
    assert f"slot0: lock held by pid {holder.pid} (user " in done.stderr
    assert "flock " in done.stderr and "not a gpu-run" in done.stderr and "running since" in done.stderr
    rec = json.loads(record.read_text())
    assert rec["exit_status"] == 75 and rec["devices"] == [] and rec["gpu_seconds"] == 0
    assert 2.0 <= rec["lock_wait_s"] < 3.0  # the acceptance bound: gave up within 3 s
    assert holder.poll() is None and not is_free(Path(env["GPU_RUN_LOCK_DIR"]) / "slot0.lock")


@needs_flock
def test_waits_for_flock_holder_then_runs(
    env: dict[str, str], flock_holder: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    holder = flock_holder("slot0.lock")
    record = tmp_path / "rec.json"
    proc = _gpu_run(["--slots", "1", "--record", str(record), "--", "true"], env, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    assert f"pid {holder.pid}" in _waiting_line(proc.stderr)
    os.killpg(holder.pid, signal.SIGKILL)  # the test's own holder lets go
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "waiting for" not in err  # one line per change: the holder never changed while waiting
    assert "got slot0 after" in err
    assert json.loads(record.read_text())["lock_wait_s"] > 0


def test_kill9_of_gpu_run_kills_its_child_and_frees_the_lock(env: dict[str, str], tmp_path: Path) -> None:
    child_pid, grandchild_pid = tmp_path / "child", tmp_path / "grandchild"
    script = f"sleep 60 & echo $! > {grandchild_pid}; echo $$ > {child_pid}; wait"
    proc = _gpu_run(["--slots", "1", "--", "sh", "-c", script], env)
    assert _until(_read_pid(child_pid)) and _until(_read_pid(grandchild_pid))
    lock = Path(env["GPU_RUN_LOCK_DIR"]) / "slot0.lock"
    assert not is_free(lock)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    child, grandchild = int(child_pid.read_text()), int(grandchild_pid.read_text())
    assert _until(lambda: gone(child) and gone(grandchild))  # a wait bound only (15 s): loaded hosts took > 2 s
    assert is_free(lock)


def test_two_concurrent_requests_for_two_of_three_slots(env: dict[str, str], tmp_path: Path) -> None:
    release = tmp_path / "release"
    wait_cmd = f"touch {tmp_path}/$GPU_RUN_SLOTS_GRANTED.$NAME; while [ ! -e {release} ]; do sleep 0.02; done"

    def start(name: str) -> subprocess.Popen[str]:
        args = ["--gpus", "2", "--slots", "3", "--record", str(tmp_path / f"{name}.json"), "--"]
        return _gpu_run([*args, "sh", "-c", wait_cmd], {**env, "NAME": name}, stderr=subprocess.PIPE)

    first = start("a")
    assert _until(lambda: (tmp_path / "0,1.a").exists())
    second = start("b")
    assert second.stderr is not None
    line = _waiting_line(second.stderr)
    assert f"slot0: lock held by pid {first.pid}" in line and f"slot1: lock held by pid {first.pid}" in line
    assert not list(tmp_path.glob("*.b"))  # the second one waits while the first one holds slots 0,1
    release.touch()
    assert first.wait(timeout=30) == 0 and second.wait(timeout=30) == 0
    assert (tmp_path / "0,1.b").exists()
    for name in ("a", "b"):
        rec = json.loads((tmp_path / f"{name}.json").read_text())
        assert rec["devices"] == [0, 1] and rec["kind"] == "cpu-slot" and rec["exit_status"] == 0
        assert rec["held_s"] > 0 and abs(rec["gpu_seconds"] - 2 * rec["held_s"]) < 1e-5
    assert json.loads((tmp_path / "b.json").read_text())["lock_wait_s"] > 0


CHILD_TERM = """
import signal, subprocess, sys, time
from pathlib import Path
d = Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: (d.joinpath("got-term").touch(), sys.exit(7)))
side = subprocess.Popen(["sleep", "60"])
d.joinpath("side").write_text(str(side.pid))
d.joinpath("ready").touch()
time.sleep(60)
"""


def test_sigterm_is_forwarded_to_the_group(env: dict[str, str], tmp_path: Path) -> None:
    proc = _gpu_run(["--slots", "1", "--", sys.executable, "-c", CHILD_TERM, str(tmp_path)], env)
    assert _until((tmp_path / "ready").exists)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7  # the child's own exit status
    assert (tmp_path / "got-term").exists()
    assert gone(int((tmp_path / "side").read_text()))  # the rest of the group got it too


def test_sigkill_after_grace_when_the_child_ignores_sigterm(env: dict[str, str], tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = f"trap '' TERM; touch {ready}; while :; do sleep 0.1; done"
    proc = _gpu_run(["--slots", "1", "--grace", "0.5", "--", "sh", "-c", script], env)
    assert _until(ready.exists)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL  # as a shell reports a signal death


def test_busy_gpu_per_fake_gpu_file_is_waited_for(env: dict[str, str], tmp_path: Path) -> None:
    fake = tmp_path / "gpus.json"
    sleeper = subprocess.Popen(["sleep", "60"])  # a sibling of gpu-run: outside its process tree
    try:

        def gpus(*procs: list[dict[str, Any]]) -> None:
            tmp = fake.with_suffix(".tmp")
            tmp.write_text(json.dumps({"devices": [{"processes": p} for p in procs]}))
            os.replace(tmp, fake)  # atomically, as gpu-run re-reads it at every attempt

        busy, light = {"pid": sleeper.pid, "used_mib": 2048}, {"pid": sleeper.pid, "used_mib": 100}
        gpus([busy], [light])
        genv = {**env, "GPU_RUN_FAKE_NVML": str(fake)}
        show = ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER $GPU_RUN_KIND"]
        done = _run(["--gpus", "1", "--", *show], genv)
        assert (done.returncode, done.stdout.strip()) == (0, "1 PCI_BUS_ID gpu")  # 100 MiB is under the bar
        done = _run(["--devices", "0", "--timeout", "0.5", "--", "true"], genv)
        assert done.returncode == 75
        assert f"gpu0: in use (NVML) by pid {sleeper.pid}" in done.stderr and "2048 MiB" in done.stderr
        proc = _gpu_run(["--devices", "0", "--", *show], genv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        assert f"pid {sleeper.pid}" in _waiting_line(proc.stderr)
        gpus([], [light])  # the foreign job ends
        out, _ = proc.communicate(timeout=30)
        assert (proc.returncode, out.strip()) == (0, "0 PCI_BUS_ID gpu")
        assert sleeper.poll() is None  # waited for, never signalled
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--slots", "2", "--", "sh", "-c", "exit 5"], 5),
        (["--slots", "2", "--", "sh", "-c", "kill -TERM $$"], 128 + 15),
        (["--slots", "2", "--", "./no-such-command-here"], 127),
        (["--slots", "2", "--gpus", "3", "--", "true"], 2),
        (["--slots", "2", "--devices", "0,7", "--", "true"], 2),
        (["--gpus", "1", "--devices", "0", "--", "true"], 2),
        (["--slots", "2"], 2),
        ([], 2),
        (["--"], 2),
        (["--gpus", "many", "--", "true"], 2),
    ],
)
def test_exit_statuses(env: dict[str, str], args: list[str], code: int) -> None:
    done = _run(args, env)
    assert done.returncode == code, done.stderr
    if code == 2:  # a usage error is one line: what is wrong, what to do
        assert done.stderr.startswith("gpu-run: ") and len(done.stderr.splitlines()) == 1, done.stderr


@needs_flock
def test_sigterm_while_waiting_ends_the_wait_only(
    env: dict[str, str], flock_holder: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    holder = flock_holder("slot0.lock")
    marker = tmp_path / "ran"
    proc = _gpu_run(["--slots", "1", "--", "touch", str(marker)], env, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    _waiting_line(proc.stderr)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM and "nothing ran" in err
    assert not marker.exists() and holder.poll() is None
