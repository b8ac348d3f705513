"""The shared initial state (the checks' init.safetensors, which every arm loads) between and after packages: its
fingerprint (mode, inode, size, mtime, ctime) before and after each package, its SHA256 after the last package that
reads it (orchestrator/run/run_plan._check_sealed, last_init_reader). A rewrite, even of the same bytes, a chmod or a
replacement is named at once; bytes changed under a fingerprint that matched are caught by the hash at the end."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.isolation.safe_paths import file_fingerprint as init_fingerprint
from orchestrator.run.run_plan import _check_sealed, _sealed_unchanged, last_init_reader
from protocol.errors import FailedError
from protocol.hashing import sha256_file
from protocol.plan import plan


class _Caches:
    def check_baseline(self, when: str) -> None:
        pass

    def check_copy(self, cache: Path) -> None:
        pass


def _ctx(tmp_path: Path) -> tuple[Any, str]:
    init = tmp_path / "init.safetensors"
    init.write_bytes(b"\x00" * 4096 + b"weights")
    ctx = SimpleNamespace(sealed={}, caches=_Caches(), checkpoints={}, scratch=tmp_path,
                          init_stat=init_fingerprint(init))  # fmt: skip
    return ctx, sha256_file(init)


def test_an_untouched_initial_state_passes_both_checks(tmp_path: Path) -> None:
    ctx, digest = _ctx(tmp_path)
    _check_sealed(ctx, "during train-A", digest)
    assert _sealed_unchanged(ctx, tmp_path, digest) is None
    assert init_fingerprint(tmp_path / "missing") is None


@pytest.mark.parametrize("change", ["same bytes rewritten", "chmod", "replaced", "a link"])
def test_any_write_chmod_or_replacement_is_named_before_and_after_a_package(tmp_path: Path, change: str) -> None:
    ctx, digest = _ctx(tmp_path)
    init = tmp_path / "init.safetensors"
    data = init.read_bytes()
    if change == "same bytes rewritten":
        time.sleep(0.05)  # the kernel stamps files from a coarse clock (a tick is at most 10 ms): a later tick
        init.write_bytes(data)
    elif change == "chmod":
        init.chmod(0o444)
    elif change == "replaced":
        (tmp_path / "new").write_bytes(data)
        os.replace(tmp_path / "new", init)
    else:
        (tmp_path / "elsewhere").write_bytes(data)
        init.unlink()
        init.symlink_to(tmp_path / "elsewhere")
    assert _sealed_unchanged(ctx, tmp_path, digest) == "the shared initial state changed between packages"
    with pytest.raises(FailedError, match="the shared initial state changed during train-C"):
        _check_sealed(ctx, "during train-C", digest)


def test_after_the_last_package_that_reads_it_the_content_is_hashed_as_well(tmp_path: Path) -> None:
    """Bytes changed under a fingerprint that matched (as if the ctime could be set back): the checks between and
    after the packages read the fingerprint only, the one after the last package that reads the file hashes it too."""
    ctx, digest = _ctx(tmp_path)
    init = tmp_path / "init.safetensors"
    init.write_bytes(b"\x01" + init.read_bytes()[1:])
    ctx.init_stat = init_fingerprint(init)
    assert _sealed_unchanged(ctx, tmp_path, digest) is None
    _check_sealed(ctx, "during reload-C", digest)
    with pytest.raises(FailedError, match=r"changed during the run: its SHA256, hashed during watch-C \(the last"):
        _check_sealed(ctx, "during watch-C", digest, content=True)
    _check_sealed(ctx, "during score", None, content=True)  # the scorer's package: no initial state is checked


def test_the_last_package_that_reads_it_is_the_replay_or_an_aa_launchs_last_train() -> None:
    full = plan(1)
    assert full[last_init_reader(full)].name == "watch-C" and full[-1].name == "score"
    aa = plan(1, calibration=True)
    assert aa[last_init_reader(aa)].name == aa[-1].name == "train-B"
    grown = plan(3, sequential=True)  # a sequential plan grows before the replay: its end stays the replay
    assert grown[last_init_reader(grown)].kind == "replay"
