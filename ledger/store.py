"""The append-only, tamper-evident ledger: one Arrow IPC stream file, one record batch per record.

Appends hold an exclusive flock, fsync, and leave the file as it was on any error; verify checks every byte.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import itertools
import json
import mmap
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, ValidationError

from ledger import merkle
from ledger.accounting import encode, unclosed
from ledger.layout import CONTINUATION, Columns, frame, index_valid, layout
from ledger.record import (
    ASSIGNED,
    GENESIS,
    LATEST,
    VERSIONS,
    LedgerRecord,
    canonical_json,
    login_name,
    record_class,
    record_from_row,
    record_message,
    schema_message,
    schema_of,
    scrub_note,
    seal,
)
from protocol.errors import FailedError, UsageError
from protocol.home import resolve_home

__all__ = ["Ledger", "LedgerRecord", "TreeHead", "VerifyReport", "host_hash", "ledger_salt", "parse_head"]

SALT_FILE = "host.salt"
# what pyarrow and the decoding below raise on bytes that are not a ledger record
_UNPARSEABLE = (pa.ArrowException, OSError, ValueError, EOFError, KeyError, TypeError, IndexError)
MAX_PROBLEMS = 20  # a broken chain repeats; the first problems say where it broke
VERIFY_CHUNK = 8192  # records per hashing task: small enough to balance two processes, large enough to be cheap
MAX_CHUNKS = 16_000  # chunk ids travel through a pipe, 4 bytes each: they fit its 64 KiB buffer


class VerifyReport(BaseModel):
    """What `verify` found: ok, records that verified, the first bad seq, problems and orphaned packages."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    size: int  # records that parsed (the valid prefix)
    first_bad_seq: int | None = None
    problems: list[str] = []
    orphaned: list[tuple[str, str]] = []  # (run_id, package) opened and never closed
    torn_at: int | None = None  # byte offset where unparseable bytes begin
    bytes: int = 0

    @property
    def message(self) -> str:
        if self.ok:
            return f"ledger verifies: {self.size} records, {len(self.orphaned)} orphaned"
        where = "" if self.first_bad_seq is None else f" at seq {self.first_bad_seq}"
        return f"ledger does not verify{where}: {self.problems[0] if self.problems else 'unknown problem'}"


class TreeHead(BaseModel):
    """RFC 6962 signed-tree-head content without the signature: tree size and root hash (hex)."""

    model_config = ConfigDict(frozen=True)

    size: int
    root: str

    def __str__(self) -> str:
        return f"{self.size}:{self.root}"


def parse_head(text: str) -> TreeHead:
    """`SIZE:ROOT` as printed by `orch ledger head`."""
    size, sep, root = text.strip().partition(":")
    if not sep or not size.isdigit() or len(root) != 64 or any(c not in "0123456789abcdef" for c in root):
        raise UsageError(f"tree head {text!r} is not SIZE:ROOT (a record count and 64 hex digits)")
    return TreeHead(size=int(size), root=root)


def ledger_salt(ledger_dir: Path) -> str:
    """The random salt of this ledger directory, created once with mode 0600."""
    path = Path(ledger_dir) / SALT_FILE
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()  # another process created it first
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return path.read_text().strip()


