"""Evidence hygiene's rules one by one (ledger.files.hygiene), on hand-made bytes, lines and small trees: each kind
and its exact words, the thresholds at their edges, what is skipped and the command's refusal.

Planted secrets, paths and magic bytes are assembled at run time, so this file passes hygiene itself.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import pytest

from ledger.files import hygiene as hy
from ledger.files.hygiene import (
    Finding,
    classify_bytes,
    files_to_scan,
    hygiene_command,
    scan_bytes,
    scan_file,
    scan_text,
    this_host_names,
)
from protocol.errors import RefusedError, UsageError

HOME = "/ho" + "me/"
USERS = "/Us" + "ers/"
AWS = "AKIA" + "ABCDEFGHIJKLMNOP"  # 20 characters
GH = "gh" + "p_" + "a1B2" * 9  # 40 characters


def _found(text: str, hosts: tuple[str, ...] = (), display: str = "f.txt") -> list[tuple[int, str, str]]:
    return [(f.line, f.kind, f.detail) for f in scan_text(display, text, list(hosts))]


# --- names -------------------------------------------------------------------------------------------------------

def test_this_hosts_names_are_its_full_short_and_fqdn_names_and_the_extra_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hy.socket, "gethostname", lambda: "Node-12.lab")
    monkeypatch.setattr(hy.socket, "getfqdn", lambda: "node-12.lab.example.org")
    monkeypatch.setenv("ORCH_HYGIENE_HOSTS", " abcd , xyz,LOCALHOST,ip6-localhost,localdomain")
    assert this_host_names(["extra-one"]) == ["Node-12", "Node-12.lab", "abcd", "extra-one",
                                              "node-12.lab.example.org"]
    monkeypatch.delenv("ORCH_HYGIENE_HOSTS")
    assert this_host_names() == ["Node-12", "Node-12.lab", "node-12.lab.example.org"]


def test_a_finding_reads_path_line_kind_detail() -> None:
    assert Finding("a/b.txt", 3, "credential", "x y").text() == "a/b.txt:3: credential: x y"


# --- files by magic bytes and name ------------------------------------------------------------------------------

def _safetensors_head(length: int) -> bytes:
    return struct.pack("<Q", length) + b'{"'


@pytest.mark.parametrize(("name", "head", "want"), [
    ("a.dat", b"\x80\x01rest", ("checkpoint", "pickle stream (protocol 1)")),
    ("a.dat", b"\x80\x05rest", ("checkpoint", "pickle stream (protocol 5)")),
    ("a.dat", b"\x80\x00rest", None),
    ("a.dat", b"\x80\x06rest", None),
    ("a.dat", b"\x80", None),
    ("a.dat", b"\x93NUMPY\x01\x00", ("tensor", "numpy .npy array")),
    ("a.dat", _safetensors_head(2), ("checkpoint", "safetensors file (header 2 bytes)")),
    ("a.dat", _safetensors_head(100 * 1024 * 1024), ("checkpoint", "safetensors file (header 104857600 bytes)")),
    ("a.dat", _safetensors_head(1), None),
    ("a.dat", _safetensors_head(100 * 1024 * 1024 + 1), None),
    ("a.dat", _safetensors_head(16)[:9], None),
    ("a.dat", b"GGUF\x03\x00", ("checkpoint", "GGUF model file")),
    ("a.dat", b"\x89HDF\r\n\x1a\n", ("tensor", "HDF5 file")),
    ("a.dat", b"\x89PNG\r\n\x1a\n", ("image", "PNG image")),
    ("a.dat", b"\xff\xd8\xff\xe0", ("image", "JPEG image")),
    ("a.dat", b"RIFF\x00\x00\x00\x00WEBPVP8 ", ("image", "WebP image")),
    ("a.dat", b"RIFF\x00\x00\x00\x00WAVEfmt ", None),
    ("a.dat", b"GIF87a", ("image", "GIF image")),
    ("a.dat", b"GIF89a", ("image", "GIF image")),
    ("a.dat", b"BM" + b"\x10\x00\x00\x00" + b"\x00" * 20, ("image", "BMP image")),
    ("a.dat", b"BM" + b"\x10\x00\x00\x00" + b"\x00" * 19, None),
    ("a.dat", b"BM" + b"\x10\x00\x00\x00" + b"\x01" + b"\x00" * 19, None),
    ("a.dat", b"II*\x00", ("image", "TIFF image")),
    ("a.dat", b"MM\x00*", ("image", "TIFF image")),
    ("Model.PT", b"text", ("checkpoint", "checkpoint/tensor file by name (.pt)")),
    ("w.safetensors", b"text", ("checkpoint", "checkpoint/tensor file by name (.safetensors)")),
    ("x.NPZ", b"text", ("tensor", "tensor file by name (.npz)")),
    ("a.JPEG", b"text", ("image", "image file by name (.jpeg)")),
    ("run.pt.trace.json", b"{}", ("profiler-trace", "profiler trace by name")),
    ("run.QDREP", b"x", ("profiler-trace", "profiler trace by name")),
    ("rewards.jsonl", b"{}", ("reward-trace", "reward trace by name")),
    ("reward_trace/notes.txt", b"text", None),  # only the file's own name says reward trace
    ("x.png", b"\x80\x02", ("checkpoint", "pickle stream (protocol 2)")),  # magic bytes before the name
    ("notes.txt", b"plain", None),
])
def test_files_are_classified_by_magic_bytes_first_then_by_name(
    name: str, head: bytes, want: tuple[str, str] | None
) -> None:
    assert classify_bytes(name, head) == want


@pytest.mark.parametrize(("names", "want"), [
    (["model/data.pkl", "model/data/0"], ("checkpoint", "torch zip archive (model/data.pkl)")),
    (["archive/version", "archive/data/0"], ("checkpoint", "torch zip archive (archive/version)")),
    (["a.npy", "b.npy"], ("tensor", "numpy .npz archive")),
    (["readme.txt"], None),
])
def test_a_zip_is_a_checkpoint_or_a_tensor_archive_by_its_members(
    names: list[str], want: tuple[str, str] | None
) -> None:
    assert classify_bytes("bundle.zip", b"PK\x03\x04rest", names) == want
    assert classify_bytes("bundle.zip", b"PK\x03\x04rest", None) is None  # members unknown: not judged by them


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def test_a_zip_file_is_opened_for_its_member_names(tmp_path: Path) -> None:
    (tmp_path / "m.zip").write_bytes(_zip({"archive/data.pkl": b"\x80\x02.", "archive/data/0": b"\x00"}))
    (tmp_path / "t.zip").write_bytes(_zip({"w.npy": b"\x93NUMPY"}))
    (tmp_path / "bad.zip").write_bytes(b"PK\x03\x04 not a zip at all")
    assert [(f.kind, f.detail) for f in scan_file(tmp_path / "m.zip", "m.zip", [])] == [
        ("checkpoint", "torch zip archive (archive/data.pkl)")]
    assert [(f.line, f.kind, f.detail) for f in scan_file(tmp_path / "t.zip", "t.zip", [])] == [
        (1, "tensor", "numpy .npz archive")]
    assert scan_file(tmp_path / "bad.zip", "bad.zip", []) == []


def test_an_image_is_a_finding_except_under_a_docs_folder() -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
    assert scan_bytes("repo/docs/fig.png", png, []) == []
    assert scan_bytes("docs/sub/fig.dat", png, []) == []
    for display in ("repo/fig.png", "mydocs/fig.png", "docs.png", "repo/docs"):
        assert [(f.line, f.kind, f.detail) for f in scan_bytes(display, png, [])] == [(1, "image", "PNG image")]
    # a checkpoint under docs/ is still a finding
    assert [f.kind for f in scan_bytes("docs/w.dat", b"\x80\x04rest", [])] == ["checkpoint"]


@pytest.mark.parametrize(("data", "scanned"), [
    (b"ok " + AWS.encode(), True),
    (b"a\x00b " + AWS.encode(), False),                      # a NUL in the first 8 KiB: binary
    (b"a" * 8192 + b"\x00 " + AWS.encode(), True),           # a NUL beyond it: text
    (b"\xff\xfe " + AWS.encode(), False),                    # not UTF-8 from the start
    (b"a" * 8187 + b"\xff " + AWS.encode(), False),          # a bad byte before the last 4 of the 8 KiB
    (b"a" * 8188 + b"\xff " + AWS.encode(), True),           # ... within them: a character cut at the boundary
    (b"a" * 8191 + "€".encode() + b" " + AWS.encode(), True),  # a real 3-byte character cut at 8192
], ids=["text", "nul", "late-nul", "not-utf8", "bad-8187", "bad-8188", "cut-char"])  # no key in a test id
def test_a_file_is_read_as_text_unless_its_first_8_kib_are_binary(data: bytes, scanned: bool) -> None:
    kinds = [f.kind for f in scan_bytes("notes.txt", data, [])]
    assert kinds == (["credential"] if scanned else [])


# --- lines -------------------------------------------------------------------------------------------------------

def test_a_credential_is_named_by_kind_and_first_four_characters_never_whole() -> None:
    assert _found("x\nkey " + AWS + "\n") == [(2, "credential", "AWS access key id: AKIA… (20 chars, redacted)")]
    assert _found("token: " + GH) == [(1, "credential", "GitHub token: ghp_… (40 chars, redacted)")]
    # an assigned secret shows its value's first characters, not the name it is assigned to
    assert _found('pass' + 'word = "hunter2hunter2"') == [
        (1, "credential", "assigned secret: hunt… (14 chars, redacted)")]


def test_one_credential_per_line_and_every_line_counted() -> None:
    assert _found(AWS + " " + GH + "\n" + GH) == [
        (1, "credential", "AWS access key id: AKIA… (20 chars, redacted)"),
        (2, "credential", "GitHub token: ghp_… (40 chars, redacted)"),
    ]


def test_a_private_path_is_shown_up_to_60_characters_once_per_line() -> None:
    long = "u" * 70
    assert _found("at " + HOME + "alice/x and " + USERS + "bob") == [
        (1, "private-path", "home directory path: " + HOME + "alice")]
    assert _found(HOME + long) == [(1, "private-path", "home directory path: " + (HOME + long)[:60])]
    assert _found("see " + USERS + "bob") == [(1, "private-path", "macOS home path: " + USERS + "bob")]
    # inside a URL, after ~ or another path: not a path of this machine
    assert _found("https://example.com" + HOME + "alice ~" + HOME + "x a" + HOME + "b") == []


def test_a_host_name_is_found_as_a_whole_name_in_any_case_once_per_line() -> None:
    hosts = ("gpu-node-17", "gpu-node-17.lab")
    assert _found("ran on GPU-NODE-17.lab, then gpu-node-17", hosts) == [
        (1, "host-name", "this host's name 'gpu-node-17'")]
    assert _found("gpu-node-170 xgpu-node-17 gpu-node-17-b", hosts[:1]) == []
    assert _found("a\ngpu-node-17.\n", hosts[:1]) == [(2, "host-name", "this host's name 'gpu-node-17'")]
    assert _found("ran on GPU-Node-17", hosts[:1]) == [(1, "host-name", "this host's name 'gpu-node-17'")]


def test_findings_of_one_line_come_credential_path_host_in_that_order() -> None:
    line = "gpu-node-17 " + HOME + "alice " + AWS
    assert [k for _, k, _ in _found(line, ("gpu-node-17",))] == ["credential", "private-path", "host-name"]


def test_a_chrome_trace_is_json_that_opens_with_a_bracket_and_has_trace_events() -> None:
    assert _found('  \n{"traceEvents": []}') == [(1, "profiler-trace", "chrome trace JSON (traceEvents)")]
    assert _found('[{"traceEvents": 1}]') == [(1, "profiler-trace", "chrome trace JSON (traceEvents)")]
    assert _found('notes: "traceEvents" is the key\n{}') == []
    assert _found('{"trace_events": []}') == []


def test_three_json_lines_with_a_reward_field_make_a_reward_trace() -> None:
    lines = ["header", '{"step": 1, "Reward_mean": 0.5}', "not json {", '{"step": 2, "reward": 1}', "[1, 2]",
             "{bad json}", '{"step": 3, "rewards": [1]}']
    assert _found("\n".join(lines)) == [
        (2, "reward-trace", "3 JSON lines with a reward field (per sample or per step)")]
    assert _found("\n".join(lines[:-1])) == []  # two such lines are not a trace


def test_a_table_with_a_reward_column_and_more_than_three_lines_is_a_reward_trace() -> None:
    rows = ["step,Reward,loss", "1,0.5,2", "2,0.6,2", "3,0.7,2"]
    assert scan_text("runs/r.CSV", "\n".join(rows), []) == [
        Finding("runs/r.CSV", 1, "reward-trace", "table with a reward column, 3 rows")]
    assert _found("\n".join(rows[:3]), display="r.csv") == []
    assert _found("\n".join(r.replace(",", "\t") for r in rows), display="r.tsv") == [
        (1, "reward-trace", "table with a reward column, 3 rows")]
    assert _found("\n".join(rows), display="r.txt") == []
    assert _found("\n".join(["step,loss", *rows[1:], "4,0.1,1"]), display="r.csv") == []


def test_twenty_lines_of_a_data_path_with_a_hash_or_size_make_a_listing() -> None:
    hashed = [f"images/{i:05d}.jpg {'ab' * 16}" for i in range(20)]
    assert _found("\n".join(["# listing", *hashed])) == [
        (2, "data-listing", "20 lines of data-file path + hash/size (e.g. images/00000.jpg)")]
    assert _found("\n".join(hashed[:19])) == []
    sized = [f"shard-{i}.parquet size 1234" for i in range(20)]
    assert _found("\n".join(sized)) == [
        (1, "data-listing", "20 lines of data-file path + hash/size (e.g. shard-0.parquet)")]
    assert _found("\n".join(f"images/{i:05d}.jpg" for i in range(30))) == []  # paths alone are no listing
    assert _found("\n".join(f"train/mod{i}.py {'cd' * 32}" for i in range(30))) == []  # not data files
    deep = "d" * 70 + "/x.png"
    assert _found("\n".join(f"{deep} {'ab' * 16}" for _ in range(20)))[0][2].endswith(f"(e.g. {deep[:60]})")


# --- trees -------------------------------------------------------------------------------------------------------

def test_a_walked_directory_skips_tool_caches_and_symlinks_in_sorted_order(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    for d in ("b", "a", ".venv", "__pycache__", "pkg.egg-info", "node_modules"):
        (root / d).mkdir(parents=True)
        (root / d / "f.txt").write_text("x\n")
    (root / "z.txt").write_text("x\n")
    (root / "link.txt").symlink_to(root / "z.txt")
    (root / "a" / "dirlink").symlink_to(root / "b")
    names = [str(p.relative_to(root)) for p, _ in files_to_scan([root])]
    assert names == ["z.txt", "a/f.txt", "b/f.txt"]
    assert [d for _, d in files_to_scan([root / "z.txt"])] == [str(root / "z.txt")]
    assert [d for _, d in files_to_scan([root / "link.txt"])] == [str(root / "link.txt")]  # named: scanned
    assert files_to_scan([root / "a" / "dirlink"]) == []  # a named link to a directory is not followed
    # ... and the paths named after it are still scanned
    assert [d for _, d in files_to_scan([root / "a" / "dirlink", root / "z.txt"])] == [str(root / "z.txt")]


def test_a_missing_path_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        files_to_scan([tmp_path / "gone"])
    assert str(err.value) == f"hygiene: no such file or directory: {tmp_path / 'gone'}"


def test_the_command_refuses_with_the_count_of_findings_files_and_scanned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ORCH_HYGIENE_HOSTS", raising=False)
    (tmp_path / "a.txt").write_text("key " + AWS + "\n" + HOME + "alice\n")
    (tmp_path / "b.txt").write_text("clean\n")
    (tmp_path / "c.txt").write_text("clean too\n")
    with pytest.raises(RefusedError) as err:
        hygiene_command([tmp_path])
    assert str(err.value) == ("hygiene: 2 finding(s) in 1 file(s) of 3 scanned; remove them (or keep them out of "
                              "git) before committing or publishing")
    assert err.value.document == {"ok": False, "scanned": 3, "findings": [
        {"path": str(tmp_path / "a.txt"), "line": 1, "kind": "credential",
         "detail": "AWS access key id: AKIA… (20 chars, redacted)"},
        {"path": str(tmp_path / "a.txt"), "line": 2, "kind": "private-path",
         "detail": "home directory path: " + HOME + "alice"}]}
    assert capsys.readouterr().out.splitlines() == [
        f"{tmp_path / 'a.txt'}:1: credential: AWS access key id: AKIA… (20 chars, redacted)",
        f"{tmp_path / 'a.txt'}:2: private-path: home directory path: {HOME}alice"]
    (tmp_path / "a.txt").unlink()
    assert hygiene_command([tmp_path]) == {"ok": True, "scanned": 2, "findings": []}
    assert capsys.readouterr().out == "hygiene: 2 file(s) scanned, nothing found\n"
    with pytest.raises(UsageError, match=r"^hygiene: give at least one file or directory to scan$"):
        hygiene_command([])


def test_findings_of_several_files_are_counted_per_file(tmp_path: Path) -> None:
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("key " + AWS + "\n")
    with pytest.raises(RefusedError, match=r"^hygiene: 2 finding\(s\) in 2 file\(s\) of 2 scanned;"):
        hygiene_command([tmp_path / "a.txt", tmp_path / "b.txt"])


def test_the_reward_rule_reads_json_values_not_only_keys() -> None:
    # a key without 'reward' whose value mentions it is no reward field
    assert _found("\n".join(json.dumps({"note": "reward"}) for _ in range(5))) == []


def test_a_git_tree_is_scanned_with_its_tracked_files_too(tmp_path: Path) -> None:
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "tracked.txt").write_text("key " + AWS + "\n")
    (tmp_path / "untracked.txt").write_text("key " + AWS + "\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.txt"], check=True)
    assert sorted(Path(p).name for p, _ in files_to_scan([tmp_path])) == [
        "tracked.txt", "untracked.txt"]


def test_only_the_first_max_text_bytes_of_a_file_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hy, "MAX_TEXT_BYTES", 64)
    (tmp_path / "early.txt").write_text("key " + AWS + "\n" + "x" * 100 + "\n")
    (tmp_path / "late.txt").write_text("x" * 100 + "\nkey " + AWS + "\n")
    assert [f.kind for f in scan_file(tmp_path / "early.txt", "early.txt", [])] == ["credential"]
    assert scan_file(tmp_path / "late.txt", "late.txt", []) == []


def test_a_trace_events_key_is_looked_for_in_the_first_mib_only() -> None:
    key = '"traceEvents": 1}'  # the quoted key is 13 characters
    mib = 1024 * 1024
    assert _found("{" + " " * (mib - 14) + key) == [(1, "profiler-trace", "chrome trace JSON (traceEvents)")]
    assert _found("{" + " " * (mib - 13) + key) == []


def test_the_command_prints_file_names_and_findings_as_plain_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # brackets in a file name are not markup, and a colour terminal gets no escape codes: the lines are grep-able
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("ORCH_HYGIENE_HOSTS", raising=False)
    named = tmp_path / "notes [bold]1[red] 2024.txt"
    named.write_text("key " + AWS + "\n")
    with pytest.raises(RefusedError):
        hygiene_command([named])
    assert capsys.readouterr().out == f"{named}:1: credential: AWS access key id: AKIA… (20 chars, redacted)\n"
    clean = tmp_path / "clean [x] 12.txt"
    clean.write_text("nothing\n")
    hygiene_command([clean])
    assert capsys.readouterr().out == "hygiene: 1 file(s) scanned, nothing found\n"
