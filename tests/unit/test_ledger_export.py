"""The ledger as data: version 2 records (timestamps, user), old version 1 ledgers, export read by pandas, polars
and DuckDB, and the sacct-like `orch ledger list`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from cliutil import orch

from ledger.cost.export import ledger_table
from ledger.cost.merkle import parse_head
from ledger.cost.record import login_name
from ledger.cost.store import Ledger

REPO = Path(__file__).resolve().parents[2]
V1 = REPO / "tests" / "fixtures" / "ledger_v1.arrows"
V1_HEAD = "5:3844cbb98b7fb210423e411e4974062dd0cbaf2f50ffefd7cd4740d77096f0e7"  # made by the version 1 writer
UTC_US = pa.timestamp("us", tz="UTC")


def _fill(ledger: Ledger) -> None:
    common: dict[str, Any] = {"protocol_id": "p" * 64, "gpus": 2}
    for run, day, wait in (("run-a", "2026-01-01", 3.0), ("run-b", "2026-01-02", 5.0)):
        for name, kind in (("checks", "checks"), ("train-A", "train")):
            ledger.append(run_id=run, package=name, kind=kind, status="open", started=f"{day}T10:00:00Z",
                          lock_wait_s=wait, **common)
            ledger.append(run_id=run, package=name, kind=kind, status="ok", started=f"{day}T10:00:00Z",
                          ended=f"{day}T10:01:00.5Z", wall_s=60.5, gpu_seconds=121.0, lock_wait_s=wait, exit_code=0,
                          **common)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    _fill(Ledger(h / "ledger" / "ledger.arrows", fsync=False))
    return h


def _orch(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # in this process (tests/cliutil.py): same entry point, no new interpreter
    return orch(*args, cwd=cwd, env={**os.environ, **(env or {})})


def test_new_records_have_timestamps_and_the_login_name(home: Path) -> None:
    ledger = Ledger(home / "ledger" / "ledger.arrows")
    raw = pa.ipc.open_stream(str(ledger.path)).read_all()
    assert raw.schema.field("started").type == UTC_US and raw.schema.field("ended").type == UTC_US
    users = set(raw["user"].to_pylist())
    assert users == {login_name()} and socket.gethostname() not in users
    assert ledger.records()[1].ended == "2026-01-01T10:01:00.500000Z"
    assert ledger.verify().ok


def test_a_version_1_ledger_still_verifies_reads_and_grows(tmp_path: Path) -> None:
    path = tmp_path / "ledger" / "ledger.arrows"
    path.parent.mkdir()
    shutil.copy(V1, path)
    ledger = Ledger(path, fsync=False)
    assert ledger.version() == 1
    report = ledger.verify(against=parse_head(V1_HEAD))
    assert report.ok and report.size == 5, report.problems
    assert str(ledger.head()) == V1_HEAD  # the hash chain of old records is unchanged
    table = ledger_table(ledger, None)
    assert table.schema.field("started").type == UTC_US and table["user"].null_count == 5
    assert str(table["started"][3]) == "2026-01-02 03:04:10+00:00"
    ledger.append(run_id="r3", package="checks", kind="checks", status="ok", started="2026-01-04T00:00:00Z",
                  protocol_id="p" * 64)
    assert ledger.version() == 1 and ledger.verify(against=parse_head(V1_HEAD)).ok
    assert ledger.records()[-1].started == "2026-01-04T00:00:00Z"  # version 1 keeps its own time format


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_export_opens_in_pandas_polars_and_duckdb(home: Path, tmp_path: Path, suffix: str) -> None:
    import duckdb
    import pandas as pd
    import polars as pl

    out = tmp_path / f"l{suffix}"
    proc = _orch("ledger", "export", "--to", str(out), "--home", str(home), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["records"] == 8
    if suffix == ".parquet":
        frame = pd.read_parquet(out)
        lazy = pl.scan_parquet(out)
        con = duckdb.connect()
        rows = con.execute(f"select run_id, sum(gpu_seconds) from read_parquet('{out}') "
                           "where status = 'ok' group by run_id order by run_id").fetchall()
        kind = con.execute(f"select typeof(started) from read_parquet('{out}') limit 1").fetchone()
    else:
        assert pa.ipc.open_file(str(out)).num_record_batches == 1  # the IPC *file* format, one batch per chunk
        frame = pd.read_feather(out)
        lazy = pl.scan_ipc(out)
        arrow_table = pa.ipc.open_file(str(out)).read_all()  # noqa: F841 (DuckDB reads the Arrow table by name)
        con = duckdb.connect()
        rows = con.execute("select run_id, sum(gpu_seconds) from arrow_table where status = 'ok' "
                           "group by run_id order by run_id").fetchall()
        kind = con.execute("select typeof(started) from arrow_table limit 1").fetchone()
    assert str(frame["started"].dtype) in ("datetime64[us, UTC]", "datetime64[ns, UTC]")
    assert frame["user"].iloc[0] == login_name() and len(frame) == 8
    polled = lazy.filter(pl.col("status") == "ok").select(pl.col("gpu_seconds").sum()).collect()
    assert polled.item() == 4 * 121.0
    assert lazy.collect_schema()["started"] == pl.Datetime("us", "UTC")
    assert rows == [("run-a", 242.0), ("run-b", 242.0)]
    assert kind is not None and kind[0] == "TIMESTAMP WITH TIME ZONE"


def test_export_refuses_an_unknown_suffix_and_a_missing_ledger(home: Path, tmp_path: Path) -> None:
    proc = _orch("ledger", "export", "--to", str(tmp_path / "l.xlsx"), "--home", str(home), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"orch: --to {tmp_path / 'l.xlsx'}: say the format by the suffix: .parquet, or "
                                   ".arrow (Arrow IPC file)")
    proc = _orch("ledger", "export", "--to", str(tmp_path / "l.parquet"), "--home", str(tmp_path / "none"),
                 cwd=tmp_path)
    assert proc.returncode == 1 and "no ledger at" in proc.stderr and not (tmp_path / "none").exists()


def test_list_like_sacct_fields_bounds_user(home: Path, tmp_path: Path) -> None:
    proc = _orch("ledger", "list", "--home", str(home), "--format", "seq,run_id,package,status,started,user",
                 "--since", "2026-01-02", "--until", "2026-01-03", "--user", login_name(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()  # not a terminal: tab-separated, a header, nothing cut
    assert lines[0].split("\t") == ["seq", "run_id", "package", "status", "started", "user"]
    assert len(lines) == 5 and all(line.split("\t")[1] == "run-b" for line in lines[1:])
    assert lines[1].split("\t")[4] == "2026-01-02T10:00:00.000000Z"
    nobody = _orch("ledger", "list", "--home", str(home), "--user", "nobody-else", "--json", cwd=tmp_path)
    assert json.loads(nobody.stdout)["records"] == []
    bad = _orch("ledger", "list", "--home", str(home), "--format", "seq,hostname", cwd=tmp_path)
    # orch names the unknown field itself (the --format value it echoes would hold the word too)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert bad.stderr.startswith("orch: --format: unknown field(s) hostname; fields: seq,run_id,package,"), bad.stderr
    run = _orch("ledger", "list", "--home", str(home), "--run", "run-a", "--json", cwd=tmp_path)
    records = json.loads(run.stdout)["records"]
    assert len(records) == 4 and records[0]["started"] == "2026-01-01T10:00:00.000000Z"


def test_summary_totals_count_each_run_and_its_lock_wait_once(home: Path, tmp_path: Path) -> None:
    proc = _orch("ledger", "--home", str(home), "--by", "kind", "--json", cwd=tmp_path)
    doc = json.loads(proc.stdout)
    assert [g["runs"] for g in doc["groups"]] == [2, 2]  # each kind saw both runs
    assert doc["total"]["runs"] == 2 and doc["total"]["lock_wait_s"] == 8.0  # not 4 runs, not 16 s
    assert doc["total"]["gpu_seconds"] == 484.0 and doc["units"]["gpu_seconds"] == "s"
    by_user = json.loads(_orch("ledger", "summary", "--by", "user", "--home", str(home), "--json",
                               cwd=tmp_path).stdout)
    assert [g["user"] for g in by_user["groups"]] == [login_name()]
