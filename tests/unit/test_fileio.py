"""protocol/fileio.py: write_atomic leaves the old bytes or the new ones, and never a temporary file."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.fileio import fsync_dir, write_atomic


def test_write_atomic_writes_then_replaces_and_leaves_only_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_atomic(path, b"first\n")
    write_atomic(path, b"second\n")
    assert path.read_bytes() == b"second\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_failed_write_keeps_the_old_bytes_and_removes_its_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_atomic(path, b"old\n")
    with pytest.raises(TypeError):
        write_atomic(path, "not bytes")  # type: ignore[arg-type]  # fails after the temporary file was opened
    assert path.read_bytes() == b"old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_write_over_a_folder_fails_and_leaves_the_folder(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "d", b"x")
    assert (tmp_path / "d").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_fsync_dir_needs_an_existing_folder(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsync_dir(tmp_path / "absent")
