"""The one complete r3-mini launch that the end-to-end tests which only read its outputs share (session-scoped)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from launchutil import EDITED, CompleteRun, edit_protocol, end_started, make_project, small_protocol, start_until


@pytest.fixture(autouse=True)
def _no_launch_outlives_its_test() -> Iterator[None]:
    yield
    end_started()


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
