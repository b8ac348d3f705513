"""`orch publish`: aggregate evidence of an audited run, hygiene-checked, written atomically, never rewritten."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cliutil import orch
from test_audit import RunSpec, make_run

from ledger.files.hygiene import scan_paths
from ledger.files.publish import EVIDENCE_SCHEMA, publish_run
from ledger.verdict.documents.audit import audit_run
from protocol.errors import RefusedError


def _orch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return orch(*args, cwd=cwd)  # in this process (tests/cliutil.py): same entry point, no new interpreter


def _repo(tmp_path: Path) -> Path:
    """A repository to publish into: a folder with .git and docs/validation/."""
    (tmp_path / ".git").mkdir(parents=True, exist_ok=True)
    (tmp_path / "docs" / "validation").mkdir(parents=True, exist_ok=True)
    return tmp_path


def _evidence(tmp_path: Path, name: str = "e.json") -> Path:
    return _repo(tmp_path) / "docs" / "validation" / name


def test_publish_writes_aggregate_evidence_that_passes_hygiene(tmp_path: Path) -> None:
    home = tmp_path / "home"
    make_run(home, spec=RunSpec(calibrated=True))  # one triplet, bounded by the host's A/A calibration
    audit = audit_run(home, "run1").document
    out = _evidence(tmp_path, "synthetic.json")
    publish_run(home, "run1", out, repo=tmp_path)
    doc = json.loads(out.read_text())
    assert doc["schema"] == EVIDENCE_SCHEMA and doc["verdict"] == "accepted"
    assert doc["headline"] == audit["speedup"]["headline"] and len(doc["windows"]) == 3
    assert doc["commitment_roots"] == audit["attribution"]["commitment_roots"]
    assert doc["ledger_head"] == audit["ledger_head"] and doc["host_hash"] == audit["host_hash"]
    assert doc["exactness"]["exact"] and doc["exactness"]["first_mismatch"] is None
    text = out.read_text()
    assert "dev_geneval" not in text and "w.exp_avg" not in text  # no score, no per-tensor digests
    assert scan_paths([out], host_names=[])[0] == []
    publish_run(home, "run1", out, repo=tmp_path)  # the same evidence again is a no-op
    assert out.read_text() == text


def test_run_without_audit_is_refused_with_exit_3(tmp_path: Path) -> None:
    make_run(tmp_path)
    out = _evidence(tmp_path)
    proc = _orch("publish", "run1", "--to", str(out), "--home", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "has no audit" in proc.stderr and not out.exists()


def test_evidence_failing_hygiene_is_refused_and_not_written(tmp_path: Path) -> None:
    make_run(tmp_path, spec=RunSpec(versions={"python": "3.11 at " + "/ho" + "me/alice/.pyenv/bin"}))
    audit_run(tmp_path, "run1")
    out = _evidence(tmp_path)
    with pytest.raises(RefusedError, match="fails hygiene"):
        publish_run(tmp_path, "run1", out, repo=tmp_path)
    assert not out.exists() and not list(out.parent.glob(".e.json.tmp*"))


def test_altered_audit_or_existing_evidence_is_refused(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, spec=RunSpec(calibrated=True))  # accepted: one triplet, bounded by a calibration
    audit_run(tmp_path, "run1")
    out = _evidence(tmp_path)
    out.write_text("{}\n")
    with pytest.raises(RefusedError, match="never rewritten"):
        publish_run(tmp_path, "run1", out, repo=tmp_path)
    assert out.read_text() == "{}\n"
    (run_dir / "audit.json").write_text((run_dir / "audit.json").read_text().replace("accepted", "noisy"))
    with pytest.raises(RefusedError, match="not the audit recorded in the ledger"):
        publish_run(tmp_path, "run1", _evidence(tmp_path, "f.json"), repo=tmp_path)


@pytest.mark.parametrize("where", ["outside", "dotdot", "docs", "symlink", "norepo"])
def test_publish_writes_only_inside_the_repositorys_docs_validation(tmp_path: Path, where: str) -> None:
    repo = _repo(tmp_path / "repo")
    home = tmp_path / "home"
    make_run(home)
    audit_run(home, "run1")
    cwd = repo
    to = {
        "outside": str(tmp_path / "elsewhere" / "e.json"),
        "dotdot": "docs/validation/../../../e.json",
        "docs": "docs/e.json",
        "symlink": "docs/validation/link/e.json",
        "norepo": "docs/validation/e.json",
    }[where]
    if where == "symlink":
        (tmp_path / "elsewhere").mkdir()
        (repo / "docs" / "validation" / "link").symlink_to(tmp_path / "elsewhere")
    if where == "norepo":  # no .git and no docs/validation/ above: no repository to publish into
        cwd = tmp_path / "plain"
        cwd.mkdir()
    proc = _orch("publish", "run1", "--to", to, "--home", str(home), cwd=cwd)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # orch's own words, not the echoed --to path (which holds "docs/validation/" itself in three of the cases)
    refusal = ("orch: publish writes only into a repository's docs/validation/ and no repository (.git) encloses the "
               "current directory; run it inside the repository") if where == "norepo" else (
        f"orch: --to {to}: evidence is published only inside docs/validation/ of the repository; give a path like "
        "docs/validation/NAME.json")
    assert proc.stderr.strip().splitlines() == [refusal]
    assert not list(tmp_path.rglob("e.json"))
    ok = _orch("publish", "run1", "--to", "docs/validation/ok.json", "--home", str(home), cwd=repo)
    assert ok.returncode == 0 and (repo / "docs" / "validation" / "ok.json").is_file(), ok.stderr


def test_a_copy_without_git_publishes_into_its_own_docs_validation(tmp_path: Path) -> None:
    copy = tmp_path / "copy"  # a device machine's copy of the working tree has no .git
    (copy / "docs" / "validation").mkdir(parents=True)
    make_run(tmp_path / "home")
    audit_run(tmp_path / "home", "run1")
    ok = _orch("publish", "run1", "--to", "docs/validation/e.json", "--home", str(tmp_path / "home"), cwd=copy)
    assert ok.returncode == 0 and (copy / "docs" / "validation" / "e.json").is_file(), ok.stderr
    out = _orch("publish", "run1", "--to", str(tmp_path / "e.json"), "--home", str(tmp_path / "home"), cwd=copy)
    assert out.returncode == 2 and not (tmp_path / "e.json").exists()
