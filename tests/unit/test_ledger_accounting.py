"""Accounting over a real ledger: groups, since, lock wait once per run, failures, open packages, renderers; CLI."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from ledger.cost.accounting import columns_for, render_csv, render_json, render_table, summarize
from ledger.cost.store import Ledger
from orchestrator.cli.orch import app
from protocol.errors import UsageError
from protocol.home import resolve_home


def record(ledger: Ledger, run: str, pkg: str, kind: str, arm: str | None, status: str, day: str, **kw: Any) -> None:
    ledger.append(run_id=run, package=pkg, kind=kind, arm=arm, status=status, started=f"{day}T08:00:00Z",
                  protocol_id="proto1" if run != "r3" else "proto2", gpus=8, lock_wait_s=3.0, **kw)


def history(ledger: Ledger) -> None:
    for run, day in (("r1", "2025-01-01"), ("r2", "2025-01-02")):
        record(ledger, run, "train-A", "train", "baseline", "open", day)
        record(ledger, run, "train-A", "train", "baseline", "ok", day, wall_s=10.0, gpu_seconds=80.0)
        record(ledger, run, "train-C", "train", "candidate", "open", day)
        record(ledger, run, "train-C", "train", "candidate", "failed", day, wall_s=5.0, gpu_seconds=40.0, exit_code=1)
        record(ledger, run, "score", "score", None, "not-run", day)
    record(ledger, "r3", "checks", "checks", None, "open", "2025-01-03")  # a crash: never closed


@pytest.fixture
def home(tmp_path: Path) -> Path:
    history(Ledger(resolve_home(tmp_path).ledger_path))
    return tmp_path


def table(home: Path, by: str, since: str | None = None) -> Any:
    return Ledger(resolve_home(home).ledger_path).table(columns_for(by, since))


def test_by_kind_counts_and_seconds(home: Path) -> None:
    rows = {r["kind"]: r for r in summarize(table(home, "kind"), by="kind")}
    train = rows["train"]
    assert (train["runs"], train["packages"], train["ok"], train["failed"], train["open"]) == (2, 4, 2, 2, 0)
    assert train["gpu_seconds"] == 240.0 and train["wall_s"] == 30.0
    assert train["lock_wait_s"] == 6.0  # 3 s per run, counted once per run, not once per record
    assert rows["score"]["not_run"] == 2 and rows["score"]["packages"] == 2
    assert rows["checks"]["open"] == 1 and rows["checks"]["packages"] == 0


def test_by_run_day_arm_protocol_and_since(home: Path) -> None:
    by_run = {r["run"]: r for r in summarize(table(home, "run"), by="run")}
    assert by_run["r1"]["gpu_seconds"] == 120.0 and by_run["r3"]["open"] == 1
    assert [r["day"] for r in summarize(table(home, "day"), by="day")] == ["2025-01-01", "2025-01-02", "2025-01-03"]
    arms = {r["arm"]: r["gpu_seconds"] for r in summarize(table(home, "arm"), by="arm")}
    assert arms == {"baseline": 160.0, "candidate": 80.0, "-": 0.0}
    protos = {r["protocol"]: r["runs"] for r in summarize(table(home, "protocol"), by="protocol")}
    assert protos == {"proto1": 2, "proto2": 1}
    since = summarize(table(home, "run", "2025-01-02"), by="run", since="2025-01-02")
    assert [r["run"] for r in since] == ["r2", "r3"]
    assert summarize(table(home, "run", "2025-01-04T00:00:00Z"), by="run", since="2025-01-04T00:00:00Z") == []
    with pytest.raises(UsageError):
        summarize(table(home, "run"), by="week")
    with pytest.raises(UsageError):
        summarize(table(home, "run", "yesterday"), by="run", since="yesterday")


def test_records_and_table_inputs_agree(home: Path) -> None:
    ledger = Ledger(resolve_home(home).ledger_path)
    assert summarize(ledger.records(), by="day") == summarize(table(home, "day"), by="day")


def test_renderers(home: Path) -> None:
    rows = summarize(table(home, "kind"), by="kind")
    doc = json.loads(render_json(rows, "kind", None))
    assert doc["total"]["gpu_seconds"] == 240.0 and len(doc["groups"]) == 3
    parsed = list(csv.DictReader(io.StringIO(render_csv(rows, "kind"))))
    assert [r["kind"] for r in parsed] == ["checks", "score", "train"] and parsed[2]["failed"] == "2"
    out = io.StringIO()
    Console(file=out, width=200).print(render_table(rows, "kind"))
    assert "total" in out.getvalue() and "240.0" in out.getvalue()


def test_cli_ledger_commands(home: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["ledger", "--home", str(home), "--by", "run", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["total"]["gpu_seconds"] == 240.0
    res = runner.invoke(app, ["ledger", "summary", "--home", str(home), "--format", "csv", "--by", "day"])
    assert res.exit_code == 0 and res.output.splitlines()[0].startswith("day,runs,packages")
    res = runner.invoke(app, ["ledger", "verify", "--home", str(home)])
    assert res.exit_code == 0 and "orphaned: run r3 package checks" in res.output
    head = runner.invoke(app, ["ledger", "head", "--home", str(home)]).output.strip()
    assert head.startswith("11:")
    assert runner.invoke(app, ["ledger", "verify", "--home", str(home), "--against", head]).exit_code == 0
    bad = "11:" + "0" * 64
    assert runner.invoke(app, ["ledger", "verify", "--home", str(home), "--against", bad]).exit_code == 1
    assert runner.invoke(app, ["ledger", "verify", "--home", str(home), "--against", "x"]).exit_code == 2
    path = resolve_home(home).ledger_path
    path.write_bytes(path.read_bytes() + b"\xff\xff\xff\xff\x10")
    res = runner.invoke(app, ["ledger", "verify", "--home", str(home)])
    assert res.exit_code == 1 and "torn tail" in res.output
    res = runner.invoke(app, ["ledger", "repair", "--home", str(home)])
    assert res.exit_code == 0 and "moved to" in res.output
    assert runner.invoke(app, ["ledger", "verify", "--home", str(home)]).exit_code == 0
    assert runner.invoke(app, ["ledger", "--home", str(home), "--format", "xml"]).exit_code == 2
