"""Issue 49, hole 1, at launch: an arm whose sealed tree ships one of orch's package names is refused before the
lock, naming the path (its unit tests: tests/unit/test_trust_boundary.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from launchutil import env, freeze, make_minimal_project, orch

MARK = "raise SystemExit('a planted workers package ran')\n"


@pytest.mark.slow
def test_a_candidate_shipping_workers_is_refused_before_the_lock(tmp_path: Path) -> None:
    proj = make_minimal_project(tmp_path)
    protocol = proj / "protocol" / "minimal.yaml"
    data = yaml.safe_load(protocol.read_text())
    data["arms"]["candidate"].update(commitment="manifests/cand.json", under_evaluation=True)
    protocol.write_text(yaml.safe_dump(data, sort_keys=False))
    freeze(proj, protocol, "manifests/cand.json", "candidate")
    (proj / "trainer" / "workers").mkdir()  # outside sources.include ("*.py"): not even in the commitment
    (proj / "trainer" / "workers" / "__init__.py").write_text(MARK)
    home = tmp_path / "home"
    done = subprocess.run(orch("launch", str(protocol), "--home", str(home), "--lock-dir", str(tmp_path / "locks"),
                               cwd=proj), cwd=proj, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "baseline sources hold workers/: the name of one of orch's own packages" in done.stderr
    assert not (tmp_path / "locks").exists() or not any((tmp_path / "locks").iterdir())
