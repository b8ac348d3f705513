"""orch's home inside the sources (the default ./.orch of `sources.root: .`, issue 53): never hashed as a source, never
sealed into its own sealed copy, never listed by git; a copy that fails says so in one line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from manifests.core import hash_tree
from orchestrator.isolation.sealing import seal_arm
from protocol.errors import FailedError
from protocol.home import is_home, resolve_home


def _project_with_home(tmp_path: Path) -> tuple[Path, Path]:
    proj = tmp_path / "proj"
    (proj / "pkg").mkdir(parents=True)
    (proj / "train.py").write_text("print('train')\n")
    (proj / "pkg" / "model.py").write_text("W = 1\n")
    home = resolve_home(proj / ".orch")
    home.create()
    old = home.run_dir("r0") / "sealed" / "baseline"  # an earlier run's sealed copy: Python files under the root
    old.mkdir(parents=True)
    (old / "train.py").write_text("print('old')\n")
    return proj, home.root


def test_a_home_inside_the_root_is_no_source_and_is_not_sealed_into_itself(tmp_path: Path) -> None:
    proj, home = _project_with_home(tmp_path)
    assert is_home(home) and not is_home(proj) and not is_home(proj / "pkg")
    sources = hash_tree(proj, ["**/*.py"])
    assert [e.path for e in sources.entries] == ["pkg/model.py", "train.py"]
    dest = home / "runs" / "r1" / "sealed" / "baseline"  # where orch launch seals it: inside the copied root
    sealed = seal_arm("baseline", proj, ["**/*.py"], sources.root, dest)
    assert sorted(os.listdir(dest)) == ["pkg", "train.py"]
    assert [e.path for e in sealed.manifest.entries] == ["pkg/model.py", "train.py"]


def test_git_never_lists_a_home_in_the_project(tmp_path: Path) -> None:
    proj, home = _project_with_home(tmp_path)
    (home / "ledger" / "host.salt").write_bytes(b"salt")
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    listed = subprocess.run(["git", "-C", str(proj), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    assert sorted(line[3:] for line in listed.splitlines()) == ["pkg/model.py", "train.py"]


def test_a_copy_that_fails_is_one_line_naming_the_first_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("x = 1\n")
    for i in range(200):  # named pipes cannot be copied: 200 failures, each with its two long paths
        os.mkfifo(src / f"{'p' * 100}{i:03d}")
    with pytest.raises(FailedError) as caught:
        seal_arm("baseline", src, ["*.py"], "0" * 64, tmp_path / "sealed")
    message = caught.value.message
    assert "\n" not in message and len(message) < 600
    assert message.startswith("cannot seal baseline: 200 file(s) not copied from ")
    assert "named pipe" in message and "free disk space" not in message
