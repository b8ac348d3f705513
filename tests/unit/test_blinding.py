"""Blinding of the trainer's own outputs: generated images and HTML reports leave the run folder, sealed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ledger.files.hygiene import scan_paths
from orchestrator.isolation.blinding import quarantine, seal_outputs, special_entries
from orchestrator.isolation.safe_paths import UnsafeEntry

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def test_images_and_reports_leave_the_run_folder_and_are_sealed(tmp_path: Path) -> None:
    pkg = tmp_path / "runs" / "r" / "packages" / "train-A"
    (pkg / "trainer" / "eval_step_0").mkdir(parents=True)
    (pkg / "trainer" / "eval_step_0" / "index.html").write_text("<html><img src='0.png'>Overall 0.5</html>")
    (pkg / "trainer" / "eval_step_0" / "0.png").write_bytes(PNG)
    (pkg / "result.json").write_text('{"schema": "orch.train/1"}')
    (pkg / "steps.rank0.jsonl").write_text('{"step": 0}\n')
    assert scan_paths([pkg])[0]  # hygiene sees the image before
    scratch = tmp_path / "scratch" / "r"
    trainer = scratch / "trainer" / "train-A"
    trainer.mkdir(parents=True)
    (trainer / "std_out.txt").write_text("eval_log: {'Eval_geneval_plus/Round_0/Overall': 0.5}\n")
    moved = quarantine(pkg, scratch, "train-A")
    assert sorted(moved) == ["image", "report"]
    assert sorted(p.name for p in pkg.rglob("*") if p.is_file()) == ["result.json", "steps.rank0.jsonl"]
    assert scan_paths([pkg])[0] == []  # the run folder is hygiene-clean after
    assert sorted(p.name for p in (scratch / "quarantine" / "train-A").rglob("*") if p.is_file()) == [
        "0.png", "index.html"]
    summary = seal_outputs(scratch, "train-A")
    assert summary["files"] == 3 and summary["kinds"] == {"image": 1, "other": 1, "report": 1}
    assert "index.html" not in str(summary) and "std_out" not in str(summary)  # counts and a digest, no names
    for p in [*trainer.rglob("*"), *(scratch / "quarantine").rglob("*")]:
        assert not p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    again = seal_outputs(scratch, "train-A")
    assert again["sha256"] == summary["sha256"]


def test_an_empty_or_missing_trainer_dir_seals_to_nothing(tmp_path: Path) -> None:
    assert seal_outputs(tmp_path, "absent")["files"] == 0
    assert quarantine(tmp_path / "absent", tmp_path, "t") == []


# issue 49, hole 2: orch's post-package step followed links the candidate planted. Each case moved or chmodded
# outside the package's folders before the fix
def test_a_planted_link_never_redirects_a_move_or_a_chmod(tmp_path: Path) -> None:
    pkg = tmp_path / "runs" / "r" / "packages" / "train-C"
    pkg.mkdir(parents=True)
    (pkg / "ckpt.pth").write_bytes(b"\x80\x04planted")  # what the hygiene scan calls a checkpoint: it is moved
    victim = tmp_path / "site-packages"  # any folder orch's user can write
    victim.mkdir()
    (victim / "keep.py").write_text("x = 1\n")
    scratch = tmp_path / "scratch"
    trainer = scratch / "trainer" / "train-C"
    trainer.mkdir(parents=True)
    (trainer / "from-package-dir").symlink_to(victim)  # the old quarantine target, planted as a link
    (trainer / "evil").symlink_to(victim / "keep.py")  # a link among the trainer's outputs: never chmodded
    (pkg / "linked").symlink_to(victim)  # a link in the run folder: never walked into, and named
    assert quarantine(pkg, scratch, "train-C") == ["checkpoint"]
    assert sorted(os.listdir(victim)) == ["keep.py"]
    assert (scratch / "quarantine" / "train-C" / "ckpt.pth").is_file()
    summary = seal_outputs(scratch, "train-C")
    assert summary["kinds"] == {"checkpoint": 1, "link": 2}
    assert os.stat(victim / "keep.py").st_mode & stat.S_IWUSR and os.stat(victim).st_mode & stat.S_IWUSR
    assert special_entries(pkg) == ["linked (link)"]


def test_a_planted_quarantine_folder_is_refused_and_nothing_moves(tmp_path: Path) -> None:
    pkg = tmp_path / "packages" / "train-B"
    pkg.mkdir(parents=True)
    (pkg / "img.png").write_bytes(PNG)
    scratch = tmp_path / "scratch"
    (scratch / "quarantine").mkdir(parents=True)
    victim = tmp_path / "sealed-cache"
    victim.mkdir()
    (scratch / "quarantine" / "train-B").symlink_to(victim)  # scan mode: an earlier package planted B's folder
    with pytest.raises(UnsafeEntry):
        quarantine(pkg, scratch, "train-B")
    assert os.listdir(victim) == [] and (pkg / "img.png").is_file()


def test_a_fifo_in_the_run_folder_is_named_not_waited_on(tmp_path: Path) -> None:
    pkg = tmp_path / "train-C"
    pkg.mkdir()
    os.mkfifo(pkg / "steps.rank0.jsonl")
    (pkg / "zero").symlink_to("/dev/zero")
    assert quarantine(pkg, tmp_path, "train-C") == []
    assert special_entries(pkg) == ["steps.rank0.jsonl (FIFO)", "zero (link)"]
