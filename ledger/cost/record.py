"""One ledger record: its validated model, its canonical JSON and hash, and its Arrow IPC message bytes.

A record is stored as one Arrow record batch of one row; the `canonical` column holds the hashed JSON.
Version 2 (new ledgers) adds `user` and stores times as timestamp[us, UTC]; version 1 ledgers keep their records.
"""

from __future__ import annotations

import hashlib
import math
import os
import pwd
import re
import socket
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from protocol.hashing import canonical_json as dumps_canonical

FORMAT = "orch.ledger/1"
FORMAT_V2 = "orch.ledger/2"
VERSIONS = (1, 2)
LATEST = 2
GENESIS = "0" * 64
INT64_MAX = 2**63 - 1
KINDS = ("checks", "prime", "train", "reload", "replay", "score", "audit", "run", "calibration")
# an audit record's status is its verdict (the audit ran; the summary counts it as ok); "noisy" from older audits
VERDICTS = ("accepted", "noisy", "no difference shown", "not exact")
STATUSES = ("open", "ok", "failed", "timeout", "interrupted", "not-run", *VERDICTS)
FAILURES = ("failed", "timeout", "interrupted")
NOTE_MAX = 200
# fields that append() assigns; a caller never passes them
ASSIGNED = ("seq", "prev_hash", "prev_message_sha256", "record_hash")

HEX64 = r"^[0-9a-f]{64}$"
USER = r"^[^\s/:]{1,64}$"  # a login name: no spaces, no paths
TOKEN = r"^[A-Za-z0-9._:+-]{1,128}$"  # ids and digests: no spaces, no slashes, no paths
_HOME_PATH = re.compile(r"(/(?:home|Users)/|/(?:root)(?:/|\b))[^\s/'\"]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# column order of the Arrow schema; `canonical` (the hashed JSON) comes last
ARROW_FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("seq", pa.int64()),
    ("run_id", pa.string()),
    ("package", pa.string()),
    ("kind", pa.string()),
    ("arm", pa.string()),
    ("status", pa.string()),
    ("started", pa.string()),
    ("ended", pa.string()),
    ("wall_s", pa.float64()),
    ("gpus", pa.int64()),
    ("gpu_seconds", pa.float64()),
    ("lock_wait_s", pa.float64()),
    ("host", pa.string()),
    ("protocol_id", pa.string()),
    ("sources_root", pa.string()),
    ("result_digest", pa.string()),
    ("peak_allocated", pa.int64()),
    ("peak_reserved", pa.int64()),
    ("exit_code", pa.int64()),
    ("note", pa.string()),
    ("prev_hash", pa.string()),
    ("prev_message_sha256", pa.string()),
    ("record_hash", pa.string()),
    ("canonical", pa.string()),
)
NON_NULL = ("seq", "run_id", "package", "kind", "status", "gpus", "host", "protocol_id", "prev_hash",
            "prev_message_sha256", "record_hash", "canonical")
SCHEMA = pa.schema(
    [pa.field(name, typ, nullable=name not in NON_NULL) for name, typ in ARROW_FIELDS],
    metadata={"format": FORMAT, "canonical": "JSON hashed into record_hash (sorted keys, no whitespace)"},
)
INSTANT = pa.timestamp("us", tz="UTC")
TIME_FIELDS = ("started", "ended")


def _v2_fields() -> tuple[tuple[str, pa.DataType], ...]:
    out: list[tuple[str, pa.DataType]] = []
    for name, typ in ARROW_FIELDS:
        out.append((name, INSTANT if name in TIME_FIELDS else typ))
        if name == "host":
            out.append(("user", pa.string()))
    return tuple(out)


ARROW_FIELDS_V2 = _v2_fields()
SCHEMA_V2 = pa.schema(
    [pa.field(name, typ, nullable=name not in NON_NULL) for name, typ in ARROW_FIELDS_V2],
    metadata={"format": FORMAT_V2, "canonical": "JSON hashed into record_hash (sorted keys, no whitespace)",
              "times": "started/ended: timestamp[us, UTC]; in the canonical JSON ISO 8601 with microseconds and Z"},
)


def fields_of(version: int) -> tuple[tuple[str, pa.DataType], ...]:
    return ARROW_FIELDS if version == 1 else ARROW_FIELDS_V2


def schema_of(version: int) -> pa.Schema:
    return SCHEMA if version == 1 else SCHEMA_V2


def login_name() -> str:
    """The login that runs this process (from the user database, not the environment); never a host name."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid{os.geteuid()}"


def utc_iso(value: Any, always_us: bool = False) -> str | None:
    """A UTC instant as ISO 8601 with a Z suffix; refuses a naive or non-UTC time.

    Version 1 records keep seconds when there is no fraction; `always_us` (version 2) always writes microseconds.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as err:
            raise ValueError(f"not an ISO 8601 time: {value!r}") from err
    if not isinstance(value, datetime):
        raise ValueError(f"not a time: {value!r}")
    if value.tzinfo is None or value.utcoffset() != UTC.utcoffset(None):
        raise ValueError(f"time must be UTC (Z or +00:00): {value.isoformat()}")
    moment: datetime = value.astimezone(UTC)
    spec = "seconds" if moment.microsecond == 0 and not always_us else "microseconds"
    return moment.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def scrub_note(text: str) -> str:
    """One short line, without home paths or this host's name (the ledger must hold neither)."""
    text = _CONTROL.sub(" ", text)
    text = _HOME_PATH.sub("~", text)
    host = socket.gethostname()
    if len(host) >= 3:
        text = re.sub(re.escape(host), "<host>", text, flags=re.IGNORECASE)
    return text if len(text) <= NOTE_MAX else text[: NOTE_MAX - 1] + "…"


