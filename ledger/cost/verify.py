"""Verifying a ledger file: every byte, the hash chain and each record's canonical JSON; the first bad seq named.

A vectorised pass (hashing shared with a forked child) decides most ledgers; the record-by-record pass explains.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, ValidationError

from ledger.cost.layout import Columns
from ledger.cost.orphans import empty_keys
from ledger.cost.record import GENESIS, canonical_json, record_class, record_from_row, record_message, schema_message
from ledger.cost.scan import UNPARSEABLE, decode_message, file_version, scan_messages

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


def verify_fast(
    cols: Columns | None, buf: Any, size: int, verify_chunk: int = VERIFY_CHUNK
) -> tuple[int, pa.Table] | None:
    """Vectorised verification; None unless every check passes (the slow path then says what is wrong).

    Each record's canonical JSON and Arrow message are hashed once (hashlib over the map, no copies), in
    chunks shared by this process and a forked child; the orphan keys are gathered while the child hashes.

    What it does not check, where the slow path does: that each record's columns equal its canonical JSON (only the
    last record is compared whole). A record's columns are pinned by the message digest in the next record's JSON,
    so columns that disagree with their JSON can only be written by recomputing every hash after them, which a
    forger who rewrites the JSON to agree does as well; a tree head recorded once they were written (orch's witness,
    `orch ledger verify --against`) catches both. Dictionary-encoding the orphan keys also decodes them: a key that
    is not UTF-8 sends the ledger to the slow path.
    """
    if cols is None:
        return None
    n = cols.n
    if n == 0:
        return 0, empty_keys()
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
    chunk = max(verify_chunk, -(-n // MAX_CHUNKS))
    view = memoryview(buf)
    keys: list[pa.Table] = []

    def gather_keys() -> bool:
        try:
            arrays = cols.arrows(["run_id", "package", "status"], dictionary=True)
        except UNPARSEABLE:
            return False  # damaged offsets: the slow path says where
        keys.append(pa.table({"seq": pa.array(np.arange(n)), **arrays}))
        return True

    def job(i: int) -> bool:
        return _chain_chunk(view, cols, size, i * chunk, min(n, (i + 1) * chunk))

    ok = _shared_chunks(-(-n // chunk), job, gather_keys)
    return (n, keys[0]) if ok else None


def verify_slow(buf: Any, size: int) -> tuple[dict[str, Any], list[bytes], pa.Table]:
    """Record by record, with pyarrow: the reference check that locates and explains every problem."""
    scan = scan_messages(buf, size)
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
            row = decode_message(raw, scan.version)
        except UNPARSEABLE:
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
