"""Evidence hygiene (DESIGN.md section 8): finds what must never be committed, published or ledgered.

File kinds by name and magic bytes, credential patterns, machine paths, this host's names, data listings.

Decisions, documented here because they are policy:
- images (PNG/JPEG/WebP/GIF/BMP/TIFF, by magic bytes or name) are findings everywhere except under a `docs/`
  directory, where hand-curated figures of aggregate evidence live; a generated sample never belongs there;
- a directory inside a git work tree (and not itself git-ignored) is scanned as git would commit it:
  tracked plus untracked-but-not-ignored files; any other directory is walked whole, skipping only tool
  caches and virtual environments (.git, .venv, __pycache__, ...); a file named explicitly is always scanned;
- host names shorter than 4 characters and `localhost` are not searched (they are not identifying and would
  match ordinary words); more names to search can be given in $ORCH_HYGIENE_HOSTS (comma-separated);
- a finding about the whole file (a checkpoint, an image, a trace) is reported at line 1;
- detected secrets are never echoed: only their kind and first characters are shown.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from protocol.errors import RefusedError, UsageError

MAX_TEXT_BYTES = 32 * 1024 * 1024  # larger files are scanned by name and magic bytes only
MIN_HOST_NAME = 4
LISTING_MIN_LINES = 20  # this many data-file path + hash/size lines make a per-file listing
REWARD_MIN_LINES = 3

SKIP_DIRS = frozenset(
    {
        ".git",
        ".venv",
        "venv",
        "__pycache__",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".hypothesis",
        "node_modules",
        ".tox",
        ".nox",
    }
)
CHECKPOINT_EXTS = (".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".pkl", ".pickle", ".gguf", ".h5", ".hdf5")
TENSOR_EXTS = (".npy", ".npz")
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff")
TRACE_NAME = re.compile(r"(\.nsys-rep|\.qdrep|\.qdstrm|\.pt\.trace\.json(\.gz)?|\.trace\.json(\.gz)?|\.pftrace)$", re.I)
REWARD_NAME = re.compile(r"(reward.*trace|trace.*reward|rewards?\.jsonl)", re.I)
DATA_EXT = (
    r"jpe?g|png|webp|gif|bmp|tiff?|mp4|webm|avi|wav|flac|mp3|parquet|arrow|feather|tar|tfrecords?|npy|npz|"
    r"h5|hdf5|jsonl|zst|tgz|gz|zip|lance|pt|safetensors"
)
_DATA_PATH = re.compile(r"[\w.\-/]*[\w\-]\.(?:" + DATA_EXT + r")\b", re.I)
_HASH = re.compile(r"\b[0-9a-fA-F]{32,}\b")
_SIZE = re.compile(r"(?:size|bytes|len|length)\W{0,4}\d+|[,\t ]\d{2,}\s*[,}\]]?\s*$", re.I)

# Secret patterns: (kind detail, regex). The literal markers are split so that this file passes itself.
_CREDENTIALS: list[tuple[str, re.Pattern[str]]] = [
    ("private key (PEM)", re.compile("-----BEGIN (?:[A-Z0-9]+ )*" + "PRIVATE KEY(?: BLOCK)?-----")),
    ("AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b")),
    ("GitHub fine-grained token", re.compile(r"\bgithub_pat_[A-Za-z0-9_]{22,}\b")),
    ("Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("wandb API key", re.compile(r"WANDB_API_KEY\W{1,4}[0-9a-f]{40}\b|wandb\s+login\s+[0-9a-f]{40}\b", re.I)),
    ("wandb netrc entry", re.compile(r"machine\s+api\.wandb\.ai\s+login\s+\S+\s+password\s+[0-9a-f]{40}\b")),
    ("OpenAI-style secret key", re.compile(r"\bsk-(?:proj-|ant-|live-)?[A-Za-z0-9_\-]{20,}")),
    ("Slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}")),
    (
        "assigned secret",
        re.compile(
            r"(?i)\b(?:api[_-]?key|secret[_-]?key|client[_-]?secret|access[_-]?token|auth[_-]?token|password)"
            r"[\"']?\s*[:=]\s*[\"']([^\"'\s$<>{}()]{8,})[\"']"
        ),
    ),
]
_NOT_PATH_BEFORE = r"(?<![\w.~%/\\-])"
_PRIVATE_PATHS: list[tuple[str, re.Pattern[str]]] = [
    # each top folder in a (?:...) group, so that these patterns are not themselves such paths to a plain grep
    ("home directory path", re.compile(_NOT_PATH_BEFORE + r"/(?:home)/[A-Za-z0-9._-]+")),
    ("macOS home path", re.compile(_NOT_PATH_BEFORE + r"/(?:Users)/[A-Za-z0-9._-]+")),
    ("root home path", re.compile(_NOT_PATH_BEFORE + r"/(?:root)/[A-Za-z0-9._-]+")),
    ("machine work path", re.compile(_NOT_PATH_BEFORE + r"/(?:work)/[A-Za-z0-9._-]+")),
    ("Windows home path", re.compile(r"\b[A-Za-z]:\\\\?Users\\\\?[A-Za-z0-9._ -]+")),
]
_GENERIC_HOSTS = frozenset({"localhost", "localhost.localdomain", "localdomain", "ip6-localhost"})


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    kind: str
    detail: str

    def text(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.detail}"


def this_host_names(extra: Iterable[str] = ()) -> list[str]:
    """This host's names (full, short, FQDN) and $ORCH_HYGIENE_HOSTS, without generic or tiny names."""
    names = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
    names |= {n.strip() for n in os.environ.get("ORCH_HYGIENE_HOSTS", "").split(",")}
    names |= set(extra)
    return sorted(n for n in names if len(n) >= MIN_HOST_NAME and n.lower() not in _GENERIC_HOSTS)


