"""Manifests: raw-byte SHA256 per file, a root over the canonical entry list, diffs, refusals, sha256sum export."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from manifests.core import diff_manifests, hash_tree, load_manifest
from protocol.errors import RefusedError

names = st.lists(
    st.text(alphabet="abcdefgh_", min_size=1, max_size=6), min_size=1, max_size=8, unique=True
)
contents = st.binary(min_size=0, max_size=64)


def _write(root: Path, files: dict[str, bytes], order: list[str]) -> None:
    for name in order:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data(), keys=names)
def test_root_independent_of_creation_order(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject,
                                            keys: list[str]) -> None:
    files = {f"d{i % 3}/{k}.py": data.draw(contents) for i, k in enumerate(keys)}
    order1 = list(files)
    order2 = data.draw(st.permutations(order1))
    a, b = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    _write(a, files, order1)
    _write(b, files, list(order2))
    ma, mb = hash_tree(a, ["**/*.py"]), hash_tree(b, ["**/*.py"], workers=4)
    assert ma.root == mb.root
    assert [e.path for e in ma.entries] == sorted(files)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data(), keys=names)
def test_any_change_changes_root_and_shows_in_diff(tmp_path_factory: pytest.TempPathFactory,
                                                   data: st.DataObject, keys: list[str]) -> None:
    files = {f"{k}.py": data.draw(st.binary(min_size=1, max_size=32)) for k in keys}
    root = tmp_path_factory.mktemp("t")
    _write(root, files, list(files))
    before = hash_tree(root, ["*.py"])
    victim = data.draw(st.sampled_from(sorted(files)))
    kind = data.draw(st.sampled_from(["flip", "rename", "add", "remove"]))
    if kind == "flip":
        raw = bytearray(files[victim])
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
        (root / victim).write_bytes(bytes(raw))
    elif kind == "rename":
        (root / victim).rename(root / ("zz_" + victim))
    elif kind == "add":
        (root / "new_file_x.py").write_bytes(b"x")
    elif kind == "remove":
        if len(files) == 1:
            return
        (root / victim).unlink()
    after = hash_tree(root, ["*.py"])
    assert after.root != before.root
    diff = diff_manifests(before, after)
    if kind == "flip":
        assert diff.changed == [victim] and not diff.added and not diff.removed
    elif kind == "rename":
        assert diff.removed == [victim] and diff.added == ["zz_" + victim]
    elif kind == "add":
        assert diff.added == ["new_file_x.py"]
    else:
        assert diff.removed == [victim]


def test_large_file_hashed_in_chunks_equals_sha256sum(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * (1 << 20) + 17))
    m = hash_tree(tmp_path, ["*.bin"])
    out = subprocess.run(["sha256sum", str(big)], capture_output=True, text=True, check=True).stdout
    assert m.entries[0].sha256 == out.split()[0]
    assert m.entries[0].size == big.stat().st_size


def test_symlink_leaving_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text("x")
    root = tmp_path / "root"
    root.mkdir()
    (root / "ok.py").write_text("y")
    (root / "evil.py").symlink_to(outside)
    with pytest.raises(RefusedError, match="symlink leaves the root"):
        hash_tree(root, ["*.py"])


def test_unreadable_file_is_refused(tmp_path: Path, repo: Path) -> None:
    """In a real subprocess; as root it runs without the capabilities that read every file."""
    import sys

    (tmp_path / "ok.py").write_text("x")
    secret = tmp_path / "secret.py"
    secret.write_text("x")
    secret.chmod(0)
    code = f"from pathlib import Path; import manifests.core as m; m.hash_tree(Path({str(tmp_path)!r}), ['*.py'])"
    cmd = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without util-linux setpriv to drop CAP_DAC_OVERRIDE")
        cmd = [setpriv, "--bounding-set", "-dac_override,-dac_read_search", *cmd]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(repo)})
    assert proc.returncode != 0
    assert "secret.py: unreadable" in proc.stderr


def test_include_matching_nothing_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x")
    with pytest.raises(RefusedError, match="matches no file"):
        hash_tree(tmp_path, ["train/**/*.py"])


def test_altered_commitment_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x")
    m = hash_tree(tmp_path, ["*.py"])
    path = tmp_path / "m.json"
    path.write_text(m.to_json().replace(m.entries[0].sha256, "0" * 64))
    with pytest.raises(RefusedError) as refused:
        load_manifest(path)
    # the whole line, not a word that the test's own folder name (test_altered_...) also carries
    assert str(refused.value) == f"{path}: root digest does not match its entries; the commitment file was altered"


def test_freeze_of_real_tree_matches_sha256sum_file_by_file(tmp_path: Path, repo: Path) -> None:
    """Several hundred real files (the installed stdlib's email and json packages, copied) against sha256sum."""
    import email
    import json

    src = tmp_path / "src"
    for pkg in (email, json):
        shutil.copytree(Path(pkg.__file__).parent, src / pkg.__name__)
    for i in range(300):
        (src / "gen" / f"f{i // 50}").mkdir(parents=True, exist_ok=True)
        (src / "gen" / f"f{i // 50}" / f"m{i}.py").write_bytes(os.urandom(i * 7 % 997))
    m = hash_tree(src, ["**/*.py"])
    assert len(m.entries) > 300
    listing = tmp_path / "sums.txt"
    listing.write_text(m.to_sha256sum())
    check = subprocess.run(["sha256sum", "-c", "--quiet", str(listing)], cwd=src, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    ref = subprocess.run(["sha256sum", *[e.path for e in m.entries]], cwd=src, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert [line.split()[0] for line in ref] == [e.sha256 for e in m.entries]


@pytest.mark.parametrize(("pattern", "matches", "misses"), [
    ("train/**/*.py", ["train/a.py", "train/x/y/b.py"], ["train/a.pyc", "other/train/a.py", "train.py"]),
    ("**/*.py", ["a.py", "x/y/a.py"], ["a.txt"]),
    ("data/**", ["data/a", "data/x/y.json"], ["dat/a", "data"]),
    ("*.py", ["a.py"], ["x/a.py", "a.pyi"]),
    ("a?.py", ["ab.py"], ["a.py", "abc.py", "a/.py"]),
    ("[ab].py", ["a.py", "b.py"], ["c.py", "ab.py"]),
    ("[!ab].py", ["c.py"], ["a.py", "b.py"]),
    ("a+b.py", ["a+b.py"], ["aab.py"]),  # a regex character stands for itself
    ("[a", ["[a"], ["a"]),  # an unclosed bracket is a literal
])
def test_glob_patterns_match_as_written(pattern: str, matches: list[str], misses: list[str]) -> None:
    from manifests.core import glob_regex

    rx = glob_regex(pattern)
    assert [p for p in matches if rx.match(p)] == matches
    assert [p for p in misses if rx.match(p)] == []


def test_the_root_is_the_sha256_of_the_sorted_entries_as_compact_json() -> None:
    import hashlib

    from manifests.core import Entry, root_digest

    a = Entry(path="b.py", sha256="1" * 64, size=3)
    b = Entry(path="a.py", sha256="2" * 64, size=10)
    text = ('[{"path":"a.py","sha256":"' + "2" * 64 + '","size":10},'
            '{"path":"b.py","sha256":"' + "1" * 64 + '","size":3}]')
    assert root_digest([a, b]) == hashlib.sha256(text.encode()).hexdigest() == root_digest([b, a])
    assert root_digest([]) == hashlib.sha256(b"[]").hexdigest()
