"""The shared initial state (the checks' init.safetensors, which every arm loads) between and after packages: its
fingerprint (mode, inode, size, mtime, ctime) before each package, its SHA256 and fingerprint after each one
(orchestrator/run/run_plan._check_sealed). A rewrite, even of the same bytes, a chmod or a replacement is named; the
content hash after a package also catches bytes changed under a fingerprint that matched."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.isolation.safe_paths import file_fingerprint as init_fingerprint
from orchestrator.run.run_plan import _check_sealed, _sealed_unchanged
from protocol.errors import FailedError
from protocol.hashing import sha256_file


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


def test_after_a_package_the_content_is_hashed_as_well(tmp_path: Path) -> None:
    """Bytes changed under a fingerprint that matched (as if the ctime could be set back): the check between
    packages reads the fingerprint only, the one after a package hashes the file too."""
    ctx, digest = _ctx(tmp_path)
    init = tmp_path / "init.safetensors"
    init.write_bytes(b"\x01" + init.read_bytes()[1:])
    ctx.init_stat = init_fingerprint(init)
    assert _sealed_unchanged(ctx, tmp_path, digest) is None
    with pytest.raises(FailedError, match="the shared initial state changed during reload-C"):
        _check_sealed(ctx, "during reload-C", digest)
    _check_sealed(ctx, "during score", None)  # the scorer's package: no initial state is checked
