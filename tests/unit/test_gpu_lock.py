"""Tests of orchestrator.lock.gpu_lock in-process: real flock(2) files, real processes, a fake NVML file.

Lowest-free all-or-none grants (hypothesis against a model), holder naming, NVML busy rules, process groups.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lockutil import gone, is_free

from orchestrator.isolation import process_group as pg
from orchestrator.lock import gpu_devices as gd
from orchestrator.lock import gpu_lock as gl
from protocol.errors import EXIT_LOCK_TIMEOUT, LockTimeoutError, UsageError

pytestmark = pytest.mark.timeout(60)


def _no_gpu(tmp: Path) -> gd.FakeProbe:
    path = tmp / "no-gpu.json"
    path.write_text(json.dumps({"devices": []}))
    return gd.FakeProbe(path)


def _gpus(tmp: Path, devices: list[list[dict[str, object]]]) -> gd.FakeProbe:
    path = tmp / "gpus.json"
    path.write_text(json.dumps({"devices": [{"processes": p} for p in devices]}))
    return gd.FakeProbe(path)


@pytest.fixture
def foreign_pid() -> Iterator[int]:
    """A process outside this process's tree: a `sleep` whose parent shell has exited (so it was reparented)."""
    out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
    pid = int(out.stdout)
    assert pid not in {p.pid for p in psutil.Process().children(recursive=True)}
    yield pid
    os.kill(pid, 9)  # we started it


