"""Vectorised reading of the ledger's Arrow IPC stream: message framing and column extraction with NumPy.

pyarrow decodes a one-row batch in ~30 us, too slow for 1M records; every record message orch writes has the
same metadata layout, so its positions are learned once from a template message and gathered for all records.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ledger.cost.record import GENESIS, LATEST, NON_NULL, canonical_json, fields_of, record_class, record_message

CONTINUATION = 0xFFFFFFFF
_HEAD = struct.Struct("<Ii")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U16 = struct.Struct("<H")
# messages gathered per step: temporaries of a few MB that the allocator reuses; fresh pages cost ~1 ms/MB here
CHUNK = 1 << 15
# _BYTE_MASKS[k] keeps the first k bytes of a little-endian word
_BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [-1], dtype="<i8")


def _field_pos(meta: bytes, table: int, index: int) -> int | None:
    """Absolute position of field `index` of the flatbuffer table at `table`, None when absent."""
    vtable = table - int(_I32.unpack_from(meta, table)[0])
    vt_size = _U16.unpack_from(meta, vtable)[0]
    if 4 + 2 * index >= vt_size:
        return None
    rel = _U16.unpack_from(meta, vtable + 4 + 2 * index)[0]
    return table + rel if rel else None


def _deref(meta: bytes, pos: int) -> int:
    return pos + int(_U32.unpack_from(meta, pos)[0])


@dataclass(frozen=True)
class Layout:
    """Where, relative to a record message's first byte, its metadata keeps body length and buffer table."""

    meta_len: int
    body_len_at: int
    buffers_at: int
    n_buffers: int
    columns: dict[str, tuple[int, ...]]  # column -> its buffer indices (validity, [offsets,] data)
    types: dict[str, pa.DataType]  # column -> its Arrow type (the record version's schema)

    @property
    def body_at(self) -> int:
        return 8 + self.meta_len


@lru_cache(maxsize=2)
def layout(version: int = LATEST) -> Layout | None:
    """The layout of this pyarrow's record messages of a record version, or None when it cannot be learned
    (then pyarrow reads)."""
    template = record_class(version)(
        seq=1, run_id="r", package="p", kind="run", status="ok", host=GENESIS, protocol_id="x",
        prev_hash=GENESIS, prev_message_sha256=GENESIS, record_hash=GENESIS,
    )
    msg = record_message(template)
    cont, meta_len = _HEAD.unpack_from(msg, 0)
    meta = msg[8 : 8 + meta_len]
    columns: dict[str, tuple[int, ...]] = {}
    k = 0
    fields = fields_of(version)
    for name, typ in fields:
        width = 3 if pa.types.is_string(typ) else 2
        columns[name] = tuple(range(k, k + width))
        k += width
    try:
        root = _U32.unpack_from(meta, 0)[0]
        body_len_pos = _field_pos(meta, root, 3)
        header_pos = _field_pos(meta, root, 2)
        if cont != CONTINUATION or body_len_pos is None or header_pos is None:
            return None
        header = _deref(meta, header_pos)
        buffers_pos = _field_pos(meta, header, 2)
        if buffers_pos is None:
            return None
        vec = _deref(meta, buffers_pos)
        n_buffers = _U32.unpack_from(meta, vec)[0]
        found = Layout(meta_len, 8 + body_len_pos, 8 + vec + 4, n_buffers, columns, dict(fields))
    except struct.error:
        return None
    body_len = _I64.unpack_from(msg, found.body_len_at)[0]
    if n_buffers != k or body_len != len(msg) - found.body_at or found.buffers_at % 8 or found.body_len_at % 8:
        return None
    # string lengths are read from the buffer table: the writer must record the data buffer unpadded
    data = found.buffers_at + 16 * columns["canonical"][-1]
    if _I64.unpack_from(msg, data + 8)[0] != len(canonical_json(template.hashed_fields()).encode()):
        return None
    return found


def frame(buf: Any, start: int, end: int, lay: Layout) -> tuple[np.ndarray, int]:
    """Start offsets of the record messages framed from buf[start:], and where framing stopped (end if whole).

    Framing only reads lengths; a message it frames may still fail to decode, which the callers check.
    """
    # one unpack per message: continuation, metadata length, then the bodyLength field of the metadata
    head = struct.Struct(f"<Ii{lay.body_len_at - 8}xq").unpack_from
    meta_len, body_at = lay.meta_len, lay.body_at
    starts: list[int] = []
    push = starts.append
    pos = start
    while pos < end:
        if pos + body_at > end:
            break
        cont, mlen, body_len = head(buf, pos)
        if cont != CONTINUATION or mlen != meta_len:
            break
        nxt = pos + body_at + body_len
        if body_len < 0 or body_len % 8 or nxt > end:
            break
        push(pos)
        pos = nxt
    return np.asarray(starts, dtype=np.int64), pos


