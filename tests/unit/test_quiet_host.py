"""The quiet-host report: a real foreign busy process is named (by name only), load and steal are read, no path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ledger.verdict.host_report import quiet_host_doc
from protocol.quiet_host import QuietHost
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