def _redact(secret: str) -> str:
    return f"{secret[:4]}… ({len(secret)} chars, redacted)"


def _is_docs(display: str) -> bool:
    return "docs" in Path(display).parts[:-1]


def classify_bytes(name: str, head: bytes, zip_names: Sequence[str] | None = None) -> tuple[str, str] | None:
    """(kind, detail) of a file recognised by its magic bytes or name, or None for an ordinary file."""
    lower = name.lower()
    if head.startswith(b"PK\x03\x04") and zip_names is not None:
        torch_members = [n for n in zip_names if n.endswith("data.pkl") or n.startswith("archive/")]
        if torch_members:
            return "checkpoint", f"torch zip archive ({torch_members[0]})"
        if any(n.endswith(".npy") for n in zip_names):
            return "tensor", "numpy .npz archive"
    if len(head) >= 2 and head[0] == 0x80 and 1 <= head[1] <= 5:
        return "checkpoint", f"pickle stream (protocol {head[1]})"
    if head.startswith(b"\x93NUMPY"):
        return "tensor", "numpy .npy array"
    if len(head) >= 10 and head[8:10] == b'{"':
        (length,) = struct.unpack("<Q", head[:8])
        if 2 <= length <= 100 * 1024 * 1024:
            return "checkpoint", f"safetensors file (header {length} bytes)"
    if head.startswith(b"GGUF"):
        return "checkpoint", "GGUF model file"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "tensor", "HDF5 file"
    image = _image_magic(head)
    if image:
        return "image", f"{image} image"
    if lower.endswith(CHECKPOINT_EXTS):
        return "checkpoint", f"checkpoint/tensor file by name ({Path(lower).suffix})"
    if lower.endswith(TENSOR_EXTS):
        return "tensor", f"tensor file by name ({Path(lower).suffix})"
    if lower.endswith(IMAGE_EXTS):
        return "image", f"image file by name ({Path(lower).suffix})"
    if TRACE_NAME.search(lower):
        return "profiler-trace", "profiler trace by name"
    if REWARD_NAME.search(Path(lower).name):
        return "reward-trace", "reward trace by name"
    return None


def _image_magic(head: bytes) -> str | None:
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "WebP"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if head.startswith(b"BM") and len(head) >= 26 and head[6:10] == b"\x00\x00\x00\x00":
        return "BMP"
    if head.startswith((b"II*\x00", b"MM\x00*")):
        return "TIFF"
    return None


def _is_text(data: bytes) -> bool:
    if b"\x00" in data[:8192]:
        return False
    try:
        data[:8192].decode("utf-8")
    except UnicodeDecodeError as err:
        # a multi-byte character cut at the 8 KiB boundary is still text
        return err.start >= 8188
    return True


def scan_text(display: str, text: str, host_names: Sequence[str]) -> list[Finding]:
    """Findings in the lines of one text document (credentials, paths, host names, traces, listings)."""
    findings: list[Finding] = []
    lines = text.splitlines()
    host_res = [(h, re.compile(r"(?<![\w-])" + re.escape(h) + r"(?![\w-])", re.I)) for h in host_names]
    for number, line in enumerate(lines, start=1):
        for detail, pattern in _CREDENTIALS:
            m = pattern.search(line)
            if m:
                secret = m.group(m.lastindex or 0)
                findings.append(Finding(display, number, "credential", f"{detail}: {_redact(secret)}"))
                break
        for detail, pattern in _PRIVATE_PATHS:
            m = pattern.search(line)
            if m:
                findings.append(Finding(display, number, "private-path", f"{detail}: {m.group(0)[:60]}"))
                break
        for host, pattern in host_res:
            if pattern.search(line):
                findings.append(Finding(display, number, "host-name", f"this host's name {host!r}"))
                break
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")) and '"traceEvents"' in text[: 1024 * 1024]:
        findings.append(Finding(display, 1, "profiler-trace", "chrome trace JSON (traceEvents)"))
    findings += _reward_lines(display, lines)
    findings += _data_listing(display, lines)
    return findings


