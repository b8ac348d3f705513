"""Step times the trainer cannot fake: the FIFO clock of the train worker against the probe's own clock.

Pure checks, the watcher with a real writer process, and real r3-mini runs whose candidate runs its clocks at 0.8x.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from protocol.clock import compare, independent_durations, read_arrivals
from workers.clock import StepClock

REPO = Path(__file__).resolve().parents[1]
ANCHOR = "        scheduler.step()\n"
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


def test_independent_durations_pair_start_and_end_lines() -> None:
    arrivals = [(0, "start", 0), (0, "end", 4_000_000_000), (1, "start", 4_010_000_000), (1, "end", 4_110_000_000)]
    assert independent_durations(arrivals) == {0: 4.0, 1: pytest.approx(0.1)}
    with pytest.raises(ValueError, match="repeated event"):
        independent_durations([*arrivals, (1, "end", 5_000_000_000)])


def test_windows_and_steps_beyond_their_tolerance_are_named() -> None:
    windows = [[10, 11], [12, 13]]
    independent = {s: 0.150 for s in range(10, 14)} | {0: 4.0}
    # the preemption measured on the busy 2-core host (12 ms in a 1.23 s step) passes; in a 0.3 s window it would
    # not (2 ms + 1%): on short steps the busy host's outliers are refused, never a 2% slow clock over every window
    long = {s: 1.2 for s in range(10, 14)} | {0: 4.0}
    one_off = {**long, 11: 1.2 - 0.012}
    cmp = compare(0, one_off, long, windows)
    assert cmp.bad == [] and cmp.max_step_abs == pytest.approx(0.012) and cmp.max_window_abs == pytest.approx(0.012)
    drift = {s: d * 0.98 for s, d in independent.items()}
    bad = compare(1, drift, independent, windows).bad
    assert [d.what for d in bad] == ["window w1 (steps 10-11)", "window w2 (steps 12-13)"]
    assert bad[0].line() == ("clock disagreement: rank 1 window w1 (steps 10-11): the probe timed 0.294000 s, the "
                             "train worker's independent clock 0.300000 s (tolerance 2 ms + 1%)")
    slow = {s: d * 0.8 for s, d in independent.items()}  # a 0.8x clock: 20% off every step, warm-up included
    cmp = compare(1, slow, independent, windows)
    assert [d.what for d in cmp.bad][:2] == ["window w1 (steps 10-11)", "window w2 (steps 12-13)"]
    assert "step 0" in [d.what for d in cmp.bad] and cmp.max_step_rel == pytest.approx(0.2)
    missing = compare(0, {10: 0.1}, {10: 0.1, 11: 0.1}, [[10, 11]]).bad
    assert [d.what for d in missing] == ["step 11 (seen by one clock only)"]


def test_step_clock_stamps_lines_of_another_process_when_they_are_sent_not_read(tmp_path: Path) -> None:
    clock = StepClock(1)
    clock.bind()  # the kernel queues and stamps from here on; the reading thread starts long after the writer ended
    writer = textwrap.dedent(f"""
        import socket, time
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.connect("\\0" + {clock.name!r})
        for step, pause in enumerate((0.05, 0.2, 0.1)):
            s.send(f"0 {{step}} start".encode()); time.sleep(pause); s.send(f"0 {{step}} end".encode())
        s.send(b"garbage")
    """)
    subprocess.run([sys.executable, "-c", writer], check=True, timeout=30)
    time.sleep(0.5)
    clock.start()
    time.sleep(0.2)
    clock.stop()
    durations = independent_durations(clock.arrivals[0])
    assert sorted(durations) == [0, 1, 2]
    for step, pause in enumerate((0.05, 0.2, 0.1)):
        assert pause <= durations[step] < pause + 0.03, durations
    assert clock.malformed == 1 and clock.unstamped == 0
    clock.write_arrivals(tmp_path / "a.jsonl", 0)
    assert independent_durations(read_arrivals(tmp_path / "a.jsonl")) == pytest.approx(durations)


def _attacked_r3_mini(tmp_path: Path, mode: str) -> Path:
    import shutil

    tree = tmp_path / "r3_mini"
    shutil.copytree(REPO / "examples" / "r3_mini", tree, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "train" / "clock_attack.py").write_text(ATTACK.format(mode=mode))
    trainer = tree / "train" / "online_rl.py"
    text = trainer.read_text()
    assert text.count(ANCHOR) == 1
    call = '        __import__("train.clock_attack").clock_attack.install()\n'
    trainer.write_text(text.replace(ANCHOR, ANCHOR + call))
    return tree


@pytest.mark.slow
def test_train_package_refuses_a_probe_clock_patched_to_run_at_0_8x(tmp_path: Path) -> None:
    """The candidate rewrites the probe's bound clock itself: only the train worker's FIFO clock can see it."""
    from test_workers import run_worker, write_spec

    tree = _attacked_r3_mini(tmp_path, "probe")
    spec = write_spec(tmp_path, "train-C", "train", sealed_dir=str(tree), script="train/online_rl.py",
                      args=["--debug", "True"], arm_label="C", arm="candidate")
    proc = run_worker("train", spec, tree)
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("train: clock disagreement: rank ") and "independent clock" in line, line
    assert " window w1 (steps 10-11): the probe timed " in line and "(tolerance 2 ms + 1%)" in line, line
    assert line.endswith(": refused")
    assert not (tmp_path / "train-C" / "result.json").exists()


@pytest.mark.slow
def test_launch_refuses_a_candidate_whose_clocks_run_at_0_8x(tmp_path: Path) -> None:
    """A real r3-mini run (2 CPU ranks): the candidate patches time.perf_counter, time.monotonic, ... and the
    probe's clock; train-C is refused naming the clock disagreement, nothing later runs, no audit is written."""
    from test_audit_e2e import GIT, small_protocol
    from test_launch import env, launch_cmd, make_project, only_run, orch, records

    proj = make_project(tmp_path)
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=proj, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "baseline"], cwd=proj, check=True)
    attacked = _attacked_r3_mini(tmp_path / "attack", "all")
    for rel in ("train/clock_attack.py", "train/online_rl.py"):
        (proj / "examples" / "r3_mini" / rel).write_text((attacked / rel).read_text())
    data = yaml.safe_load((proj / "protocol" / "r3_mini.yaml").read_text())
    switches = dict(data["arms"]["baseline"]["switches"])
    data["arms"] = {
        "baseline": {"commitment": "manifests/r3_mini.json", "source": {"git": "HEAD"}, "switches": switches},
        "candidate": {"commitment": "manifests/cand.json", "source": "tree", "switches": dict(switches),
                      "under_evaluation": True},
    }
    small_protocol(data)
    protocol = proj / "protocol" / "attack.yaml"
    protocol.write_text(yaml.safe_dump(data, sort_keys=False))
    frozen = subprocess.run(orch("freeze", "--protocol", str(protocol), "--arm", "candidate", "-o",
                                 "manifests/cand.json", cwd=proj), cwd=proj, env=env(), capture_output=True,
                            text=True, timeout=60)
    assert frozen.returncode == 0, frozen.stderr
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
    closes = {r["package"]: r for r in records(home) if r["status"] != "open"}
    assert closes["train-C"]["status"] == "failed" and "clock disagreement" in closes["train-C"]["note"]
    # the baseline's own step times agreed with the train worker's clock, and say by how much
    a = json.loads((run_dir / "packages" / "train-A" / "result.json").read_text())
    for rank in a["ranks"]:
        clock = rank["clock"]
        assert clock["source"] == "socket" and clock["steps_checked"] == 16 and clock["windows_checked"] == 3
        assert clock["window_tol"] == [0.002, 0.01] and clock["max_window_rel"] <= 0.01
    assert len(a["quiet_host"]["load_start"]) == 3 and a["quiet_host"]["nvml"]
