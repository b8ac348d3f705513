"""orch installed as a tool (issue 33): the wheel built from this tree, installed into a fresh virtual environment
(wheelutil: no network), runs `orch freeze`, `orch launch` and `orch audit` of a small short-form protocol from a git
project outside the repository."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from launchutil import GIT, MINIMAL, REPO, lay_out_minimal, one_rank
from wheelutil import installed_tool, user_env
from wheelutil import run as _run

from protocol.recipe import load_recipe, recipe_flags

pytestmark = pytest.mark.slow
@pytest.fixture(scope="module")
def tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bin/ of a fresh virtual environment holding orch from its wheel (and this environment's packages)."""
    return installed_tool(tmp_path_factory.mktemp("wheel"))


def _project(root: Path) -> Path:
    """A git project of its own: the minimal trainer (launchutil.lay_out_minimal: the test is about the installed
    tool, not r3-mini), its recipe file and its short-form protocol (no `recipe:`, no recipe flag) on one rank. The
    commitment is made here by the installed orch."""
    proj = root / "proj"
    lay_out_minimal(proj)
    data = yaml.safe_load((MINIMAL / "protocol.yaml").read_text())
    assert "recipe" not in data and data["launcher"]["args"] == []  # the short form
    one_rank(data)
    data["name"] = "wheel-install"
    (proj / "protocol").mkdir()
    (proj / "protocol" / "one.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (proj / "manifests").mkdir()
    _run(["git", "init", "-q"], cwd=proj)
    return proj


def test_the_wheel_gives_orch_and_gpu_run_that_freeze_launch_and_audit_outside_the_repository(
        tool: Path, tmp_path: Path) -> None:
    env = user_env()
    assert _run([str(tool / "orch"), "--version"], cwd=tmp_path, env=env).strip() == "orch 0.1.0"
    assert "gpu-run" in _run([str(tool / "gpu-run"), "--help"], cwd=tmp_path, env=env)
    where = _run([str(tool / "python"), "-c", "import orchestrator, workers.probe, protocol.recipe as r; "
                  "print(orchestrator.__file__); print(r.v1_recipe().sha256)"], cwd=tmp_path, env=env).split()
    assert where[0].startswith(str(tool.parent)) and not where[0].startswith(str(REPO))  # the wheel's, not this tree's
    assert where[1] == "27ea00d8ce839a2cf57981cca87348d24d80e5eda3849bcfee9e591df511961e"  # R3's recipe ships
    proj = _project(tmp_path)
    orch = str(tool / "orch")
    _run([orch, "freeze", "--protocol", "protocol/one.yaml", "-o", "manifests/minimal.json"], cwd=proj, env=env)
    _run([*GIT, "add", "-A"], cwd=proj)
    _run([*GIT, "commit", "-q", "-m", "trainer, recipe, protocol, commitment"], cwd=proj)
    home = tmp_path / "home"
    launched = subprocess.run(
        [orch, "launch", "protocol/one.yaml", "--home", str(home), "--json", "--lock-dir", str(tmp_path / "locks")],
        cwd=proj, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert launched.returncode == 0, launched.stderr[-3000:]
    summary = json.loads(launched.stdout)
    assert summary["status"] == "complete", summary
    run_id = summary["run_id"]
    shown = _run([orch, "audit", run_id, "--home", str(home), "--json"], cwd=proj, env=env)
    audit = json.loads(shown.strip().splitlines()[-1])["audit"]
    assert audit["exact"] is True, audit["reasons"]
    # the run record shows the command orch rendered: the script, then the recipe's flags, then launcher.args
    run = json.loads((home / "runs" / run_id / "run.json").read_text())
    command = run["arms"]["candidate"]["command"]
    assert audit["commands"] == {"baseline": run["arms"]["baseline"]["command"], "candidate": command}  # and the audit
    flags = recipe_flags(load_recipe(proj / "recipes" / "minimal.yaml", "recipes/minimal.yaml", None).recipe)
    assert command == ["train.py", *flags] and flags[:2] == ["--lr", "0.001"], command
