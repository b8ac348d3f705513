"""manifests/core.py rule by rule (issue 18): the parallel hashing, the include globs, what select_files keeps and
refuses, the manifest's exact text, the diff's wording, loading and the atomic write.

Digests are SHA256 of raw bytes, the rule itself: the FIPS 180-2 vectors for "" and "abc", hashlib for the rest.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import manifests.core as core
from manifests.core import (
    Entry,
    Manifest,
    ManifestDiff,
    glob_regex,
    hash_tree,
    load_manifest,
    root_digest,
    select_files,
    write_text_atomic,
)
from protocol.errors import RefusedError

EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # SHA256 of b""
ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # SHA256 of b"abc"


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _refusal(call: object, *args: object) -> str:
    with pytest.raises(RefusedError) as info:
        call(*args)  # type: ignore[operator]
    assert info.value.exit_code == 3
    return info.value.message


# --- the parallel hashing ---------------------------------------------------------------------------------------------

SEVEN = {f"d/f{i}.py": bytes([65 + i]) * i for i in range(7)}  # f0 is empty, f3 is b"DDD", ...


def _expected(files: dict[str, bytes]) -> list[Entry]:
    return [Entry(path=p, sha256=hashlib.sha256(files[p]).hexdigest(), size=len(files[p])) for p in sorted(files)]


@contextmanager
def _only_children_exit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The caller's process is never told to exit, and a child never comes back into the caller's code.

    A child that does is ended here with exit status 0 and nothing written, so its share goes missing in the caller.
    """
    caller, real_exit = os.getpid(), os._exit

    def exit_(code: int) -> None:
        if os.getpid() == caller:
            raise AssertionError(f"os._exit({code!r}) in the calling process")
        real_exit(code)

    monkeypatch.setattr(os, "_exit", exit_)
    try:
        yield
    finally:
        if os.getpid() != caller:
            real_exit(0)


@pytest.mark.parametrize("workers", [1, 2, 3, 7, 9])
def test_hashing_in_forked_children_gives_every_file_once_in_path_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    root = _tree(tmp_path, {**SEVEN, "abc.txt": b"abc"})
    files = sorted([*SEVEN, "abc.txt"])
    with _only_children_exit(monkeypatch):
        entries = core._hash_in_children(str(root), files, workers)
    assert entries == [Entry(path="abc.txt", sha256=ABC, size=3), *_expected(SEVEN)]
    assert entries[1].sha256 == EMPTY


def _forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids of the children forked from here on (the parent's side of os.fork)."""
    pids: list[int] = []
    real = os.fork

    def fork() -> int:
        pid = real()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)
    return pids


def _reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.mark.parametrize("where", [0, 1, 2])  # the parent's share (i = 0) and each child's (i = 1, 2)
def test_a_file_that_cannot_be_read_in_any_share_is_one_refusal_and_leaves_no_child(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: int) -> None:
    pids = _forks(monkeypatch)
    root = _tree(tmp_path, SEVEN)
    files = sorted(SEVEN)
    files[where] = "gone.py"  # removed after the selection
    with _only_children_exit(monkeypatch):
        message = _refusal(core._hash_in_children, str(root), files, 3)
    assert message == "gone.py: cannot be read (No such file or directory); fix or exclude it"
    assert len(pids) == 2 and all(_reaped(pid) for pid in pids)


def test_of_several_failing_shares_the_first_is_named(tmp_path: Path) -> None:
    root = _tree(tmp_path, SEVEN)
    for gone in ((0, 1), (1, 2), (2, 0)):  # files i::3: share 0 is the parent's, shares 1 and 2 the children's
        files = sorted(SEVEN)
        for i in gone:
            files[i] = f"gone{i}.py"
        message = _refusal(core._hash_in_children, str(root), files, 3)
        assert message == f"gone{min(gone)}.py: cannot be read (No such file or directory); fix or exclude it"


def test_a_child_that_fails_without_a_refusal_exits_and_is_named_as_a_failed_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pids = _forks(monkeypatch)
    root = _tree(tmp_path, SEVEN)
    files = sorted(SEVEN)
    files[1] = "bad\0name.py"  # os.open raises ValueError (a null byte), not OSError: the child must still exit
    with _only_children_exit(monkeypatch):
        assert _refusal(core._hash_in_children, str(root), files, 3) == "a hashing process failed"
    assert len(pids) == 2 and all(_reaped(pid) for pid in pids)


