"""Blinding of the trainer's own outputs: generated images and HTML reports leave the run folder, sealed."""

from __future__ import annotations

import stat
from pathlib import Path

from ledger.files.hygiene import scan_paths
from orchestrator.blinding import quarantine, seal_outputs

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def test_images_and_reports_leave_the_run_folder_and_are_sealed(tmp_path: Path) -> None:
    pkg = tmp_path / "runs" / "r" / "packages" / "train-A"
    (pkg / "trainer" / "eval_step_0").mkdir(parents=True)
    (pkg / "trainer" / "eval_step_0" / "index.html").write_text("<html><img src='0.png'>Overall 0.5</html>")
    (pkg / "trainer" / "eval_step_0" / "0.png").write_bytes(PNG)
    (pkg / "result.json").write_text('{"schema": "orch.train/1"}')
    (pkg / "steps.rank0.jsonl").write_text('{"step": 0}\n')
    assert scan_paths([pkg])[0]  # hygiene sees the image before
    trainer = tmp_path / "scratch" / "r" / "trainer" / "train-A"
    trainer.mkdir(parents=True)
    (trainer / "std_out.txt").write_text("eval_log: {'Eval_geneval_plus/Round_0/Overall': 0.5}\n")
    moved = quarantine(pkg, trainer)
    assert sorted(moved) == ["image", "report"]
    assert sorted(p.name for p in pkg.rglob("*") if p.is_file()) == ["result.json", "steps.rank0.jsonl"]
    assert scan_paths([pkg])[0] == []  # the run folder is hygiene-clean after
    summary = seal_outputs(trainer)
    assert summary["files"] == 3 and summary["kinds"] == {"image": 1, "other": 1, "report": 1}
    assert "index.html" not in str(summary) and "std_out" not in str(summary)  # counts and a digest, no names
    for p in trainer.rglob("*"):
        if p.is_file():
            assert not p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    again = seal_outputs(trainer)
    assert again["sha256"] == summary["sha256"]


def test_an_empty_or_missing_trainer_dir_seals_to_nothing(tmp_path: Path) -> None:
    assert seal_outputs(tmp_path / "absent")["files"] == 0
    assert quarantine(tmp_path / "absent", tmp_path / "t") == []
