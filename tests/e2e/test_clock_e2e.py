"""Step times the trainer cannot fake, on real runs of the minimal trainer (2 CPU ranks;
launchutil.make_minimal_project: nothing here is about r3-mini) whose candidate runs its clocks at 0.8x: the train
worker alone, and a whole launch. Each step sleeps 50 ms more (MINI_STEP_S, the same in every arm), so that a window
lasts well beyond the clock check's 2 ms tolerance and 0.8x of it is always outside."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from launchutil import (
    MINIMAL,
    MINIMAL_PROTOCOL,
    env,
    freeze,
    launch_cmd,
    make_minimal_project,
    only_run,
    orch,
    records,
)
from workerutil import run_worker, write_spec

REPO = Path(__file__).resolve().parents[2]
ANCHOR = "        sched.step()\n"
PACE = "0.05"  # seconds of sleep a step (MINI_STEP_S)
ATTACK = '''
"""A candidate that makes its steps look faster: every clock it can reach runs at 0.8x (identical compute)."""
import time

from torch.optim.optimizer import _global_optimizer_post_hooks

MODE = "{mode}"
_done = False


def install() -> None:
    global _done
    if _done:
        return
    _done = True
    real = time.perf_counter
    t0 = real()

    def slow() -> float:
        return t0 + (real() - t0) * 0.8

    if MODE == "all":
        for name in ("perf_counter", "monotonic"):
            setattr(time, name, slow)
        time.perf_counter_ns = time.monotonic_ns = lambda: int(slow() * 1e9)
    # the probe's own bound clock, found through its optimizer hook's globals
    for hook in list(_global_optimizer_post_hooks.values()):
        found = getattr(getattr(hook, "__func__", hook), "__globals__", {{}})
        if "_perf_counter" in found:
            found["_perf_counter"] = slow
'''


def _attacked_minimal(tmp_path: Path, mode: str) -> Path:
    import shutil

    tree = tmp_path / "minimal"
    tree.mkdir(parents=True)
    for name in ("train.py", "score.py"):
        shutil.copy(MINIMAL / name, tree / name)
    (tree / "clock_attack.py").write_text(ATTACK.format(mode=mode))
    trainer = tree / "train.py"
    text = trainer.read_text()
    assert text.count(ANCHOR) == 1
    call = '        __import__("clock_attack").install()\n'
    trainer.write_text(text.replace(ANCHOR, ANCHOR + call))
    return tree


def test_train_package_refuses_a_probe_clock_patched_to_run_at_0_8x(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The candidate rewrites the probe's bound clock itself: only the train worker's FIFO clock can see it."""
    tree = _attacked_minimal(tmp_path, "probe")
    monkeypatch.setenv("MINI_STEP_S", PACE)  # the worker's environment reaches the ranks
    spec = write_spec(tmp_path, "train-C", "train", sealed_dir=str(tree), script="train.py", args=[],
                      arm_label="C", arm="candidate")
    proc = run_worker("train", spec, tree)
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("train: clock disagreement: rank ") and "independent clock" in line, line
    assert " window w1 (steps 10-11): the probe timed " in line and "(tolerance 2 ms + 1%)" in line, line
    assert line.endswith(": refused")
    assert not (tmp_path / "train-C" / "result.json").exists()


def test_launch_refuses_a_candidate_whose_clocks_run_at_0_8x(tmp_path: Path) -> None:
    """A real run (2 CPU ranks): the candidate patches time.perf_counter, time.monotonic, ... and the
    probe's clock; train-C is refused naming the clock disagreement, nothing later runs, no audit is written.

    It is also the suite's failing-package launch: a package that fails stops the run (each later package closed
    not-run, the run failed, no audit), and `orch audit` of that run writes nothing and shows no score."""
    proj = make_minimal_project(tmp_path)
    attacked = _attacked_minimal(tmp_path / "attack", "all")
    for rel in ("clock_attack.py", "train.py"):
        (proj / "trainer" / rel).write_text((attacked / rel).read_text())
    data = yaml.safe_load((proj / "protocol" / MINIMAL_PROTOCOL).read_text())
    switches = dict(data["arms"]["baseline"]["switches"])
    data["arms"] = {
        "baseline": {"commitment": "manifests/minimal.json", "source": {"git": "HEAD"}, "switches": switches},
        "candidate": {"commitment": "manifests/cand.json", "source": "tree", "switches": dict(switches),
                      "under_evaluation": True},
    }
    data["launcher"]["env"]["MINI_STEP_S"] = PACE  # 16 steps: the baseline's three windows are cross-checked
    protocol = proj / "protocol" / "attack.yaml"
    protocol.write_text(yaml.safe_dump(data, sort_keys=False))
    freeze(proj, protocol, "manifests/cand.json", "candidate")
    home = tmp_path / "home"
    launched = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True,
                              text=True, timeout=500)
    assert launched.returncode == 1, launched.stderr[-3000:]
    summary = json.loads(launched.stdout.strip().splitlines()[-1])
    assert summary["status"] == "failed" and summary["packages"]["train-A"] == "ok"
    assert summary["packages"]["train-C"] == "failed" and summary["packages"]["train-B"] == "not-run"
    last = launched.stderr.strip().splitlines()[-1]
    assert "package train-C failed" in last and "clock disagreement: rank " in last, last
    assert "the trainer replaced time.monotonic (from step 1), time.monotonic_ns (from step 1)" in last, last
    run_dir = only_run(home)
    assert not (run_dir / "audit.json").exists()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    closes = {r["package"]: r for r in records(home) if r["run_id"] == run_dir.name and r["status"] != "open"}
    assert closes["train-C"]["status"] == "failed" and "clock disagreement" in closes["train-C"]["note"]
    assert {name: r["status"] for name, r in closes.items()} == {
        "checks": "ok", "train-A": "ok", "reload-A": "ok", "train-C": "failed", "reload-C": "not-run",
        "train-B": "not-run", "reload-B": "not-run", "watch-C": "not-run", "score": "not-run"}
    # orch audit of that run writes nothing and shows no score
    shown = subprocess.run(orch("audit", run_dir.name, "--home", str(home), cwd=proj), cwd=proj, env=env(),
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 1 and "missing or failed: package train-C: failed (exit " in shown.stdout + shown.stderr
    assert not (run_dir / "audit.json").exists() and "dev_mse" not in shown.stdout + shown.stderr
    # the baseline's own step times agreed with the train worker's clock, and say by how much
    a = json.loads((run_dir / "packages" / "train-A" / "result.json").read_text())
    for rank in a["ranks"]:
        clock = rank["clock"]
        assert clock["source"] == "socket" and clock["steps_checked"] == 16 and clock["windows_checked"] == 3
        assert clock["window_tol"] == [0.002, 0.01] and clock["max_window_rel"] <= 0.01
    assert len(a["quiet_host"]["load_start"]) == 3 and a["quiet_host"]["gpu_query"]
