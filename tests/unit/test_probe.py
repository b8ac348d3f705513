"""The probe on a real 2-rank gloo torchrun of the tiny FSDP2 trainer: the acceptance faults are each reported
as exactly what they are (digest mismatch, RNG drift, fp16 op, changed eps), and the stop leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from protocol.results import ProbeSummary
from workers.probe import parse_steps

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


# where two runs' step lines first differ (step, rank, tensor): what the audit's exactness does, kept small here
def _index(lines: Iterable[Mapping[str, Any]]) -> dict[tuple[int, int], Mapping[str, str]]:
    out: dict[tuple[int, int], Mapping[str, str]] = {}
    for rec in lines:
        digests = rec.get("digests")
        if digests is not None:
            out[(int(rec["step"]), int(rec["rank"]))] = digests
    return out


def first_mismatch(
    steps_a: Iterable[Mapping[str, Any]], steps_b: Iterable[Mapping[str, Any]]
) -> tuple[int, int, str] | None:
    """First (step, rank, tensor name) whose digests differ, in step, rank, name order; None when all agree.

    A (step, rank) present on one side only, or a name present on one side only, is a mismatch too
    (tensor name "<missing step>" or the missing name).
    """
    a = _index(steps_a)
    b = _index(steps_b)
    for key in sorted(set(a) | set(b)):
        step, rank = key
        if key not in a or key not in b:
            return step, rank, "<missing step>"
        da, db = a[key], b[key]
        for name in sorted(set(da) | set(db)):
            if da.get(name) != db.get(name):
                return step, rank, name
    return None


def run_probe(out: Path, steps: int, env: dict[str, str] | None = None, args: list[str] | None = None) -> int:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "workers.probe", "--out", str(out / "pkg"), "--steps", str(steps),
        "--digest-steps", f"0-{steps - 1}", "--watch-steps", "0-3", "--ckpt-dir", str(out / "ckpt"),
        "--", "tiny_trainer.py", *(args or []),
    ]  # fmt: skip
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    return subprocess.run(cmd, cwd=FIXTURES, env=full_env, capture_output=True, timeout=120, check=False).returncode


def lines(out: Path) -> list[dict]:
    recs = []
    for rank in (0, 1):
        recs += [json.loads(x) for x in (out / "pkg" / f"steps.rank{rank}.jsonl").read_text().splitlines()]
    return recs


def summary(out: Path, rank: int) -> dict:
    return json.loads((out / "pkg" / f"probe.rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("baseline")
    assert run_probe(out, 10) == 0
    return out


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("faulty")
    env = {"TINY_FAULT": "7:1", "TINY_EXTRA_RAND_FROM": "8", "TINY_FP16_STEP": "2"}
    shim = str(REPO / "workers" / "rehearsal" / "shim")  # the rehearsal's torch shim: recorded, changes no bits
    assert run_probe(out, 10, {**env, "PYTHONPATH": os.pathsep.join([str(REPO), shim])}) == 0
    return out


def test_parse_steps() -> None:
    assert parse_steps("0-3,7") == {0, 1, 2, 3, 7}
    assert parse_steps("none") == set()
    assert parse_steps("") == set()


def test_step_lines_and_recipe(baseline: Path) -> None:
    recs = lines(baseline)
    assert sorted((r["rank"], r["step"]) for r in recs) == [(r, s) for r in (0, 1) for s in range(10)]
    r0 = [r for r in recs if r["rank"] == 0]
    assert [round(r["lr"][0], 12) for r in r0[:4]] == [0.0, round(1e-3 / 3, 12), round(2e-3 / 3, 12), 1e-3]
    assert all(r["digests"] and r["combined"] and r["forbidden"] == [] for r in recs)
    names = set(r0[0]["digests"])
    assert {"param/head.weight", "param/vit.weight", "optim/head.weight/exp_avg"} <= names
    assert {"optim/head.weight/exp_avg_sq", "optim/head.weight/step"} <= names
    assert not any(n.startswith("optim/vit.") for n in names)  # frozen: no optimizer state
    rec = summary(baseline, 0)["observed_recipe"]
    assert rec["optimizer"] == "AdamW" and rec["betas"] == [0.9, 0.95] and rec["eps"] == 1e-8
    assert rec["max_grad_norm"] == 1.0 and rec["warmup_steps"] == 3 and rec["weight_decay"] == 0.01
    assert rec["frozen"] == ["vit", "Tiny#0"]  # the ViT inside the model, the reference copy outside it
    assert summary(baseline, 1)["observed_recipe"] == rec
    assert summary(baseline, 0)["final_digests"] == r0[-1]["digests"]


def test_each_rank_summary_is_an_orch_probe_document(baseline: Path) -> None:
    for rank in (0, 1):
        s = ProbeSummary.model_validate(summary(baseline, rank))
        assert (s.rank, s.world_size, s.complete, s.steps) == (rank, 2, True, 10)
        assert s.observed_recipe is not None and s.observed_recipe.optimizer == "AdamW" and s.checkpoint_file


def test_adam_state_fault_is_located_exactly(baseline: Path, faulty: Path) -> None:
    base, bad = lines(baseline), lines(faulty)
    assert first_mismatch(base, base) is None
    assert first_mismatch(base, bad) == (7, 1, "optim/head.weight/exp_avg_sq")
    at7 = {(r["rank"], r["step"]): r["digests"] for r in bad}
    ref7 = {(r["rank"], r["step"]): r["digests"] for r in base}
    assert at7[(0, 7)] == ref7[(0, 7)]  # the other rank is untouched at that step (the torch shim changed nothing)
    assert "wait_for_unshard outside inference mode" in summary(faulty, 0)["host_controls"]["torch_compat"]
    assert "torch_compat" not in summary(baseline, 0)["host_controls"]
    differ = {n for n in ref7[(1, 7)] if ref7[(1, 7)][n] != at7[(1, 7)][n]}
    assert differ == {"optim/head.weight/exp_avg_sq", "param/head.weight"}  # the state and the update it fed


def test_extra_rand_moves_rng_fingerprint_from_that_step(baseline: Path, faulty: Path) -> None:
    base = {(r["rank"], r["step"]): r["rng"]["cpu"] for r in lines(baseline)}
    bad = {(r["rank"], r["step"]): r["rng"]["cpu"] for r in lines(faulty)}
    for (rank, step), fp in base.items():
        assert (bad[(rank, step)] == fp) == (step < 8), (rank, step)


def test_fp16_matmul_reported_with_op_name(baseline: Path, faulty: Path) -> None:
    seen = [(r["rank"], f["step"], f["op"], f["dtype"]) for r in lines(faulty) for f in r["forbidden"]]
    assert (0, 2, "aten.mm.default", "float16") in seen and (1, 2, "aten.mm.default", "float16") in seen
    assert {s for _, s, _, _ in seen} == {2}
    assert all(r["forbidden"] == [] for r in lines(baseline))


def test_changed_eps_shows_in_observed_recipe(tmp_path: Path) -> None:
    assert run_probe(tmp_path, 2, args=["--eps", "1e-6"]) == 0
    assert summary(tmp_path, 0)["observed_recipe"]["eps"] == 1e-6


def test_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    """A trainer with a long-lived child and a cleanup that hangs still ends, child included."""
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {"TINY_CHILD_PIDS": str(pids), "TINY_HANG": "1", "ORCH_PROBE_STOP_GRACE_S": "2"}
    assert run_probe(tmp_path, 3, env) == 0
    children = [int(p.name.split(".")[2]) for p in pids.iterdir()]
    assert len(children) == 2
    alive = [p for p in children if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    assert psutil.Process().children(recursive=True) == []
    assert summary(tmp_path, 0)["complete"] and (tmp_path / "ckpt" / "rank1.pt").exists()


def test_trainer_that_ends_early_fails(tmp_path: Path) -> None:
    assert run_probe(tmp_path, 6, args=["--total-steps", "4"]) != 0
    assert summary(tmp_path, 0)["complete"] is False and summary(tmp_path, 0)["steps"] == 4
