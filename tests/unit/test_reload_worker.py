"""The reload package's read of one rank's checkpoint (workers/reload.reload_rank): the file's SHA256, taken beside
the load, is the file's; the digests are the saved tensors'; a link in the checkpoint's place is refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from protocol.fileio import NotRegularError  # noqa: E402
from workers.rank.digest import digest_many  # noqa: E402
from workers.rank.probe_model import save_checkpoint  # noqa: E402
from workers.reload import reload_rank  # noqa: E402


def test_a_reload_reads_back_the_saved_digests_and_the_files_sha256(tmp_path: Path) -> None:
    w = torch.arange(300_000, dtype=torch.float32)
    tensors = {"param/w": w, "optim/w/exp_avg": w * 3}
    name, sha = save_checkpoint(tensors, tmp_path / "ckpt", 1, 2)
    rank, world = reload_rank(tmp_path / "ckpt" / name, "cpu")
    assert (rank.rank, world) == (1, 2)
    assert rank.checkpoint_sha256 == sha == hashlib.sha256((tmp_path / "ckpt" / name).read_bytes()).hexdigest()
    assert rank.digests == digest_many(tensors)


def test_a_link_in_the_checkpoints_place_is_refused(tmp_path: Path) -> None:
    name, _ = save_checkpoint({"param/w": torch.ones(4)}, tmp_path / "real", 0, 1)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / name).symlink_to(tmp_path / "real" / name)
    with pytest.raises(NotRegularError):
        reload_rank(tmp_path / "ckpt" / name, "cpu")


def test_a_fifo_in_the_checkpoints_place_is_refused_not_waited_on(tmp_path: Path) -> None:
    import os

    (tmp_path / "ckpt").mkdir()
    os.mkfifo(tmp_path / "ckpt" / "rank0.pt")
    with pytest.raises(NotRegularError, match="FIFO"):
        reload_rank(tmp_path / "ckpt" / "rank0.pt", "cpu")