def test_the_tree_is_hashed_in_children_from_2000_files_and_gives_the_same_manifest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = core._hash_in_children

    def spy(root: str, files: list[str], workers: int) -> list[Entry]:
        calls.append(workers)
        return real(root, files, workers)

    monkeypatch.setattr(core, "_hash_in_children", spy)
    files = {f"m/{i:04d}.py": str(i).encode() for i in range(1999)}
    root = _tree(tmp_path / "t", files)
    serial = hash_tree(root, ["**/*.py"], workers=3)
    assert calls == [] and serial.entries == _expected(files)
    (root / "m" / "1999.py").write_bytes(b"1999")
    files["m/1999.py"] = b"1999"
    assert hash_tree(root, ["**/*.py"], workers=1).entries == _expected(files) and calls == []
    parallel = hash_tree(root, ["**/*.py"], workers=3)
    assert calls == [3] and parallel.entries == _expected(files)
    assert hash_tree(root, ["**/*.py"], workers=2).root == parallel.root and calls == [3, 2]
    calls.clear()
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    assert hash_tree(root, ["**/*.py"]).root == parallel.root and calls == [5]
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one process
    assert hash_tree(root, ["**/*.py"]).root == parallel.root and calls == [5]


def test_a_manifest_is_its_entries_include_and_the_root_over_them(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"b.py": b"abc", "a.py": b"", "x.txt": b"no"})
    m = hash_tree(root, ["*.py"], workers=1)
    entries = [Entry(path="a.py", sha256=EMPTY, size=0), Entry(path="b.py", sha256=ABC, size=3)]
    text = ('[{"path":"a.py","sha256":"' + EMPTY + '","size":0},{"path":"b.py","sha256":"' + ABC + '","size":3}]')
    assert m == Manifest(root=hashlib.sha256(text.encode()).hexdigest(), include=["*.py"], entries=entries)
    assert m.to_sha256sum() == f"{EMPTY}  a.py\n{ABC}  b.py\n"


def test_the_root_escapes_non_ascii_names() -> None:
    e = Entry(path="é.py", sha256="1", size=0)
    assert root_digest([e]) == hashlib.sha256(b'[{"path":"\\u00e9.py","sha256":"1","size":0}]').hexdigest()


# --- the include globs ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "matches", "misses"), [
    ("**/a.py", ["a.py", "x/a.py", "x/y/a.py"], ["xa.py", "x/ya.py"]),
    ("a**b", ["ab", "axb", "ax/yb"], ["a", "b"]),
    ("x/**/y/*", ["x/y/z", "x/q/y/z"], ["x/y", "x/y/z/w"]),
    ("[]a].py", ["].py", "a.py"], ["b.py"]),  # a ] right after [ is in the class
    ("[\\d].py", ["d.py", "\\.py"], ["1.py", "X.py"]),  # a backslash in a class is a backslash
    ("[]", ["[]"], ["", "]"]),  # no class without a body: literal
    ("a.py", ["a.py"], ["a.py\n", "a.pyc", "axpy"]),
    ("*.py", ["a.py", ".py"], ["apy", "a.py/b"]),  # the character after a star is matched, not skipped
    ("[a]", ["a"], ["[a]", "b"]),  # a class of one
    ("[a]*]", ["ab]", "a]"], ["]", "b]"]),  # the class ends at the first ] after its first character
])
def test_more_glob_patterns_match_as_written(pattern: str, matches: list[str], misses: list[str]) -> None:
    rx = glob_regex(pattern)
    assert [p for p in matches if rx.match(p)] == matches
    assert [p for p in misses if rx.match(p)] == []


# --- select_files -----------------------------------------------------------------------------------------------------

def test_select_files_keeps_regular_files_and_links_to_files_inside_the_root_once_and_sorted(tmp_path: Path) -> None:
    real = _tree(tmp_path / "real", {"b.py": b"1", "a.py": b"2", "pkg/c.py": b"3", "pkg/d.txt": b"4"})
    (real / "link.py").symlink_to(real / "pkg" / "c.py")
    (real / "dirlink.py").symlink_to(real / "pkg")  # a link to a folder: listed, not entered, not a file
    (real / "linkdir").symlink_to(real / "pkg")
    os.mkfifo(real / "fifo.py")  # not a source
    (tmp_path / "root").symlink_to(real)  # the root itself through a link: links inside still resolve into it
    got = select_files(tmp_path / "root", ["*.py", "**/*.py"])  # linkdir/c.py would match if it were entered
    assert got == ["a.py", "b.py", "link.py", "pkg/c.py"]


def test_a_pattern_that_matches_only_a_fifo_or_a_folder_link_matches_no_file(tmp_path: Path) -> None:
    root = _tree(tmp_path / "r", {"a.py": b""})
    os.mkfifo(root / "f.pipe")
    (root / "d.link").symlink_to(root)
    for pattern in ("*.pipe", "*.link"):
        assert _refusal(select_files, root, ["*.py", pattern]) == (
            f"include {pattern!r} matches no file under {root}; fix the glob")


