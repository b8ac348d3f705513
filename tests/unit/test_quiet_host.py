"""The quiet-host report: a real foreign busy process is named (by name only), load and steal are read, no path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from ledger.verdict.documents.host_report import quiet_host_doc
from protocol.host.quiet_host import ForeignGpuProcess, GpuState, QuietHost
from protocol.results import TrainResult
from workers.quiet_host import HostWatch


def _named_python(tmp_path: Path, name: str) -> str:
    """This Python under a name of its own (the process name is the link's): busy processes of other jobs on a
    shared host are never mistaken for the test's."""
    link = tmp_path / name
    link.symlink_to(sys.executable)
    return str(link)


def test_a_foreign_busy_process_is_named_and_nothing_else_leaks(tmp_path: Path) -> None:
    # an orphan (its shell exits at once), so it is not in this process's tree: foreign, as another user's job
    exe = _named_python(tmp_path, "orchforeignjob")
    out = subprocess.run(
        ["sh", "-c", f"{exe} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )
    pid = int(out.stdout.strip())
    try:
        time.sleep(0.2)
        watch = HostWatch()
        watch.start()
        time.sleep(1.5)
        report = watch.finish()
    finally:
        os.kill(pid, signal.SIGKILL)
    assert len(report.load_start) == len(report.load_end) == 3 and report.cpus >= 1
    assert report.steal is None or 0.0 <= report.steal <= 1.0
    busy = [p for p in report.busy_foreign if p.name == "orchforeignjob"]
    assert busy and busy[0].cpu_s > 0.2 and 0.0 < busy[0].core_share <= 1.5, report.busy_foreign
    dumped = report.model_dump_json(by_alias=True)
    assert sys.executable not in dumped and str(tmp_path) not in dumped and '"schema":' in dumped
    assert all("/" not in p.name and p.name != os.uname().nodename for p in report.busy_foreign)
    assert report.gpu_query == "ok" or report.gpu_query.startswith(("no NVML", "NVML error"))
    again = QuietHost.model_validate_json(dumped)
    assert again == report
    assert json.loads(dumped)["busy_foreign"][0]["name"] == report.busy_foreign[0].name


def test_own_children_are_not_foreign(tmp_path: Path) -> None:
    watch = HostWatch()
    exe = _named_python(tmp_path, "orchownchild")
    child = subprocess.Popen([exe, "-c", "while True: pass"])  # busy and alive when the watch finishes
    try:
        watch.start()
        time.sleep(1.5)
        report = watch.finish()
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
    assert all(p.name != "orchownchild" for p in report.busy_foreign), report.busy_foreign
    assert quiet_host_doc({}, [])["launches"] == {}


def test_kernel_thread_and_host_names_are_made_public() -> None:
    # the CI host had a busy kernel thread ("kworker/u4:2"): its name is kept, the part after "/" is not
    from workers.quiet_host import _public_name

    assert _public_name("kworker/u4:2-events") == "kworker"
    assert _public_name("ksoftirqd/0") == "ksoftirqd"
    assert _public_name(None) == "?" and _public_name("/x") == "?"
    assert _public_name(os.uname().nodename) == "<host>"
    assert _public_name("python3.11") == "python3.11"


def _snapshot(own_pid_namespace: bool | None, foreign: tuple[str, ...] = ()) -> QuietHost:
    gpu = GpuState(index=0, sm_mhz=1980, foreign=[ForeignGpuProcess(name=n, used_mib=512.0) for n in foreign])
    return QuietHost(wall_s=1.0, cpus=16, load_start=[1.0, 1.0, 1.0], load_end=[1.2, 1.0, 1.0], steal=0.0,
                     busy_foreign=[], gpus_start=[gpu], gpus_end=[gpu], gpu_query="ok",
                     own_pid_namespace=own_pid_namespace)


def _words(*snapshots: QuietHost) -> dict[str, Any]:
    labels = "ACB"[: len(snapshots)]
    trains = {lb: cast(TrainResult, SimpleNamespace(quiet_host=q)) for lb, q in zip(labels, snapshots, strict=True)}
    return quiet_host_doc(trains, list(trains))


def test_a_snapshot_from_inside_the_packages_pid_namespace_never_says_none_for_what_it_cannot_see() -> None:
    # the 2026-12-04 rehearsal: a foreign GPU process ran through train-A, orch's host watch saw it in 574 of 785
    # samples, and the in-package snapshot said "foreign GPU processes: none": inside the namespace it cannot see it
    inside = _words(_snapshot(True), _snapshot(True), _snapshot(True))
    assert "foreign GPU processes: not visible from inside the package's PID namespace" in inside["words"]
    assert "foreign processes: not visible from inside" in inside["words"]
    assert "no busy foreign process" not in inside["words"] and "foreign GPU processes: none" not in inside["words"]
    assert inside["launches"]["A"]["own_pid_namespace"] is True
    # outside a namespace (scan mode) a snapshot sees the host: "none" means none
    outside = _words(_snapshot(False), _snapshot(False), _snapshot(False))
    assert "no busy foreign process" in outside["words"] and "foreign GPU processes: none" in outside["words"]
    # what a snapshot does see is named either way
    named = _words(_snapshot(True, ("python3",)), _snapshot(True), _snapshot(True))
    assert "foreign GPU processes: python3" in named["words"]


def test_records_made_before_the_namespace_was_recorded_read_as_they_did() -> None:
    old = _words(_snapshot(None), _snapshot(None), _snapshot(None))
    assert "foreign GPU processes: none" in old["words"] and "no busy foreign process" in old["words"]
    assert "own_pid_namespace" not in old["launches"]["A"]  # the recorded audit of an old run recomputes equal
    assert QuietHost.model_validate_json(_snapshot(None).model_dump_json(by_alias=True)).own_pid_namespace is None


def test_the_snapshot_records_whether_it_ran_inside_the_packages_pid_namespace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.isolation.ns_init import PID_NAMESPACE_ENV as SET
    from workers.quiet_host import PID_NAMESPACE_ENV as READ

    assert SET == READ  # ns_init runs isolated (python -I -S) and cannot import it: the same literal in both
    monkeypatch.delenv(READ, raising=False)
    watch = HostWatch()
    watch.start()
    assert watch.finish().own_pid_namespace is False
    monkeypatch.setenv(READ, "1")
    watch.start()
    assert watch.finish().own_pid_namespace is True
