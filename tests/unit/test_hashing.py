"""protocol/hashing.py: the one canonical JSON (its flags decide the bytes) and the one file hash, on hand-worked
values."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from protocol.hashing import canonical_json, file_sha256, sha256_fd, sha256_file

DOC = {"b": [1, 2.5], "a": "é"}


def test_canonical_json_sorts_keys_without_whitespace_and_keeps_or_escapes_non_ascii() -> None:
    assert canonical_json(DOC, ensure_ascii=False) == '{"a":"é","b":[1,2.5]}'
    assert canonical_json(DOC, ensure_ascii=True) == '{"a":"\\u00e9","b":[1,2.5]}'


def test_pretty_canonical_json_has_one_space_indents_and_a_final_newline() -> None:
    assert canonical_json(DOC, ensure_ascii=True, pretty=True) == (
        '{\n "a": "\\u00e9",\n "b": [\n  1,\n  2.5\n ]\n}\n'
    )


def test_nan_is_written_unless_refused() -> None:
    assert canonical_json({"x": float("nan")}, ensure_ascii=True) == '{"x":NaN}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("inf")}, ensure_ascii=True, allow_nan=False)


def test_file_hash_is_the_sha256_of_the_raw_bytes_and_the_size(tmp_path: Path) -> None:
    (tmp_path / "abc").write_bytes(b"abc")
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "abc") == ("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", 3)
    assert sha256_file(str(tmp_path / "empty")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_a_file_over_several_read_chunks_hashes_whole(tmp_path: Path) -> None:
    data = bytes(range(256)) * (3 * 4096 + 1)  # 3 MiB + 256 bytes: four 1 MiB reads, the last one short
    (tmp_path / "big").write_bytes(data)
    assert file_sha256(tmp_path / "big") == (hashlib.sha256(data).hexdigest(), len(data))


def test_a_descriptors_hash_is_of_the_whole_file_and_leaves_its_position(tmp_path: Path) -> None:
    """sha256_fd reads by offset: from the start whatever the position, which it leaves where it was (the reload
    hashes the descriptor torch.load is reading)."""
    import os

    data = bytes(range(256)) * 9000  # over two read chunks
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        os.lseek(fd, 1234, os.SEEK_SET)
        assert sha256_fd(fd) == (hashlib.sha256(data).hexdigest(), len(data))
        assert os.lseek(fd, 0, os.SEEK_CUR) == 1234
    finally:
        os.close(fd)
