"""manifests/sources.py: an arm's sources are the working tree, or its revision exported with `git archive`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from manifests.sources import arm_source_dir, export_git_tree, git_toplevel
from protocol.errors import RefusedError
from protocol.schema import GitSource, LoadedProtocol, load_protocol

REPO = Path(__file__).resolve().parents[2]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose sources/ folder has a first and a second commit."""
    repo = tmp_path / "repo"
    (repo / "sources" / "train").mkdir(parents=True)
    _git(repo.parent, "init", "-q", str(repo))
    for k, v in {"user.email": "t@example.com", "user.name": "t", "commit.gpgsign": "false"}.items():
        _git(repo, "config", k, v)
    (repo / "sources" / "train" / "loop.py").write_text("first\n")
    (repo / "other.txt").write_text("outside the sources\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "first")
    (repo / "sources" / "train" / "loop.py").write_text("second\n")
    _git(repo, "commit", "-qam", "second")
    return repo


def test_git_archive_exports_only_the_sources_root_as_of_the_revision(repo: Path, tmp_path: Path) -> None:
    assert git_toplevel(repo / "sources").resolve() == repo.resolve()
    out = export_git_tree(repo / "sources", "HEAD~1", tmp_path / "export")
    assert out == tmp_path / "export" / "sources"
    assert (out / "train" / "loop.py").read_text() == "first\n"
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["sources"]  # other.txt stays out


def test_a_bad_revision_or_no_repository_is_refused_in_one_line(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(RefusedError, match=r"^git archive nope -- sources failed \(.*\); check the rev$"):
        export_git_tree(repo / "sources", "nope", tmp_path / "export")
    (tmp_path / "plain").mkdir()
    with pytest.raises(RefusedError, match="not inside a git repository; a git source needs one"):
        git_toplevel(tmp_path / "plain")


def test_an_arm_reads_the_tree_or_a_fresh_export_of_its_revision(repo: Path, tmp_path: Path) -> None:
    shipped = load_protocol(REPO / "protocol" / "r3_mini.yaml")
    data = shipped.protocol.model_dump(by_alias=True)
    data["sources"]["root"] = "sources"
    loaded = LoadedProtocol(protocol=type(shipped.protocol).model_validate(data), path=repo / "p.yaml", base=repo)
    tree_arm = loaded.protocol.arms.baseline
    assert arm_source_dir(loaded, tree_arm, tmp_path / "work") == (repo / "sources").resolve()
    git_arm = tree_arm.model_copy(update={"source": GitSource(git="HEAD~1")})
    (tmp_path / "work" / "git-export" / "stale").mkdir(parents=True)  # an earlier export is replaced, not mixed
    src = arm_source_dir(loaded, git_arm, tmp_path / "work")
    assert (src / "train" / "loop.py").read_text() == "first\n"
    assert not (tmp_path / "work" / "git-export" / "stale").exists()