def test_lowest_free_slots_holder_info_and_release(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    blocker = os.open(locks / "slot1.lock", os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(blocker, fcntl.LOCK_EX)  # a second open file description conflicts even in this process
    try:
        with gl.acquire(gpus=2, slots=3, lock_dir=locks, probe=_no_gpu(tmp_path), command="train x") as grant:
            assert grant.devices == [0, 2]
            assert grant.kind == "cpu-slot"
            assert grant.cuda_visible_devices == ""
            env = grant.env({"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
            assert env["CUDA_VISIBLE_DEVICES"] == ""
            assert env["GPU_RUN_SLOTS_GRANTED"] == "0,2"
            info = json.loads((locks / "slot0.lock").read_text())
            assert info["pid"] == os.getpid() and info["cmd"] == "train x" and info["devices"] == [0, 2]
            assert not is_free(locks / "slot0.lock") and not is_free(locks / "slot2.lock")
        assert grant.released
        assert (locks / "slot0.lock").read_text() == ""  # holder info cleared before the unlock
        assert is_free(locks / "slot0.lock") and is_free(locks / "slot2.lock")
        held = grant.held_s()
        assert grant.held_s() == held  # frozen at release
    finally:
        os.close(blocker)


def test_all_or_none_timeout_names_holder_and_keeps_nothing(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    probe = _no_gpu(tmp_path)
    with gl.acquire(devices=[2], slots=3, lock_dir=locks, probe=probe, command="holder cmd"):
        seen: list[str] = []
        with pytest.raises(LockTimeoutError) as info:
            gl.acquire(gpus=3, slots=3, lock_dir=locks, probe=probe, timeout=0.3, status=seen.append)
        err = info.value
        assert err.exit_code == EXIT_LOCK_TIMEOUT
        assert isinstance(err, gl.GpuLockTimeout)
        assert [(h.label, h.pid, h.command) for h in err.holders] == [("slot2", os.getpid(), "holder cmd")]
        assert f"slot2: lock held by pid {os.getpid()}" in err.message
        assert len(seen) == 1  # one status line: the holders did not change while waiting
        assert is_free(locks / "slot0.lock") and is_free(locks / "slot1.lock")  # the partial take was undone


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.one_of(st.integers(1, 4), st.just(0)), min_size=1, max_size=12))
def test_grants_are_the_lowest_free_or_nothing(tmp_path: Path, ops: list[int]) -> None:
    """Model check: a request for k of 4 slots gets the k lowest free ones iff k are free; 0 releases."""
    locks = tmp_path / f"locks{time.monotonic_ns()}"
    probe = _no_gpu(tmp_path)
    grants: list[gl.Grant] = []
    try:
        for k in ops:
            held = {d for g in grants for d in g.devices}
            free = [i for i in range(4) if i not in held]
            if k == 0:
                if grants:
                    grants.pop(0).release()
                continue
            if len(free) >= k:
                grant = gl.acquire(gpus=k, slots=4, lock_dir=locks, probe=probe, timeout=0)
                assert grant.devices == free[:k]
                grants.append(grant)
            else:
                with pytest.raises(LockTimeoutError):
                    gl.acquire(gpus=k, slots=4, lock_dir=locks, probe=probe, timeout=0)
                assert {i for i in range(4) if not is_free(locks / f"slot{i}.lock")} == held
    finally:
        for g in grants:
            g.release()


def test_gpu_library_busy_rules(tmp_path: Path, foreign_pid: int) -> None:
    foreign = foreign_pid
    probe = _gpus(
        tmp_path,
        [
            [{"pid": foreign, "used_mib": 2048}],  # busy
            [{"pid": foreign, "used_mib": None}],  # NVML cannot tell: busy
            [{"pid": foreign, "used_mib": 100}],  # below the threshold (a display server): free
            [{"pid": os.getpid(), "used_mib": 4096}],  # our own process tree: free
        ],
    )
    locks = tmp_path / "locks"
    with gl.acquire(gpus=2, lock_dir=locks, probe=probe) as grant:
        assert (grant.kind, grant.devices, grant.cuda_visible_devices) == ("gpu", [2, 3], "2,3")
        env = grant.env({})
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "GPU_RUN_SLOTS_GRANTED" not in env
        assert (locks / "gpu2.lock").exists() and not (locks / "slot2.lock").exists()
    with pytest.raises(LockTimeoutError) as info:
        gl.acquire(devices=[0, 1], lock_dir=locks, probe=probe, timeout=0)
    holder = info.value.holders[0]  # type: ignore[attr-defined]
    assert (holder.label, holder.reason, holder.pid, holder.used_mib) == ("gpu0", "device", foreign, 2048)
    assert "gpu0: in use (NVML) by pid" in info.value.message and "2048 MiB" in info.value.message
    with pytest.raises(LockTimeoutError, match="memory unknown"):
        gl.acquire(devices=[1], lock_dir=locks, probe=probe, timeout=0)
    with gl.acquire(devices=[0], lock_dir=locks, probe=probe, min_foreign_mib=4096) as grant:
        assert grant.devices == [0]  # a higher threshold ignores the 2 GiB process


def test_usage_errors_and_settings(tmp_path: Path) -> None:
    probe = _no_gpu(tmp_path)
    locks = tmp_path / "locks"
    with pytest.raises(UsageError, match="asked for 4 CPU slots but this host has 3"):
        gl.acquire(gpus=4, slots=3, lock_dir=locks, probe=probe)
    with pytest.raises(UsageError):
        gl.acquire(devices=[3], slots=3, lock_dir=locks, probe=probe)
    with pytest.raises(UsageError):
        gl.acquire(devices=[1, 1], slots=3, lock_dir=locks, probe=probe)
    with pytest.raises(UsageError):
        gl.acquire(gpus=1, devices=[0], slots=3, lock_dir=locks, probe=probe)
    assert gl.default_lock_dir({"GPU_RUN_LOCK_DIR": str(tmp_path)}) == tmp_path
    assert gl.default_lock_dir({}) in (Path("/var/lock/gpu-run"), Path("/tmp/gpu-run"))
    assert gl.resolve_slots(env={"GPU_RUN_SLOTS": "5"}) == 5
    assert gl.resolve_slots(env={}) == (os.cpu_count() or 1)
    with pytest.raises(UsageError):
        gl.resolve_slots(env={"GPU_RUN_SLOTS": "many"})
    assert isinstance(gd.probe_from_env({"GPU_RUN_FAKE_NVML": str(tmp_path / "x.json")}), gd.FakeProbe)
    assert isinstance(gd.probe_from_env({}), gd.DriverProbe)


def test_lock_dir_and_files_are_usable_by_every_user(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        locks = tmp_path / "new" / "gpu-run"
        with gl.acquire(gpus=1, slots=1, lock_dir=locks, probe=_no_gpu(tmp_path)):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(locks.stat().st_mode) == 0o1777
    assert stat.S_IMODE((locks / "slot0.lock").stat().st_mode) == 0o666


def test_terminate_group_reaches_grandchildren(tmp_path: Path) -> None:
    pidfile = tmp_path / "gc"
    proc = pg.spawn_in_group(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"])
    while not pidfile.exists() or not pidfile.read_text().strip():
        time.sleep(0.02)
    grandchild = int(pidfile.read_text())
    assert os.getpgid(grandchild) == proc.pid != os.getpgid(0)
    assert pg.terminate_group(proc, grace_s=5) == -15
    assert gone(grandchild)


def test_terminate_group_kills_after_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = pg.spawn_in_group(["sh", "-c", f"trap '' TERM; touch {ready}; while :; do sleep 0.1; done"])
    while not ready.exists():
        time.sleep(0.02)
    assert pg.terminate_group(proc, grace_s=0.3) == -9
    assert pg.exit_status(-9) == 137 and pg.exit_status(3) == 3


def test_wait_group_removes_leftovers(tmp_path: Path) -> None:
    pidfile = tmp_path / "left"
    proc = pg.spawn_in_group(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; exit 4"])
    assert pg.wait_group(proc) == 4
    assert gone(int(pidfile.read_text()))
    assert pg.signal_group(proc, 15) is False  # reaped: its pid may be reused, so never signalled again


def test_group_members_names_the_live_members_not_the_exited_leader(tmp_path: Path) -> None:
    pidfile = tmp_path / "left"
    proc = pg.spawn_in_group(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; exit 0"])
    assert pg._leader_exited(proc, block=True)  # exited, unreaped: the group id is still ours
    left = int(pidfile.read_text())
    assert [pid for pid, _ in pg.group_members(proc.pid)] == [left]  # its name: sh until it has exec'd sleep
    assert pg.wait_group(proc) == 0
    assert pg.group_members(proc.pid) == []  # wait_group returned only after the kill had taken effect


def test_watchdog_stands_down_for_a_leader_reaped_elsewhere() -> None:
    proc = pg.spawn_in_group(["true"])
    proc.wait()  # reaped without wait_group: the watchdog must not outlive this knowledge
    guard = pg._WATCHDOGS[proc.pid][2]
    assert pg.wait_group(pg.spawn_in_group(["true"])) == 0  # the next spawn sweeps
    assert proc.pid not in pg._WATCHDOGS
    assert guard.wait(timeout=5) == 0  # it read the stand-down byte and exited without signalling