def host_hash(salt: str | Path | None = None) -> str:
    """HMAC-SHA256 of this host's name keyed by a salt (a string, or a ledger directory holding one).

    Without an argument the salt of the default home's ledger directory is used; the name never leaves clear.
    """
    if salt is None:
        salt = ledger_salt(resolve_home().ledger_dir)
    elif isinstance(salt, Path):
        salt = ledger_salt(salt)
    return hmac.new(salt.encode(), socket.gethostname().encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class _Scan:
    """The messages of a ledger file: their spans, where parsing stopped, and any schema problem."""

    spans: list[tuple[int, int]]
    end: int  # first byte not part of a complete message
    schema_problem: str | None
    version: int = LATEST


def file_version(buf: Any, size: int) -> int:
    """The record version of a ledger file from its schema message (the latest for an empty file)."""
    for version in VERSIONS:
        msg = schema_message(version)
        if size >= len(msg) and bytes(buf[: len(msg)]) == msg:
            return version
    return LATEST


def _decode(raw: Any, version: int = LATEST) -> dict[str, Any]:
    """One record message decoded by pyarrow into a row dict; raises on anything else."""
    msg = pa.ipc.read_message(pa.py_buffer(raw))
    if msg is None or msg.type != "record batch" or len(msg.serialize()) != len(raw):
        raise ValueError("not one complete record batch message")
    batch = pa.ipc.read_record_batch(msg, schema_of(version))
    batch.validate(full=True)
    if batch.num_rows != 1:
        raise ValueError(f"a record batch of {batch.num_rows} rows")
    row: dict[str, Any] = batch.to_pylist()[0]
    return row


def _message_len(buf: Any, pos: int, end: int) -> int | None:
    """Length of the complete IPC message at pos, or None when the bytes there are not one."""
    try:
        reader = pa.BufferReader(pa.py_buffer(buf[pos:end]))
        msg = pa.ipc.read_message(reader)
    except _UNPARSEABLE:
        return None
    if msg is None:
        return None
    return int(reader.tell())


def _scan(buf: Any, size: int) -> _Scan:
    """Frame every complete record message; fast framing first, then pyarrow from where it stopped."""
    if size == 0:
        return _Scan([], 0, None)
    schema_len = _message_len(buf, 0, size)
    if schema_len is None:
        return _Scan([], 0, "the schema message does not parse")
    problem = None
    version = LATEST
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(buf[:schema_len]))
        known = [v for v in VERSIONS if schema.equals(schema_of(v), check_metadata=True)]
        if known:
            version = known[0]
        else:
            problem = "the file's Arrow schema is not the ledger schema"
    except _UNPARSEABLE:
        problem = "the schema message does not parse"
    spans: list[tuple[int, int]] = []
    pos = schema_len
    lay = layout(version)
    if lay is not None and problem is None:
        starts = frame(buf, pos, size, lay)[0].tolist()
        # the last framed message may be torn inside: only trust the ones followed by another
        spans = list(itertools.pairwise(starts))
        if spans:
            pos = spans[-1][1]
    while pos < size:
        n = _message_len(buf, pos, size)
        if n is None:
            break
        try:
            _decode(buf[pos : pos + n], version)
        except _UNPARSEABLE:
            break
        spans.append((pos, pos + n))
        pos += n
    return _Scan(spans, pos, problem, version)