class LedgerRecord(BaseModel):
    """One ledger record; `record_hash` is SHA256 of the canonical JSON of every other field."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    VERSION: ClassVar[int] = 1

    seq: int = Field(ge=0, le=INT64_MAX)
    run_id: str = Field(pattern=TOKEN)
    package: str = Field(pattern=TOKEN)
    kind: Literal["checks", "prime", "train", "reload", "replay", "score", "audit", "run", "calibration"]
    arm: Literal["baseline", "candidate"] | None = None
    status: Literal["open", "ok", "failed", "timeout", "interrupted", "not-run",
                    "accepted", "noisy", "no difference shown", "not exact"]
    started: str | None = None
    ended: str | None = None
    wall_s: float | None = Field(default=None, ge=0)
    gpus: int = Field(default=0, ge=0, le=1 << 20)
    gpu_seconds: float | None = Field(default=None, ge=0)
    lock_wait_s: float | None = Field(default=None, ge=0)
    host: str = Field(pattern=HEX64)
    protocol_id: str = Field(pattern=TOKEN)
    sources_root: str | None = Field(default=None, pattern=TOKEN)
    result_digest: str | None = Field(default=None, pattern=TOKEN)
    peak_allocated: int | None = Field(default=None, ge=0, le=INT64_MAX)
    peak_reserved: int | None = Field(default=None, ge=0, le=INT64_MAX)
    exit_code: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)
    note: str | None = None
    prev_hash: str = Field(pattern=HEX64)
    prev_message_sha256: str = Field(pattern=HEX64)
    record_hash: str = Field(pattern=HEX64)

    @field_validator("started", "ended", mode="before")
    @classmethod
    def _utc(cls, value: Any) -> str | None:
        return utc_iso(value, always_us=cls.VERSION >= 2)

    @field_validator("wall_s", "gpu_seconds", "lock_wait_s", mode="after")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be finite")
        return None if value is None else float(value)  # an int stays a float in the canonical JSON

    @field_validator("note", mode="after")
    @classmethod
    def _note(cls, value: str | None) -> str | None:
        # append() scrubs notes; validation only checks, so it never depends on the verifying host
        if value is not None and (len(value) > NOTE_MAX or _CONTROL.search(value)):
            raise ValueError(f"note must be one line of at most {NOTE_MAX} characters")
        return value

    def hashed_fields(self) -> dict[str, Any]:
        return self.model_dump(exclude={"record_hash"})


class LedgerRecordV2(LedgerRecord):
    """A version 2 record: also the login name that ran the package; times always with microseconds."""

    VERSION: ClassVar[int] = 2

    user: str | None = Field(default=None, pattern=USER)


def record_class(version: int) -> type[LedgerRecord]:
    return LedgerRecord if version == 1 else LedgerRecordV2


def canonical_json(fields: dict[str, Any]) -> str:
    """Sorted keys, no whitespace: the bytes that record_hash is the SHA256 of."""
    return dumps_canonical(fields, ensure_ascii=False, allow_nan=False)


def record_hash_of(fields: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(fields).encode()).hexdigest()


def seal(fields: dict[str, Any], version: int = LATEST) -> LedgerRecord:
    """Validate fields (all but record_hash), then compute record_hash from their canonical JSON."""
    draft = record_class(version).model_validate({**fields, "record_hash": GENESIS})
    hashed = draft.hashed_fields()
    return draft.model_copy(update={"record_hash": record_hash_of(hashed)})


@lru_cache(maxsize=2)
def schema_message(version: int = LATEST) -> bytes:
    """The Arrow IPC schema message that opens every ledger stream of that record version."""
    return bytes(schema_of(version).serialize().to_pybytes())


def record_message(record: LedgerRecord) -> bytes:
    """The Arrow IPC record batch message (continuation, metadata, body) of one record."""
    row = record.model_dump()
    row["canonical"] = canonical_json(record.hashed_fields())
    version = record.VERSION
    if version >= 2:
        for name in TIME_FIELDS:
            if row[name] is not None:
                row[name] = datetime.fromisoformat(row[name].replace("Z", "+00:00"))
    fields = fields_of(version)
    batch = pa.RecordBatch.from_pydict({name: [row[name]] for name, _ in fields}, schema=schema_of(version))
    return bytes(batch.serialize().to_pybytes())


def record_from_row(row: dict[str, Any]) -> LedgerRecord:
    """A record from one decoded Arrow row (the `canonical` column dropped); a `user` column means version 2."""
    cls = LedgerRecordV2 if "user" in row else LedgerRecord
    return cls.model_validate({k: v for k, v in row.items() if k != "canonical"})
