"""The one complete r3-mini launch that the end-to-end tests which only read its outputs share (session-scoped), the
per-test profile (ORCH_E2E_PROFILE), and the order in which `make test` (`-n auto --dist loadfile
--no-loadscope-reorder`, the unit tests in the same session) sends the test files to its workers: the end-to-end files
heaviest first by the seconds recorded in durations.json, so that no long file starts last and runs alone, then the
unit files, heaviest first."""

from __future__ import annotations

import json
import os
import resource
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from launchutil import EDITED, CompleteRun, edit_protocol, end_started, make_project, small_protocol, start_until

# seconds on the 2-core machine: an end-to-end test id -> its call and set-up; a unit test file's path -> its tests'
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Orders the test files for `--dist loadfile --no-loadscope-reorder` (a file's tests on one worker, so that a
    fixture made once per session or module is made once), by the seconds recorded in durations.json
    (scripts/e2e_durations.py re-records them): the end-to-end files first, heaviest first, a file's weight the sum of
    its tests' seconds, a test not recorded (one that skips, or a new one) counting as the median recorded end-to-end
    test; then, where `make test` runs them in the same session (scripts/test_suite.sh), the unit test files, heaviest
    first by their file's recorded seconds (0 if not recorded), which fill the cores that the last launches leave idle
    and end with the lightest. Within a file the collection order stays.

    (Groups finer than files, xdist's `--dist loadgroup`, are not used: with pytest 9 the xdist_group marks do not
    reach the scheduler, pytest-xdist 3.8 writing the test id where pytest no longer reads it.)"""
    recorded = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    per_test = [seconds for nodeid, seconds in recorded.items() if "::" in nodeid]
    unknown = statistics.median(per_test) if per_test else 0.0
    here = Path(__file__).parent
    weight: dict[str, float] = {}
    first: dict[str, int] = {}
    e2e: set[str] = set()
    for index, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        if item.path.is_relative_to(here):
            e2e.add(path)
            weight[path] = weight.get(path, 0.0) + float(recorded.get(item.nodeid, unknown))
        else:
            weight[path] = float(recorded.get(path, 0.0))
        first.setdefault(path, index)
    order = {item.nodeid: index for index, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[bool, float, int, int]:
        path = item.nodeid.split("::", 1)[0]
        return path not in e2e, -weight[path], first[path], order[item.nodeid]

    items.sort(key=key)


@pytest.fixture(autouse=True)
def _no_launch_outlives_its_test() -> Iterator[None]:
    yield
    end_started()


@pytest.fixture(autouse=True)
def _profile(request: pytest.FixtureRequest) -> Iterator[None]:
    """With ORCH_E2E_PROFILE=FILE, one JSON line per test: its seconds, and the orch launches it made (run.json
    files under its folders) with the packages that ran (docs/validation/e2e_durations.md is made from it)."""
    out = os.environ.get("ORCH_E2E_PROFILE")
    t0, c0 = time.monotonic(), _cpu_s()
    yield
    if not out:
        return
    folder = request.node.funcargs.get("tmp_path")  # a test that launches does so under its own tmp_path
    launches, packages = 0, 0
    for run in (folder.rglob("runs/*/run.json") if isinstance(folder, Path) else []):
        launches += 1
        packages += len(json.loads(run.read_text()).get("packages", []))
    with open(out, "a") as fh:
        fh.write(json.dumps({"test": request.node.nodeid, "seconds": round(time.monotonic() - t0, 1),
                             "cpu_s": round(_cpu_s() - c0, 1), "launches": launches, "packages": packages}) + "\n")


def _cpu_s() -> float:
    """User + system seconds of this pytest process and of every descendant it (or they) waited for: a launch's
    orch, workers, torchrun and ranks."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.fixture(scope="session")
def complete_run(tmp_path_factory: pytest.TempPathFactory) -> CompleteRun:
    """The shipped protocol with shorter rollouts, launched once to completion (A -> C -> B, reloads, watch-C,
    score, audit); the working tree is edited while train-C runs (the sealed copy must not see it).

    Tests only read it: `orch audit` of a recorded run writes nothing."""
    root = tmp_path_factory.mktemp("complete")
    proj = make_project(root)
    protocol = edit_protocol(proj, small_protocol, name="small.yaml")
    home = root / "home"
    proc, run_dir = start_until(proj, home, "train-C", protocol)
    try:
        edited = proj / EDITED
        edited.write_text(edited.read_text() + "\nEDITED_DURING_RUN = True\n")
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return CompleteRun(proj=proj, home=home, run_dir=run_dir, returncode=proc.returncode, out=out, err=err)