def _reward_lines(display: str, lines: Sequence[str]) -> list[Finding]:
    """JSON lines with a reward field, or a table with a reward column, are reward traces."""
    first = 0
    count = 0
    for number, line in enumerate(lines, start=1):
        s = line.strip()
        if not (s.startswith("{") and s.endswith("}")):
            continue
        try:
            obj = json.loads(s)
        except ValueError:
            continue
        if isinstance(obj, dict) and any("reward" in str(k).lower() for k in obj):
            count += 1
            first = first or number
    if count >= REWARD_MIN_LINES:
        return [
            Finding(display, first, "reward-trace", f"{count} JSON lines with a reward field (per sample or per step)")
        ]
    if lines and display.lower().endswith((".csv", ".tsv")):
        header = [c.strip().lower() for c in re.split(r"[,\t]", lines[0])]
        if any("reward" in c for c in header) and len(lines) > REWARD_MIN_LINES:
            return [Finding(display, 1, "reward-trace", f"table with a reward column, {len(lines) - 1} rows")]
    return []


def _data_listing(display: str, lines: Sequence[str]) -> list[Finding]:
    """Many lines that each pair a data file's path with a hash or a size: a per-file data listing."""
    first = 0
    count = 0
    example = ""
    for number, line in enumerate(lines, start=1):
        m = _DATA_PATH.search(line)
        if m and (_HASH.search(line) or _SIZE.search(line)):
            count += 1
            if not first:
                first, example = number, m.group(0)[:60]
    if count >= LISTING_MIN_LINES:
        return [
            Finding(display, first, "data-listing", f"{count} lines of data-file path + hash/size (e.g. {example})")
        ]
    return []


def scan_bytes(
    display: str, data: bytes, host_names: Sequence[str], zip_names: Sequence[str] | None = None
) -> list[Finding]:
    """Findings of one file's content (the whole file, or its first MAX_TEXT_BYTES)."""
    kind = classify_bytes(display, data[:64], zip_names)
    if kind is not None:
        if kind[0] == "image" and _is_docs(display):
            return []
        return [Finding(display, 1, kind[0], kind[1])]
    if not _is_text(data):
        return []
    return scan_text(display, data.decode("utf-8", errors="replace"), host_names)


def scan_file(path: Path, display: str, host_names: Sequence[str]) -> list[Finding]:
    with path.open("rb") as fh:
        data = fh.read(MAX_TEXT_BYTES)
    zip_names: list[str] | None = None
    if data.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as zf:
                zip_names = zf.namelist()
        except (zipfile.BadZipFile, OSError):
            zip_names = []
    return scan_bytes(display, data, host_names, zip_names)


def _git_files(directory: Path) -> list[Path] | None:
    """Files git would commit under `directory` (tracked + untracked-not-ignored), or None outside git."""

    def git(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["git", "-C", str(directory), *args], capture_output=True, check=False)

    try:
        inside = git("rev-parse", "--is-inside-work-tree")
    except FileNotFoundError:
        return None
    if inside.returncode != 0 or inside.stdout.strip() != b"true":
        return None
    if git("check-ignore", "-q", ".").returncode == 0:
        return None  # an ignored directory (e.g. a run directory) is scanned whole
    listed = git("ls-files", "-z", "-c", "-o", "--exclude-standard")
    if listed.returncode != 0:
        return None
    return [directory / p.decode() for p in listed.stdout.split(b"\x00") if p]


def _walk(directory: Path) -> list[Path]:
    out: list[Path] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        out += [Path(root) / f for f in sorted(files)]
    return out


def files_to_scan(paths: Sequence[Path]) -> list[tuple[Path, str]]:
    """(path, display name) of every file to scan; directories are expanded, symlinks are not followed."""
    out: list[tuple[Path, str]] = []
    for given in paths:
        if given.is_symlink() and not given.is_file():
            continue
        if given.is_file():
            out.append((given, str(given)))
        elif given.is_dir():
            listed = _git_files(given)
            for f in listed if listed is not None else _walk(given):
                if f.is_file() and not f.is_symlink():
                    out.append((f, str(f)))
        else:
            raise UsageError(f"hygiene: no such file or directory: {given}")
    return out


def scan_paths(paths: Sequence[Path], host_names: Sequence[str] | None = None) -> tuple[list[Finding], int]:
    """All findings under `paths` and the number of files scanned."""
    hosts = this_host_names() if host_names is None else list(host_names)
    files = files_to_scan(paths)
    findings: list[Finding] = []
    for path, display in files:
        findings += scan_file(path, display, hosts)
    return findings, len(files)


def hygiene_command(paths: Sequence[Path]) -> dict[str, Any]:
    """`orch hygiene PATH...`: one line per finding; RefusedError (exit 3) when anything is found."""
    if not paths:
        raise UsageError("hygiene: give at least one file or directory to scan")
    findings, scanned = scan_paths(paths)
    out = Console(highlight=False, soft_wrap=True)
    for f in findings:
        out.print(f.text(), markup=False)
    doc: dict[str, Any] = {"ok": not findings, "scanned": scanned,
                           "findings": [{"path": f.path, "line": f.line, "kind": f.kind, "detail": f.detail}
                                        for f in findings]}
    if findings:
        files = len({f.path for f in findings})
        raise RefusedError(
            f"hygiene: {len(findings)} finding(s) in {files} file(s) of {scanned} scanned; "
            "remove them (or keep them out of git) before committing or publishing", document=doc
        )
    out.print(f"hygiene: {scanned} file(s) scanned, nothing found", markup=False)
    return doc
