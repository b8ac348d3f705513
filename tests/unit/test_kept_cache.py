"""Issue 51: the sealed baseline compile cache is kept under its key and a later run of the same key loads it instead
of priming, once every entry is checked against the manifest its sealing run recorded in the ledger; a changed
entry, another key or a manifest the ledger does not hold means a fresh prime, the reason named. run_plan runs for
real (real files, a real ledger); only the package runner is the one of test_launch_plan (what a worker writes)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cliutil import orch as run_orch
from test_launch_plan import REPO, _runner, ctx  # noqa: F401  (ctx: the fixture)

from ledger.cost.store import Ledger
from orchestrator.isolation.kept_cache import KEPT_DIR
from orchestrator.run import run_plan as run_plan_mod
from orchestrator.run.progress import Progress
from orchestrator.run.run_plan import RunContext, run_plan
from protocol.run_record import RunRecord


def _tune(spec: Any, c: RunContext) -> str:
    """The prime compiles and tunes: a pick and its kernel in the baseline's folder (the env orch gave it)."""
    assert c.caches is not None
    pick = c.caches.baseline / "inductor" / "ab" / "k.best_config"
    pick.parent.mkdir(parents=True)
    pick.write_text('{"XBLOCK": 64}')
    return "ok"


def _again(c: RunContext, run_id: str, **host: str) -> RunContext:
    """The next run of the same protocol in the same home (another run id; the host as given)."""
    run_dir = c.home.run_dir(run_id)
    (run_dir / "packages").mkdir(parents=True)
    (c.home.scratch / run_id).mkdir(parents=True)
    h = c.host.model_copy(update=host)
    nxt = RunContext(c.loaded, c.home, run_id, run_dir, c.home.scratch / run_id, c.ledger, h, c.arms,
                     sealed=c.sealed, grant=c.grant)
    nxt.run_record = RunRecord.begin(run_id, c.loaded.id, c.loaded.protocol.name, "2026-12-02T00:00:00Z", h, {})
    return nxt


def _plan(c: RunContext, monkeypatch: pytest.MonkeyPatch, said: list[str]) -> list[str]:
    ran: list[str] = []
    monkeypatch.setattr(run_plan_mod, "run_package", _runner(c, ran, {"prime": _tune}))
    status, _ = run_plan(c, Progress(live=False, say=said.append))
    assert status == "complete"
    c.write_run_json()
    return ran