def index_valid(buf: Any, size: int, starts: np.ndarray, first: int, lay: Layout) -> bool:
    """True when `starts` frames buf[first:end-of-last] exactly: each message's lengths lead to the next start."""
    if len(starts) == 0:
        return True
    if starts[0] != first or (starts & 7).any() or starts.min() < first or starts.max() + lay.body_at > size:
        return False
    words = np.frombuffer(buf, dtype="<i8", count=size // 8)
    head = words[starts >> 3]
    if not (head == (CONTINUATION | (lay.meta_len << 32))).all():
        return False
    body_len = words[(starts + lay.body_len_at) >> 3]  # bodyLength is 8-aligned in the metadata
    ends = starts + lay.body_at + body_len
    return bool((body_len >= 0).all() and (ends[:-1] == starts[1:]).all() and ends[-1] <= size)


class Columns:
    """Column values gathered from framed record messages of one mapped ledger file.

    Gathers are row-major (all wanted words of one message together), so each message's page is touched once.
    """

    def __init__(self, buf: Any, size: int, starts: np.ndarray, lay: Layout) -> None:
        self.buf = buf
        self.size = size
        self.bytes = np.frombuffer(buf, dtype=np.uint8, count=size)
        self.words = np.frombuffer(buf, dtype="<i8", count=size // 8)
        self.starts = starts
        self.lay = lay
        self.n = len(starts)
        self.body = starts + lay.body_at

    def part(self, lo: int, hi: int) -> Columns:
        """The same columns for messages lo..hi-1 only."""
        return Columns(self.buf, self.size, self.starts[lo:hi], self.lay)

    def extract(self, names: list[str]) -> dict[str, Any]:
        """For each column: ('num', values, valid) or ('str', value starts, lengths, valid).

        Reads only the buffer-table words a column needs (validity only for nullable columns; for strings the
        data buffer's offset and length, which the writer records unpadded), row-major, CHUNK messages at a time.
        """
        want: list[int] = []
        plan: dict[str, tuple[int | None, int, int | None]] = {}
        for name in names:
            bufs = self.lay.columns[name]
            entry = [(self.lay.buffers_at + 16 * k) >> 3 for k in bufs]
            vpos = None
            if name not in NON_NULL:
                vpos = len(want)
                want += [entry[0], entry[0] + 1]
            dpos = len(want)
            want.append(entry[-1])
            lpos = None
            if len(bufs) == 3:
                lpos = len(want)
                want.append(entry[-1] + 1)
            plan[name] = (vpos, dpos, lpos)
        n = self.n
        wanted = np.asarray(want, dtype=np.int64)
        base = self.starts >> 3
        valid = {name: np.ones(n, dtype=bool) for name in plan}
        first = {name: np.empty(n, dtype=np.int64) for name in plan}  # numbers, or string value starts
        lengths = {name: np.empty(n, dtype=np.int64) for name, p in plan.items() if p[2] is not None}
        for lo in range(0, n, CHUNK):
            hi = min(n, lo + CHUNK)
            table = self.words[base[lo:hi, None] + wanted]
            body = self.body[lo:hi]
            for name, (vpos, dpos, lpos) in plan.items():
                if vpos is not None:
                    has = table[:, vpos + 1] > 0
                    if has.any():
                        valid[name][lo:hi][has] = (self.bytes[body[has] + table[has, vpos]] & 1).astype(bool)
                start = body + table[:, dpos]
                if lpos is None:
                    first[name][lo:hi] = self.words[start >> 3]
                else:
                    first[name][lo:hi] = start
                    lengths[name][lo:hi] = table[:, lpos]
        out: dict[str, Any] = {}
        for name in plan:
            if name in lengths:
                length, start = lengths[name], first[name]
                if (valid[name] & ((length < 0) | (start + length > self.size))).any():
                    raise ValueError(f"a {name} value lies outside the ledger file (damaged lengths)")
                out[name] = ("str", first[name], lengths[name], valid[name])
            else:
                out[name] = ("num", first[name], valid[name])
        return out

    def dictionary(self, name: str, got: tuple[Any, ...] | None = None) -> pa.DictionaryArray:
        """A string column dictionary-encoded without Python strings: values are hashed as fixed-width rows.

        Each value becomes its zero-padded words plus its length (so padding never merges two values); pyarrow's
        hash kernel encodes those rows and only the distinct ones are turned back into strings.
        """
        _, start, length, valid = got if got is not None else self.extract([name])[name]
        if self.n == 0:
            return pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), pa.array([], pa.string()))
        length = np.where(valid, length, 0)
        width = int(length.max()) if self.n else 0
        if (start[valid] & 7).any() or width > 1024:
            encoded: pa.DictionaryArray = pc.dictionary_encode(self.arrow(name))
            return encoded
        nw = (width + 7) // 8
        word = np.arange(nw, dtype=np.int64)
        pieces = []
        for lo in range(0, self.n, CHUNK):  # chunk by chunk: the fixed-width rows stay small and reused
            hi = min(self.n, lo + CHUNK)
            rows = np.zeros((hi - lo, nw + 1), dtype="<i8")
            at = np.where(valid[lo:hi], start[lo:hi] >> 3, 0)
            keep = np.clip(length[lo:hi, None] - 8 * word, 0, 8)
            # words past a value's end are masked off; clipping keeps the shortest values near the file's end in range
            at_words = np.minimum(at[:, None] + word, len(self.words) - 1)
            rows[:, :nw] = self.words[at_words] & _BYTE_MASKS[keep]
            rows[:, nw] = length[lo:hi]
            fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(8 * (nw + 1)), hi - lo,
                                                         [_bitmap(valid[lo:hi]), pa.py_buffer(rows)])
            pieces.append(pc.dictionary_encode(fixed))
        enc = pa.concat_arrays(pieces)  # unifies the chunks' dictionaries
        distinct = enc.dictionary
        d = len(distinct)
        words = np.frombuffer(distinct.buffers()[1], dtype="<i8")[distinct.offset * (nw + 1):]
        words = words[: d * (nw + 1)].reshape(d, nw + 1)
        dlen = words[:, nw]
        offsets = np.zeros(d + 1, dtype=np.int64)
        np.cumsum(dlen, out=offsets[1:])
        chars = np.ascontiguousarray(words[:, :nw]).view(np.uint8).reshape(d, 8 * nw)
        data = chars[np.arange(8 * nw)[None, :] < dlen[:, None]]
        values = pa.Array.from_buffers(pa.large_string(), d, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        values.validate(full=True)  # the bytes must be UTF-8, as pyarrow's own reader would require
        return pa.DictionaryArray.from_arrays(enc.indices, values.cast(pa.string()))

    def hex64(self, *gots: tuple[Any, ...]) -> list[np.ndarray]:
        """(n, 8) int64 words of each 64-character string column (hex digests), gathered in one pass.

        Each `got` is a column's entry from `extract`; raises when a value is not 64 bytes at an aligned offset.
        """
        for _, start, length, valid in gots:
            if self.n and (not valid.all() or (length != 64).any() or (start & 7).any()):
                raise ValueError("a digest column holds a value that is not 64 characters")
        at = np.concatenate([(g[1] >> 3)[:, None] + np.arange(8) for g in gots], axis=1)
        words = self.words[at]
        return [words[:, 8 * i : 8 * i + 8] for i in range(len(gots))]

    def arrows(self, names: list[str], dictionary: bool = False) -> dict[str, pa.Array]:
        """The named columns as Arrow arrays (strings gathered, numbers viewed), nulls from the validity bits.

        With `dictionary`, string columns come dictionary-encoded (what grouping wants, and much faster).
        """
        types = self.lay.types
        out: dict[str, pa.Array] = {}
        for name, got in self.extract(names).items():
            typ = types[name]
            if dictionary and got[0] == "str":
                out[name] = self.dictionary(name, got)
                continue
            if got[0] == "num":
                _, raw, valid = got
                values = raw.view(np.float64) if pa.types.is_floating(typ) else raw
                out[name] = pa.array(values, type=typ, mask=None if valid.all() else ~valid)
                continue
            _, start, length, valid = got
            length = np.where(valid, length, 0)
            offsets = np.zeros(self.n + 1, dtype=np.int64)
            np.cumsum(length, out=offsets[1:])
            data = pa.py_buffer(self._gather(start, length))
            arr = pa.Array.from_buffers(pa.large_string(), self.n, [_bitmap(valid), pa.py_buffer(offsets), data])
            out[name] = arr.cast(pa.string()) if int(offsets[-1]) < 2**31 else arr
        return out

    def _gather(self, start: np.ndarray, length: np.ndarray) -> np.ndarray:
        """The bytes of all spans, concatenated: short aligned strings word-wise, others byte-wise."""
        width = int(length.max()) if len(length) else 0
        if width == 0:
            return np.zeros(0, dtype=np.uint8)
        if width <= 256 and not (start & 7).any():
            nwords = (width + 7) // 8
            rows = self.words[(start >> 3)[:, None] + np.arange(nwords)].view(np.uint8)
            picked: np.ndarray = rows[np.arange(nwords * 8)[None, :] < length[:, None]]
            return picked
        total = int(length.sum())
        first = np.zeros(len(length), dtype=np.int64)
        np.cumsum(length[:-1], out=first[1:])
        gathered: np.ndarray = self.bytes[np.repeat(start - first, length) + np.arange(total, dtype=np.int64)]
        return gathered

    def arrow(self, name: str) -> pa.Array:
        return self.arrows([name])[name]


def _bitmap(valid: np.ndarray) -> pa.Buffer | None:
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))