class Ledger:
    """The ledger file at `path` (normally Home.ledger_path); `fsync=False` only for tests that need speed.

    `verify_chunk` (records per hashing task of verify) is a parameter so tests can exercise the two-process path.
    """

    def __init__(self, path: Path, *, fsync: bool = True, verify_chunk: int = VERIFY_CHUNK) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.verify_chunk = verify_chunk
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.tail_path = self.path.with_name(self.path.name + ".tail")
        self.index_path = self.path.with_name(self.path.name + ".idx")  # int64 message offsets: a checked cache

    # ---- locking and mapping ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[tuple[Any, int]]:
        """The ledger bytes (read-only map) and their count, read under a shared lock.

        A ledger that does not exist reads empty and nothing is created (reading never makes a home).
        """
        if not self.path.exists():
            yield b"", 0
            return
        with self._locked(exclusive=False):
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                yield b"", 0
                return
            try:
                size = os.fstat(fd).st_size
                if size == 0:
                    yield b"", 0
                    return
                mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
                try:
                    yield mm, size
                finally:
                    with contextlib.suppress(BufferError):
                        mm.close()  # NumPy views still alive: the map closes when they are collected
            finally:
                os.close(fd)

    def host_hash(self) -> str:
        """This host's name hashed with this ledger directory's salt."""
        return host_hash(self.path.parent)

    # ---- append -------------------------------------------------------------------------------------

    def append(self, **fields: Any) -> LedgerRecord:
        """Append one record; seq, prev_hash, prev_message_sha256 and record_hash are assigned here.

        Raises UsageError for an invalid record and FailedError when the ledger cannot be written
        (the file is then exactly as it was) or has a torn tail (run `orch ledger repair`).
        """
        for name in ASSIGNED:
            if name in fields:
                raise UsageError(f"ledger field {name} is assigned by the ledger, not by the caller")
        if fields.get("host") is None:
            fields["host"] = self.host_hash()
        if fields.get("user") is None:
            fields["user"] = login_name()
        if isinstance(fields.get("note"), str):
            fields["note"] = scrub_note(fields["note"])
        with self._locked(exclusive=True):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                head = max(len(schema_message(v)) for v in VERSIONS)
                version = file_version(os.pread(fd, head, 0), size) if size else LATEST
                if version == 1:
                    fields.pop("user", None)  # a version 1 ledger keeps version 1 records: its schema has no user
                seq, prev_hash, prev_message, _ = self._tail(fd, size, version)
                self._refuse_truncated(seq)
                try:
                    record = seal({**fields, "seq": seq, "prev_hash": prev_hash, "prev_message_sha256": prev_message},
                                  version)
                except ValidationError as err:
                    first = err.errors()[0]
                    where = ".".join(str(x) for x in first["loc"])
                    raise UsageError(f"ledger record refused: {where}: {first['msg']}") from None
                message = record_message(record)
                data = (schema_message(version) if size == 0 else b"") + message
                self._write(fd, size, data)
            finally:
                os.close(fd)
            new_size = size + len(data)
            self._write_tail_hint(new_size, new_size - len(message), seq + 1)
            self._extend_index(seq, new_size - len(message))
        return record

    def _write(self, fd: int, size: int, data: bytes) -> None:
        """Write at `size` and fsync; on any failure truncate back to `size`, so no half record remains."""
        try:
            view = memoryview(data)
            offset = size
            while view:
                written = os.pwrite(fd, view, offset)
                view = view[written:]
                offset += written
            if self.fsync:
                os.fsync(fd)
                if size == 0:
                    _fsync_dir(self.path.parent)
        except BaseException as err:
            restored = True
            try:
                os.ftruncate(fd, size)
                os.fsync(fd)
            except OSError:
                restored = False
            if not isinstance(err, OSError):
                raise
            state = f"left as it was ({size} bytes)" if restored else "NOT restored; run `orch ledger verify`"
            raise FailedError(f"ledger write failed ({err.strerror or err}); the ledger is {state}; "
                              "free disk space or fix permissions and retry") from err

    def _tail(self, fd: int, size: int, version: int = LATEST) -> tuple[int, str, str, int | None]:
        """(next seq, last record_hash, sha256 of the last message, its offset) of the file behind fd."""
        if size == 0:
            return 0, GENESIS, hashlib.sha256(schema_message(version)).hexdigest(), None
        hint = self._read_tail_hint()
        if hint is not None and hint.get("size") == size and isinstance(hint.get("offset"), int):
            offset = int(hint["offset"])
            raw = os.pread(fd, size - offset, offset)
            try:
                row = _decode(raw, version)
                if int(row["seq"]) == int(hint.get("records", -1)) - 1:
                    return int(row["seq"]) + 1, str(row["record_hash"]), hashlib.sha256(raw).hexdigest(), offset
            except _UNPARSEABLE:
                pass  # a stale or wrong hint: scan the file
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            scan = _scan(mm, size)
            if scan.schema_problem:
                raise FailedError(f"ledger {self.path.name}: {scan.schema_problem}; nothing appended; "
                                  "run `orch ledger verify`")
            if scan.end != size:
                raise FailedError(
                    f"ledger {self.path.name} has a torn tail ({size - scan.end} bytes at offset {scan.end} "
                    "do not parse); nothing appended; run `orch ledger verify`, then `orch ledger repair`"
                )
            if not scan.spans:
                return 0, GENESIS, hashlib.sha256(bytes(mm[:size])).hexdigest(), None
            start, end = scan.spans[-1]
            raw = bytes(mm[start:end])
        row = _decode(raw, scan.version)
        return int(row["seq"]) + 1, str(row["record_hash"]), hashlib.sha256(raw).hexdigest(), start

    def _refuse_truncated(self, records: int) -> None:
        """The hint counts every record ever appended; a file holding fewer lost records: never append (which
        would lower the count and hide the loss), so the truncation stays visible to `verify`."""
        hint = self._read_tail_hint()
        appended = hint.get("records") if hint is not None else None
        if isinstance(appended, int) and appended > records:
            raise FailedError(
                f"ledger {self.path.name} holds {records} records but {appended} were appended "
                f"({self.tail_path.name}): it was truncated; nothing appended; restore the ledger from a copy"
            )

    def _read_tail_hint(self) -> dict[str, Any] | None:
        try:
            hint = json.loads(self.tail_path.read_text())
        except (OSError, ValueError):
            return None
        return hint if isinstance(hint, dict) else None

    def _write_tail_hint(self, size: int, offset: int, records: int) -> None:
        """A cache of where the last record starts (and how many records were ever appended); never trusted."""
        tmp = self.tail_path.with_name(self.tail_path.name + f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps({"size": size, "offset": offset, "records": records}))
            os.replace(tmp, self.tail_path)
        except OSError:  # e.g. a full disk: a cache, so the append stands; no temporary file is left
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)

    def _extend_index(self, seq: int, offset: int) -> None:
        """Add the new message's offset to the index when it holds exactly the earlier ones, else drop it."""
        with contextlib.suppress(OSError):
            try:
                entries = self.index_path.stat().st_size // 8
            except FileNotFoundError:
                entries = 0 if seq == 0 else -1
            if entries != seq:
                self.index_path.unlink(missing_ok=True)
                return
            fd = os.open(self.index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, int(offset).to_bytes(8, "little"))
            finally:
                os.close(fd)

    # ---- reading ------------------------------------------------------------------------------------

    def _columns(self, buf: Any, size: int) -> Columns | None:
        """Fast column access when the whole file frames with this pyarrow's layout.

        Framing starts from the offset index when the index checks out against the bytes (vectorised),
        frames the rest message by message, and rewrites the index when it had to frame more than it held.
        """
        version = file_version(buf, size)
        lay = layout(version)
        schema = schema_message(version)
        if lay is None or size < len(schema) or bytes(buf[: len(schema)]) != schema:
            return None
        try:
            known = np.fromfile(self.index_path, dtype="<i8")
        except (OSError, ValueError):
            known = np.zeros(0, dtype=np.int64)
        known = known[known < size]
        if not index_valid(buf, size, known, len(schema), lay):
            known = np.zeros(0, dtype=np.int64)
        resume = len(schema) if len(known) == 0 else int(known[-1])
        rest, stop = frame(buf, resume, size, lay)
        if stop != size:
            return None
        starts = np.concatenate([known[:-1], rest]) if len(known) else rest
        if len(rest) > 1:
            tmp = self.index_path.with_name(f"{self.index_path.name}.{os.getpid()}.tmp")
            try:
                starts.astype("<i8").tofile(tmp)
                os.replace(tmp, self.index_path)
            except OSError:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
        return Columns(buf, size, starts, lay)

    def table(self, columns: list[str] | None = None, *, dictionary: bool = False) -> pa.Table:
        """The complete records as an Arrow table of the named columns (all when None).

        `dictionary=True` may return string columns dictionary-encoded (same values): what accounting groups on.
        """
        with self._mapped() as (buf, size):
            schema = schema_of(file_version(buf, size))
            names = columns or schema.names
            cols = self._columns(buf, size) if size else None
            if cols is not None:
                arrays = cols.arrows(names, dictionary=dictionary)
                if dictionary:
                    return pa.table([arrays[n] for n in names], names=names)
                return pa.table([arrays[n] for n in names], schema=pa.schema([schema.field(n) for n in names]))
            scan = _scan(buf, size)
            if not scan.spans or scan.schema_problem:
                return schema.empty_table().select(names)
            prefix = pa.py_buffer(bytes(buf[: scan.spans[-1][1]]))
            return pa.ipc.open_stream(prefix).read_all().select(names)

    def column_names(self) -> list[str]:
        """The columns of this ledger's record version (the latest for a ledger not yet written)."""
        with self._mapped() as (buf, size):
            return list(schema_of(file_version(buf, size)).names)

    def version(self) -> int:
        """The record version of this ledger file (the latest for a ledger not yet written)."""
        with self._mapped() as (buf, size):
            return file_version(buf, size)

    def records(self, run_id: str | None = None) -> list[LedgerRecord]:
        """The complete records in ledger order (only those of `run_id` when given)."""
        with self._mapped() as (buf, size):
            version = file_version(buf, size)
            cols = self._columns(buf, size) if size else None
            if cols is not None:
                chosen = np.arange(cols.n)
                if run_id is not None:
                    ids = cols.arrow("run_id")
                    chosen = np.flatnonzero(pc.equal(ids, run_id).fill_null(False).to_numpy(zero_copy_only=False))
                ends = [*cols.starts[1:].tolist(), size]
                starts = cols.starts.tolist()
                spans = [(starts[i], ends[i]) for i in chosen.tolist()]
            else:
                spans = _scan(buf, size).spans
            out = []
            for i, (start, end) in enumerate(spans):
                row = _decode_or_fail(buf, start, end, i, version)
                if run_id is None or row["run_id"] == run_id:
                    out.append(record_from_row(row))
            return out

    def orphans(self) -> list[tuple[str, str]]:
        """(run_id, package) of open records never closed, in ledger order (no verification: see `verify`)."""
        return _orphans(self.table(["seq", "run_id", "package", "status"], dictionary=True))

    # ---- integrity ----------------------------------------------------------------------------------

    def verify(self, against: TreeHead | None = None) -> VerifyReport:
        """Check schema, seq, hash chain, message digests and every byte; name the first bad seq."""
        with self._mapped() as (buf, size):
            fast = self._verify_fast(buf, size) if size else None
            if fast is not None:
                n, keys = fast
                report: dict[str, Any] = {"ok": True, "size": n, "problems": []}
                # leaves only for a consistency proof: 1M digests are not free
                record_hashes = self._record_hashes_of(buf, size) if against is not None else []
            else:
                report, record_hashes, keys = self._verify_slow(buf, size)
        report["bytes"] = size
        hint = self._read_tail_hint()
        if hint is not None and isinstance(hint.get("records"), int) and hint["records"] > report["size"]:
            report["problems"].append(
                f"truncated: {hint['records']} records were appended but {report['size']} complete records remain"
            )
            report["ok"] = False
            if report.get("first_bad_seq") is None:
                report["first_bad_seq"] = report["size"]
        if against is not None:
            leaves = [merkle.leaf_hash(h) for h in record_hashes]
            if not _consistent(leaves, against):
                report["ok"] = False
                report["problems"].append(
                    f"not an extension of tree head {against}: the ledger has {len(leaves)} records "
                    "and no consistency proof to that head verifies"
                )
        report["orphaned"] = _orphans(keys)
        report["problems"] = report["problems"][:MAX_PROBLEMS]
        return VerifyReport(**report)

    def _verify_fast(self, buf: Any, size: int) -> tuple[int, pa.Table] | None:
        """Vectorised verification; None unless every check passes (the slow path then says what is wrong).

        Each record's canonical JSON and Arrow message are hashed once (hashlib over the map, no copies), in
        chunks shared by this process and a forked child; the orphan keys are gathered while the child hashes.
        """
        cols = self._columns(buf, size)
        if cols is None:
            return None
        n = cols.n
        if n == 0:
            return 0, _keys_empty()
        try:
            got = cols.part(0, 1).extract(["prev_hash", "prev_message_sha256"])
            ph0, pm0 = cols.part(0, 1).hex64(got["prev_hash"], got["prev_message_sha256"])
        except (ValueError, IndexError):
            return None
        version = file_version(buf, size)
        genesis_message = hashlib.sha256(schema_message(version)).hexdigest().encode()
        if ph0.tobytes() != GENESIS.encode() or pm0.tobytes() != genesis_message:
            return None
        # the last message is pinned by no later digest: it must be the canonical serialization of its record
        try:
            last = cols.part(n - 1, n).extract(["canonical", "record_hash"])
            rh_last = cols.part(n - 1, n).hex64(last["record_hash"])[0].tobytes().decode()
            _, c_start, c_len, _ = last["canonical"]
            canonical = bytes(buf[int(c_start[0]) : int(c_start[0] + c_len[0])])
            record = record_class(version).model_validate({**json.loads(canonical), "record_hash": rh_last})
        except (ValueError, IndexError, ValidationError):
            return None
        if record_message(record) != bytes(buf[int(cols.starts[-1]) : size]):
            return None
        chunk = max(self.verify_chunk, -(-n // MAX_CHUNKS))
        view = memoryview(buf)
        keys: list[pa.Table] = []

        def gather_keys() -> bool:
            try:
                arrays = cols.arrows(["run_id", "package", "status"], dictionary=True)
            except _UNPARSEABLE:
                return False  # damaged offsets: the slow path says where
            keys.append(pa.table({"seq": pa.array(np.arange(n)), **arrays}))
            return True

        def job(i: int) -> bool:
            return _chain_chunk(view, cols, size, i * chunk, min(n, (i + 1) * chunk))

        ok = _shared_chunks(-(-n // chunk), job, gather_keys)
        return (n, keys[0]) if ok else None

    def _verify_slow(self, buf: Any, size: int) -> tuple[dict[str, Any], list[bytes], pa.Table]:
        """Record by record, with pyarrow: the reference check that locates and explains every problem."""
        scan = _scan(buf, size)
        problems: list[str] = []
        bad: list[int] = []

        def flag(seq: int, text: str) -> None:
            bad.append(seq)
            problems.append(f"seq {seq}: {text}")

        if scan.schema_problem:
            flag(0, scan.schema_problem)
        prev_hash = GENESIS
        prev_message = hashlib.sha256(bytes(buf[: scan.spans[0][0]] if scan.spans else b"")).hexdigest()
        hashes: list[bytes] = []
        rows: list[tuple[int, str, str, str]] = []
        for i, (start, end) in enumerate(scan.spans):
            raw = bytes(buf[start:end])
            try:
                row = _decode(raw, scan.version)
            except _UNPARSEABLE:
                flag(i, f"the message at offset {start} does not decode as a ledger record")
                prev_hash, prev_message = "", hashlib.sha256(raw).hexdigest()
                continue
            canonical = row.pop("canonical")
            try:
                record = record_from_row(row)
            except ValidationError as err:
                flag(i, f"schema: {err.errors()[0]['loc']}: {err.errors()[0]['msg']}")
                record = None
            if row.get("seq") != i:
                flag(i, f"seq field is {row.get('seq')}, expected {i} (records reordered, lost or inserted)")
            if record is not None and canonical != canonical_json(record.hashed_fields()):
                flag(i, "the columns differ from the record's canonical JSON")
            if hashlib.sha256(str(canonical).encode()).hexdigest() != row.get("record_hash"):
                flag(i, "record_hash is not the SHA256 of the canonical JSON")
            in_place = row.get("seq") == i and row.get("prev_hash") == prev_hash
            if row.get("prev_hash") != prev_hash:
                flag(i, "prev_hash does not chain to the previous record")
            claimed = row.get("prev_message_sha256")
            if hashlib.sha256(str(canonical).encode()).hexdigest() == row.get("record_hash"):
                # an intact canonical JSON holds the digest as appended, even when the column was altered
                with contextlib.suppress(ValueError, AttributeError):
                    claimed = json.loads(str(canonical)).get("prev_message_sha256", claimed)
            if claimed != prev_message and in_place:
                # this record sits where it was appended, so the bytes before it were altered
                flag(max(i - 1, 0), f"message bytes differ from what was appended (digest in record {i})")
            if i == len(scan.spans) - 1 and record is not None and record_message(record) != raw:
                flag(i, "the last message's bytes are not its record's serialization")
            prev_hash = str(row.get("record_hash"))
            prev_message = hashlib.sha256(raw).hexdigest()
            with contextlib.suppress(ValueError, TypeError):
                hashes.append(bytes.fromhex(str(row.get("record_hash"))))
            rows.append((i, str(row.get("run_id")), str(row.get("package")), str(row.get("status"))))
        n = len(scan.spans)
        torn_at = None
        if scan.end != size:
            torn_at = scan.end
            flag(n, f"torn tail: {size - scan.end} bytes at offset {scan.end} do not parse as a complete record; "
                    "run `orch ledger repair` to move them aside")
        order = sorted(range(len(problems)), key=lambda k: bad[k])
        report = {
            "ok": not problems, "size": n, "problems": [problems[k] for k in order],
            "first_bad_seq": min(bad) if bad else None, "torn_at": torn_at,
        }
        names = ["seq", "run_id", "package", "status"]
        keys = pa.table([pa.array([r[k] for r in rows], pa.int64() if k == 0 else pa.string()) for k in range(4)],
                        names=names)
        return report, hashes, keys

    def record_hashes(self) -> list[bytes]:
        """The record hashes (32 bytes each) of the complete records, in ledger order: the Merkle leaves' data."""
        with self._mapped() as (buf, size):
            return self._record_hashes_of(buf, size)

    def _record_hashes_of(self, buf: Any, size: int) -> list[bytes]:
        cols = self._columns(buf, size) if size else None
        if cols is not None:
            with contextlib.suppress(ValueError):
                return _hashes(cols.hex64(cols.extract(["record_hash"])["record_hash"])[0])
        scan = _scan(buf, size)
        return [bytes.fromhex(str(_decode_or_fail(buf, s, e, i, scan.version)["record_hash"]))
                for i, (s, e) in enumerate(scan.spans)]

    def head(self) -> TreeHead:
        """RFC 6962 tree head over the record hashes of the complete records."""
        leaves = [merkle.leaf_hash(h) for h in self.record_hashes()]
        return TreeHead(size=len(leaves), root=merkle.root(leaves).hex())

    def consistency(self, old_size: int, old_root: str) -> bool:
        """True when the head (old_size, old_root) is a prefix of this ledger, by an RFC 6962 consistency proof."""
        leaves = [merkle.leaf_hash(h) for h in self.record_hashes()]
        return _consistent(leaves, TreeHead(size=old_size, root=old_root))

    # ---- repair -------------------------------------------------------------------------------------

    def repair(self) -> Path | None:
        """Move a torn tail aside into `<ledger>.torn-<time>-<offset>` and cut it off; None if there is none.

        Refuses when a complete record follows the unparseable bytes: that is damage, not a torn append.
        """
        with self._locked(exclusive=True):
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                return None
            try:
                size = os.fstat(fd).st_size
                if size == 0:
                    return None
                with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
                    scan = _scan(mm, size)
                    if scan.end == size:
                        return None
                    later = _complete_message_after(mm, scan.end, size, scan.version)
                    if later is not None:
                        raise FailedError(
                            f"ledger {self.path.name}: bytes at offset {scan.end} do not parse but a complete "
                            f"record follows at offset {later}; this is damage inside the ledger, not a torn "
                            "tail; nothing was changed: restore the ledger from a copy"
                        )
                    torn = bytes(mm[scan.end : size])
                stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
                aside = self.path.with_name(f"{self.path.name}.torn-{stamp}-{scan.end}")
                with open(aside, "xb") as f:
                    f.write(torn)
                    f.flush()
                    os.fsync(f.fileno())
                _fsync_dir(self.path.parent)
                os.ftruncate(fd, scan.end)
                os.fsync(fd)
            finally:
                os.close(fd)
        return aside


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _complete_message_after(buf: Any, start: int, size: int, version: int) -> int | None:
    """Offset of a decodable record message beginning after `start`, if any."""
    marker = CONTINUATION.to_bytes(4, "little")
    pos = bytes(buf[start:size]).find(marker, 1)
    while pos != -1:
        at = start + pos
        n = _message_len(buf, at, size)
        if n is not None:
            try:
                _decode(buf[at : at + n], version)
                return at
            except _UNPARSEABLE:
                pass
        pos = bytes(buf[start:size]).find(marker, pos + 1)
    return None


def _chain_chunk(view: memoryview, cols: Columns, size: int, lo: int, hi: int) -> bool:
    """Records lo..hi-1: seq, record_hash = SHA256(canonical), and the next record's prev_hash and
    prev_message_sha256 equal to this record's hash and message digest (the ledger's last message excepted)."""
    top = min(hi + 1, cols.n)  # one record past the chunk holds the digests that pin its last message
    part = cols.part(lo, top)
    try:
        got = part.extract(["seq", "record_hash", "prev_hash", "prev_message_sha256", "canonical"])
        _, seq, _ = got["seq"]
        rh, ph, pm = part.hex64(got["record_hash"], got["prev_hash"], got["prev_message_sha256"])
        _, c_start, c_len, c_valid = got["canonical"]
    except (ValueError, IndexError):
        return False
    if not np.array_equal(seq, np.arange(lo, top)) or not c_valid.all():
        return False
    sha = hashlib.sha256
    c_lo = c_start[: hi - lo].tolist()
    c_hi = (c_start + c_len)[: hi - lo].tolist()
    canon = b"".join([sha(view[a:b]).digest() for a, b in zip(c_lo, c_hi, strict=True)])
    if canon.hex().encode() != rh[: hi - lo].tobytes():
        return False
    bounds = part.starts.tolist() if top > hi else [*part.starts.tolist(), size]
    m_lo, m_hi = bounds[:-1][: top - lo - 1], bounds[1:][: top - lo - 1]
    msgs = b"".join([sha(view[a:b]).digest() for a, b in zip(m_lo, m_hi, strict=True)])
    return msgs.hex().encode() == pm[1:].tobytes() and ph[1:].tobytes() == rh[:-1].tobytes()


def _shared_chunks(count: int, job: Callable[[int], bool], meanwhile: Callable[[], bool]) -> bool:
    """True when job(i) holds for every chunk i; chunks are taken from a pipe by this process and, on 2+ cores,
    a forked child (which only reads the shared map), after this process has run `meanwhile` (it must hold too).

    Chunk states live in a shared anonymous map; any chunk the child did not finish is done here.
    """
    if count < 4 or (os.cpu_count() or 1) < 2:
        return meanwhile() and all(_holds(job, i) for i in range(count))
    state = mmap.mmap(-1, count + 1)  # per chunk 0 = not done, 1 = ok, 2 = bad; the last byte: stop
    r, w = os.pipe()
    os.set_blocking(w, False)
    with contextlib.suppress(BlockingIOError):
        os.write(w, np.arange(count, dtype="<u4").tobytes())  # ids the pipe cannot hold are done below
    os.close(w)
    hashlib.sha256(b"").digest()  # OpenSSL's digest lookup happens here, not first in the child
    pid = os.fork()
    if pid == 0:
        try:
            _take_chunks(r, job, state, count)
        finally:
            os._exit(0)
    try:
        if not meanwhile():
            state[count] = 1
        _take_chunks(r, job, state, count)
    finally:
        os.close(r)
        _reap(pid)
    for i in range(count):
        if state[count] == 0 and state[i] == 0:
            state[i] = 1 if _holds(job, i) else 2
    ok = state[count] == 0 and all(state[i] == 1 for i in range(count))
    state.close()
    return ok


def _holds(job: Callable[[int], bool], i: int) -> bool:
    """job(i), False when damaged bytes make it raise: the fast path then gives way to the slow one."""
    try:
        return job(i)
    except (ValueError, IndexError, OverflowError, TypeError):
        return False


def _take_chunks(fd: int, job: Callable[[int], bool], state: mmap.mmap, count: int) -> None:
    """Run the chunks whose ids this process reads from the pipe (4 bytes each, reads are atomic) until it is empty."""
    while state[count] == 0:
        raw = os.read(fd, 4)
        if len(raw) != 4:
            return
        i = int.from_bytes(raw, "little")
        good = _holds(job, i)
        state[i] = 1 if good else 2
        if not good:
            state[count] = 1  # one bad chunk fails the fast path: stop both processes early


def _reap(pid: int, grace_s: float = 60.0) -> None:
    """Wait for the hashing child; kill it if it is stuck (its unfinished chunks are then redone here)."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.002)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _hashes(hex_rows: np.ndarray) -> list[bytes]:
    """32-byte digests from an (n, 64) matrix of hex characters."""
    data = bytes.fromhex(hex_rows.tobytes().decode())
    return [data[i : i + 32] for i in range(0, len(data), 32)]


def _decode_or_fail(buf: Any, start: int, end: int, seq: int, version: int) -> dict[str, Any]:
    try:
        return _decode(buf[start:end], version)
    except _UNPARSEABLE as err:
        raise FailedError(f"ledger record {seq} does not decode ({err}); run `orch ledger verify`") from err


def _consistent(leaves: list[bytes], head: TreeHead) -> bool:
    if head.size > len(leaves):
        return False
    proof = merkle.consistency_proof(leaves, head.size)
    return merkle.verify_consistency(head.size, len(leaves), bytes.fromhex(head.root), merkle.root(leaves), proof)


def _keys_empty() -> pa.Table:
    return pa.table({"seq": pa.array([], pa.int64()), "run_id": pa.array([], pa.string()),
                     "package": pa.array([], pa.string()), "status": pa.array([], pa.string())})


def _orphans(keys: pa.Table) -> list[tuple[str, str]]:
    """(run_id, package) of open records with no later close of the same package in the same run."""
    if keys.num_rows == 0:
        return []
    run, runs = encode(keys["run_id"])
    package, packages = encode(keys["package"])
    status, statuses = encode(keys["status"])
    is_open = np.append(np.array([v == "open" for v in statuses.to_pylist()], dtype=bool), False)[status]
    seq = keys["seq"].combine_chunks().to_numpy(zero_copy_only=False).astype(np.int64)
    left = np.flatnonzero(unclosed(run, package, len(packages), is_open, seq))
    left = left[np.argsort(seq[left], kind="stable")]
    return list(zip(runs.take(pa.array(run[left])).to_pylist(), packages.take(pa.array(package[left])).to_pylist(),
                    strict=True))