def _run_json(c: RunContext) -> dict[str, Any]:
    return json.loads((c.run_dir / "run.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture
def kept(ctx: RunContext, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunContext]:  # noqa: F811
    said: list[str] = []
    assert "prime" in _plan(ctx, monkeypatch, said)
    assert any(s.startswith("compile cache: a fresh prime (no kept compile cache of key ") for s in said), said
    yield ctx


def test_a_second_run_of_the_same_key_loads_the_kept_cache_and_runs_no_prime(
    kept: RunContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _run_json(kept)["compile_cache"]
    assert (first["reused"], first["sealed_by"], first["entries"], first["tuned"]) == (False, "run1", 4, 1)
    root = kept.home.root / KEPT_DIR
    assert (root / first["name"] / "inductor" / "ab" / "k.best_config").is_file()
    assert not os.access(root / first["name"] / "inductor", os.W_OK) or os.geteuid() == 0  # sealed read-only
    nxt = _again(kept, "run2")
    said: list[str] = []
    ran = _plan(nxt, monkeypatch, said)
    assert "prime" not in ran and ran[0] == "checks" and "train-A" in ran
    doc = _run_json(nxt)
    cc = doc["compile_cache"]
    assert (cc["reused"], cc["sealed_by"], cc["name"], cc["manifest_sha256"]) == (
        True, "run1", first["name"], first["manifest_sha256"])
    assert (nxt.run_dir / "compile-cache.baseline.json").read_bytes() == (
        kept.run_dir / "compile-cache.baseline.json").read_bytes()
    train_a = next(p for p in doc["packages"] if p["name"] == "train-A")
    assert train_a["compile_cache"]["taken_tuned"] == 1  # its copy was the kept cache
    assert "prime" not in [r.package for r in Ledger(kept.home.ledger_path).records("run2")]
    assert any(f"kept cache {first['name']} (sealed by run run1 at " in s for s in said), said


def test_a_kept_cache_not_as_sealed_or_not_in_the_ledger_means_a_fresh_prime_naming_why(
    kept: RunContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = _run_json(kept)["compile_cache"]["name"]
    pick = kept.home.root / KEPT_DIR / name / "inductor" / "ab" / "k.best_config"
    os.chmod(pick.parent, 0o755)
    os.chmod(pick, 0o644)
    pick.write_text('{"XBLOCK": 128}')  # another pick planted in the kept cache between runs
    nxt = _again(kept, "run2")
    assert "prime" in _plan(nxt, monkeypatch, [])
    reason = _run_json(nxt)["compile_cache"]["reason"]
    assert reason == f"kept cache {name[:26]}: 1 entry not as sealed (inductor/ab/k.best_config)", reason
    # another torch: another key, so the fresh cache run2 kept is not loaded either
    other = _again(kept, "run3", torch="9.9.9")
    assert "prime" in _plan(other, monkeypatch, [])
    assert _run_json(other)["compile_cache"]["reason"].startswith("no kept compile cache of key ")
    # a kept cache whose manifest the ledger does not hold (sealed under another home) is not loaded
    third = _again(kept, "run4")
    third.ledger = Ledger(kept.home.root / "other.arrows")
    assert "prime" in _plan(third, monkeypatch, [])
    assert "the ledger holds no passing prime of run run2" in _run_json(third)["compile_cache"]["reason"]


def test_orch_cache_ls_checks_each_kept_cache_and_rm_frees_it(kept: RunContext) -> None:
    def orch(*args: str) -> subprocess.CompletedProcess[str]:
        return run_orch("cache", *args, "--home", str(kept.home.root), cwd=REPO)

    done = orch("ls", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["caches"]
    assert [(r["sealed_by"], r["status"], r["tuned"]) for r in rows] == [("run1", "ok", 1)]
    bad = orch("rm", "baseline-0000000000000000-nope")
    assert bad.returncode == 2 and "no kept compile cache baseline-0000000000000000-nope" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    done = orch("rm", rows[0]["name"])
    assert done.returncode == 0 and f"removed {rows[0]['name']}" in done.stderr + done.stdout
    assert os.listdir(kept.home.root / KEPT_DIR) == []
    assert json.loads(orch("ls", "--json").stdout)["caches"] == []


def test_a_rehearsals_fresh_folder_and_ports_keep_its_key_and_what_compiles_changes_it(tmp_path: Path) -> None:
    """Two rehearsals derive their protocol into fresh folders with fresh judge ports: one key. The baseline's
    sources, another flag value, torch or the ranks give another."""
    import yaml

    from orchestrator.isolation.kept_cache import cache_key, key_fields
    from protocol.run_record import HostFingerprint
    from protocol.schema import load_protocol

    data = yaml.safe_load((REPO / "protocol" / "r3_mini.yaml").read_text())
    host = HostFingerprint(gpu_model="H100", gpu_count=1, driver="1", cuda="13", torch="2.9.1", triton="3.5.1",
                           python="3.12", host_hash="0" * 64)

    def key(folder: str, ports: tuple[int, int], lr: str = "5e-6", ranks: int = 2, root: str = "a" * 64,
            **h: str) -> str:
        d = tmp_path / folder
        d.mkdir(exist_ok=True)
        launcher = {**data["launcher"], "nproc": ranks, "endpoints": [f"127.0.0.1:{p}" for p in ports],
                    "env": {**data["launcher"].get("env", {}), "DATA": f"{d}/inputs"}}
        (d / "p.yaml").write_text(yaml.safe_dump({**data, "base": str(REPO), "launcher": launcher}))
        loaded = load_protocol(d / "p.yaml")
        argv = ["train.py", "--data", f"{d}/inputs/train.jsonl", "--port", ",".join(map(str, ports)), "--lr", lr]
        return cache_key(key_fields(loaded, argv, root, host.model_copy(update=h)))

    one = key("w1", (40001, 40002))
    assert key("w2", (50003, 50004)) == one
    assert len({one, key("w3", (40001, 40002), lr="1e-5"), key("w4", (40001, 40002), ranks=1),
                key("w5", (40001, 40002), root="b" * 64), key("w6", (40001, 40002), torch="2.10.0")}) == 5