def test_select_files_refusals_name_the_problem_and_the_fix(tmp_path: Path) -> None:
    root = _tree(tmp_path / "r", {"a.py": b""})
    assert _refusal(select_files, root / "a.py", ["*.py"]) == (
        f"{root / 'a.py'}: not a directory; give the root of the sources")
    assert _refusal(select_files, root / "none", ["*.py"]) == (
        f"{root / 'none'}: not a directory; give the root of the sources")
    for pattern in ("/etc/*.py", "../*.py", "a/../../b.py"):
        assert _refusal(select_files, root, ["*.py", pattern]) == (
            f"include {pattern!r} leaves the root; use a glob relative to {root}")
    (root / "..a").touch()  # a name that starts with two dots is not a parent folder
    assert select_files(root, ["..a*", "*.py"]) == ["..a", "a.py"]
    outside = tmp_path / "out.py"
    outside.write_bytes(b"")
    (root / "evil.py").symlink_to(outside)
    assert _refusal(select_files, root, ["a.py", "evil.py"]) == (
        f"evil.py: symlink leaves the root ({outside}); replace it with a file")
    # a link that leaves the root but is not included is not looked at
    assert select_files(root, ["a.py"]) == ["a.py"]


# --- the manifest's text, the diff's words, loading and writing -------------------------------------------------------

def test_the_manifest_json_is_sorted_one_space_indented_ascii_with_a_final_newline() -> None:
    m = Manifest(root="r", include=["*.py"], entries=[Entry(path="a.py", sha256="s", size=3)])
    assert m.to_json() == ('{\n "entries": [\n  {\n   "path": "a.py",\n   "sha256": "s",\n   "size": 3\n  }\n ],\n'
                           ' "include": [\n  "*.py"\n ],\n "root": "r",\n "schema": "orch.manifest/1"\n}\n')
    m2 = Manifest(root="r", include=[], entries=[], sources_root="src/é")
    assert m2.to_json() == ('{\n "entries": [],\n "include": [],\n "root": "r",\n "schema": "orch.manifest/1",\n'
                            ' "sources_root": "src/\\u00e9"\n}\n')


def test_the_diff_summary_names_changed_added_removed_up_to_a_limit() -> None:
    d = ManifestDiff(added=["n"], removed=["r1", "r2"], changed=[f"c{i}" for i in range(1, 7)])
    assert d.summary() == "6 changed (c1, c2, c3, c4, c5, ...); 1 added (n); 2 removed (r1, r2)"
    assert d.summary(limit=2) == "6 changed (c1, c2, ...); 1 added (n); 2 removed (r1, r2)"
    assert d.summary(limit=6) == "6 changed (c1, c2, c3, c4, c5, c6); 1 added (n); 2 removed (r1, r2)"
    assert d.lines() == [*(f"changed  c{i}" for i in range(1, 7)), "added    n", "removed  r1", "removed  r2"]
    assert not d.equal
    assert ManifestDiff([], ["r"], []).summary() == "1 removed (r)" and not ManifestDiff([], ["r"], []).equal
    assert not ManifestDiff(["a"], [], []).equal and not ManifestDiff([], [], ["c"]).equal
    equal = ManifestDiff([], [], [])
    assert (equal.equal, equal.summary(), equal.lines()) == (True, "equal", [])


def test_load_manifest_reads_back_what_was_written_and_refuses_the_rest(tmp_path: Path) -> None:
    entries = [Entry(path="a.py", sha256=ABC, size=3)]
    m = Manifest(root=root_digest(entries), include=["*.py"], entries=entries, sources_root="src")
    path = tmp_path / "deep" / "er" / "manifest.json"
    write_text_atomic(path, m.to_json())
    assert load_manifest(path) == m
    assert sorted(os.listdir(path.parent)) == ["manifest.json"]  # no temporary file left
    write_text_atomic(path, "replaced")
    assert path.read_text() == "replaced" and sorted(os.listdir(path.parent)) == ["manifest.json"]
    # pydantic's own first line of the error, nothing after it
    assert _refusal(load_manifest, path) == (
        f"{path}: not a valid manifest (1 validation error for Manifest); re-run `orch freeze`")
    assert _refusal(load_manifest, tmp_path / "none.json") == (
        f"{tmp_path / 'none.json'}: cannot read the commitment (No such file or directory); run `orch freeze` first")
    path.write_text(m.to_json().replace('"size": 3', '"size": 4'))
    assert _refusal(load_manifest, path) == (
        f"{path}: root digest does not match its entries; the commitment file was altered")


def test_a_file_its_reader_may_not_open_is_refused_as_unreadable_naming_it(tmp_path: Path) -> None:
    """In a forked child that runs as nobody when this is root (root's CAP_DAC_OVERRIDE reads a mode-0 file)."""
    (tmp_path / "ok.py").write_bytes(b"abc")
    (tmp_path / "secret.py").write_bytes(b"x")
    (tmp_path / "secret.py").chmod(0)
    assert core._hash_one(str(tmp_path), "ok.py") == Entry(path="ok.py", sha256=ABC, size=3)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            try:
                core._hash_one(str(tmp_path), "secret.py")
                said = "read"
            except RefusedError as err:
                said = str(err.message)
            os.write(w, said.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode()
    os.waitpid(pid, 0)
    assert said == "secret.py: unreadable (permission denied); fix its permissions"
