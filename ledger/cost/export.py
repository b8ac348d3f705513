"""The ledger as data for every Arrow tool: normalized columns, record selection, Parquet and Arrow-file export.

Times are timestamp[us, UTC] whatever the ledger's record version; a v1 ledger (no user column) reads user null.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ledger.cost.accounting import INSTANT, as_instant, as_timestamps, instants, parse_since
from ledger.cost.store import Ledger
from protocol.errors import FailedError, UsageError

# what export writes: every data column; `canonical` (the hashed JSON) stays in the ledger
EXPORT_DROP = ("canonical",)
LIST_DEFAULT = ("seq", "run_id", "package", "kind", "arm", "status", "started", "ended", "wall_s", "gpu_seconds",
                "user")
EXPORT_CHUNK = 65_536  # rows per record batch (Arrow file) and per row group (Parquet)
TIME_COLUMNS = ("started", "ended")


def ledger_table(ledger: Ledger, columns: list[str] | None, *, user: str | None = None) -> pa.Table:
    """The complete records as a table of `columns` (all data columns when None), times as timestamps.

    With `user` only that login's records; a ledger whose records carry no user column reads user null.
    """
    stored = set(ledger.column_names())
    wanted = list(columns) if columns is not None else [n for n in ledger.column_names() if n not in EXPORT_DROP]
    if columns is None and "user" not in wanted:
        wanted.append("user")
    if user is not None and "user" not in wanted:
        wanted.append("user")
    read = [n for n in wanted if n in stored]
    table = ledger.table(read, dictionary=columns is not None)
    for name in wanted:
        if name not in stored:
            table = table.append_column(pa.field(name, pa.string()), pa.nulls(table.num_rows, pa.string()))
    if columns is None:
        for name in TIME_COLUMNS:
            if name in table.column_names:
                i = table.column_names.index(name)
                table = table.set_column(i, pa.field(name, INSTANT), as_timestamps(table[name]))
    if user is not None:
        users = table["user"].combine_chunks()
        if pa.types.is_dictionary(users.type):
            users = users.cast(pa.string())
        table = table.filter(pc.fill_null(pc.equal(users, user), False))
    return table.select(wanted)


def select_records(table: pa.Table, *, since: str | None = None, until: str | None = None,
                   run: str | None = None) -> pa.Table:
    """Records that started (or, never started, ended) in [since, until), of one run when given."""
    for text, option, keep in ((since, "--since", pc.greater_equal), (until, "--until", pc.less)):
        cutoff = parse_since(text, option)
        if cutoff is not None and table.num_rows:
            table = table.filter(pc.fill_null(keep(instants(table), pa.scalar(as_instant(cutoff), INSTANT)), False))
    if run is not None:
        table = table.filter(pc.fill_null(pc.equal(table["run_id"], run), False))
    return table


def field_help() -> str:
    from ledger.cost.record import ARROW_FIELDS_V2

    return " ".join(name for name, _ in ARROW_FIELDS_V2 if name not in EXPORT_DROP)


def list_fields(text: str) -> list[str]:
    """`--format a,b,c` as column names; unknown names refused in one line."""
    known = field_help().split()
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"--format: unknown field(s) {', '.join(unknown) or '(none given)'}; "
                         f"fields: {','.join(known)}")
    return names


def export_table(table: pa.Table, to: Path) -> str:
    """Write `table` to FILE.parquet or FILE.arrow/.feather/.ipc (Arrow IPC file format); returns the format name."""
    suffix = to.suffix.lower()
    if suffix not in (".parquet", ".arrow", ".feather", ".ipc"):
        raise UsageError(f"--to {to}: say the format by the suffix: .parquet, or .arrow (Arrow IPC file)")
    if not to.parent.is_dir():
        raise UsageError(f"--to {to}: directory {to.parent} does not exist")
    tmp = to.with_name(f".{to.name}.{os.getpid()}.tmp")
    table = table.combine_chunks()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, tmp, row_group_size=EXPORT_CHUNK, compression="zstd")
            fmt = "parquet"
        else:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                for batch in table.to_batches(max_chunksize=EXPORT_CHUNK):
                    writer.write_batch(batch)
            fmt = "arrow-ipc-file"
        os.replace(tmp, to)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise FailedError(f"--to {to}: cannot write ({err.strerror or err}); check the path and free space") from None
    return fmt
