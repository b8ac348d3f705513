"""The host watch: real processes sampled while a stand-in package writes its step lines; a foreign burner inside a
window names that window, a descendant or a process carrying the package's token is never foreign; the summary is
recomputed from the recorded file, and an altered file is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ledger.verdict.decide.host_watch import (
    CPU_SHARE_MAX,
    busy_windows,
    host_watch_block,
    load_logs,
    window_figures,
)
from orchestrator.isolation.stragglers import TOKEN_VAR
from orchestrator.run.host_watch import HostWatcher, descendants, package_devices, read_proc, snapshot
from protocol.host.quiet_host import HOST_WATCH_FILE, HostWatchLog, WatchGpu, WatchSample
from protocol.run_record import PackageEntry

BURN = ("import os,sys,time\nos.sched_setaffinity(0,{int(sys.argv[1])})\nt=time.time()\n"
        "while time.time()-t<float(sys.argv[2]): pass\n")
SLEEP = "import os,sys,time\nos.sched_setaffinity(0,{int(sys.argv[1])})\ntime.sleep(float(sys.argv[2]))\n"


def _named(tmp_path: Path, name: str) -> str:
    """This Python under a name of its own (the process name is the link's): other jobs' processes on a shared host
    are never mistaken for the test's."""
    link = tmp_path / name
    if not link.exists():
        link.symlink_to(sys.executable)
    return str(link)


def _orphan(exe: str, code: str, *args: str, env: dict[str, str] | None = None) -> int:
    """A process outside this test's tree (its shell exits at once: it is re-parented), as another user's job is."""
    quoted = " ".join(f"'{a}'" for a in args)
    out = subprocess.run(["sh", "-c", f"{exe} -c \"$CODE\" {quoted} >/dev/null 2>&1 & echo $!"], capture_output=True,
                         text=True, check=True, env={**(env or os.environ), "CODE": code})
    return int(out.stdout.strip())


def _end(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def _steps(pkg: Path, upto: int, start: int = 0) -> None:
    with open(pkg / "steps.rank0.jsonl", "a") as fh:
        for step in range(start, upto):
            fh.write(json.dumps({"step": step}) + "\n")


def _run_windows(tmp_path: Path, during_w2: list[str]) -> tuple[HostWatchLog, dict, list[str]]:
    """A stand-in train package: a pinned, sleeping "rank" (descendant, core 0) and its step lines; inside steps
    12-13 (w2) the given named programs burn core 0. Returns the samples, the launch's figures and busy sentences."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    rank = subprocess.Popen([_named(tmp_path, "orchtestrank"), "-c", SLEEP, "0", "30"])
    watcher = HostWatcher(pkg, [], interval_s=0.1)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while os.sched_getaffinity(rank.pid) != {0} and time.monotonic() < deadline:
            time.sleep(0.05)  # the rank pins itself as it starts
        watcher.start()
        _steps(pkg, 10)
        time.sleep(0.6)  # w1: steps 10-11
        _steps(pkg, 12, 10)
        time.sleep(0.3)  # a few quiet samples of w2 first: the burners' intervals lie inside w2 only
        pids += [_orphan(_named(tmp_path, prog), BURN, "0", "1.5") for prog in during_w2]
        time.sleep(1.5)  # w2: steps 12-13
        for pid in pids:
            _end(pid)
        time.sleep(0.3)
        _steps(pkg, 14, 12)
        time.sleep(0.6)  # w3: steps 14-15
        _steps(pkg, 16, 14)
        time.sleep(0.2)
        ref = watcher.finish()
    finally:
        for pid in pids:
            _end(pid)
        rank.kill()
        rank.wait()
    path = pkg / HOST_WATCH_FILE
    log = HostWatchLog.model_validate_json(path.read_bytes())
    assert ref.samples == len(log.samples) > 10 and oct(path.stat().st_mode & 0o777) == "0o444"
    assert {tuple(b) for s in log.samples for b in s.blocks} == {(0,)}, "the rank's pinned core is its block"
    block = host_watch_block({"X": log}, ["X"], steps=16, warmup=10, window=2)
    assert block["busy"] == busy_windows(block)
    return log, block["launches"]["X"], block["busy"]


def test_a_foreign_burner_inside_a_window_names_that_window(tmp_path: Path) -> None:
    # six processes of one name on the rank's core: on a shared host busy with other jobs they still show
    log, launch, busy = _run_windows(tmp_path, ["orchforeignburn"] * 6)
    pairs = list(zip(log.samples, log.samples[1:], strict=False))
    inside = [b for a, b in pairs if a.steps_done == b.steps_done == 12]
    outside = [b for a, b in pairs if b.steps_done != 12]
    listed = [any(p.name == "orchforeignburn" for p in s.top) for s in inside]
    assert sum(listed) >= len(inside) // 3 and not any(p.name == "orchforeignburn" for s in outside for p in s.top)
    w2 = launch["windows"]["w2"]
    # they burned the rank's own core, alone there but for other jobs of a shared host: most of that core
    assert w2["cpu_share"] > CPU_SHARE_MAX and w2["blocks"] == [[0]] and w2["foreign_cores"] > 0.5
    named = [s for s in busy if s.startswith("train-X w2 (steps 12-13)")]
    assert len(named) == 1 and "of the busiest rank's cores" in named[0]


def test_a_descendant_or_a_token_carrier_burning_is_not_foreign(tmp_path: Path) -> None:
    token = "t" * 32
    env = {**os.environ, TOKEN_VAR: token}
    # a burning descendant; an orphan carrying the package's token (a Slurm rank) and one carrying another's
    child = subprocess.Popen([_named(tmp_path, "orchownburn"), "-c", BURN, "1", "5"], env=env)
    ours = _orphan(_named(tmp_path, "orchtokenburn"), BURN, "1", "5", env=env)
    theirs = _orphan(_named(tmp_path, "orchotherburn"), BURN, "1", "5", env={**env, TOKEN_VAR: "o" * 32})
    watcher = HostWatcher(tmp_path, [])
    try:
        procs = snapshot()
        assert watcher.observe(procs, descendants(procs, os.getpid())) == {}  # the base
        time.sleep(1.5)
        procs = snapshot()
        foreign = watcher.observe(procs, descendants(procs, os.getpid()))
    finally:
        for pid in (ours, theirs):
            _end(pid)
        child.kill()
        child.wait()
    assert theirs in foreign and foreign[theirs][1] > 0, "another package's burner is foreign"
    assert foreign[theirs][0].name == "orchotherburn"
    assert child.pid not in foreign and ours not in foreign and os.getpid() not in foreign
    assert procs[ours].name == "orchtokenburn" and procs[ours].ppid != os.getpid()  # alive, outside our tree


def test_no_gpu_is_skipped_cleanly_and_devices_come_from_the_grant(tmp_path: Path) -> None:
    assert package_devices("cpu", {"CUDA_VISIBLE_DEVICES": "0"}) == []
    assert package_devices("cuda", {"CUDA_VISIBLE_DEVICES": "3,1"}) == [3, 1]
    assert package_devices("cuda", {"CUDA_VISIBLE_DEVICES": "GPU-abc"}) is None
    assert package_devices("cuda", {}) is None
    watcher = HostWatcher(tmp_path, None, interval_s=0.05)  # every GPU: none here, or this host's
    watcher.start()
    time.sleep(0.2)
    watcher.finish()
    log = HostWatchLog.model_validate_json((tmp_path / HOST_WATCH_FILE).read_bytes())
    assert log.gpu_query == "ok" or log.gpu_query.startswith(("no NVML", "NVML error")), log.gpu_query
    assert log.gpu_query != "ok" or log.gpus, "NVML answered: the GPUs it watched are listed"
    assert log.samples and log.sampler_cpu_s >= 0 and log.wall_s > 0


def test_a_file_the_package_left_under_that_name_is_replaced(tmp_path: Path) -> None:
    (tmp_path / HOST_WATCH_FILE).write_text('{"forged": true}')
    watcher = HostWatcher(tmp_path, [], interval_s=0.05)
    watcher.start()
    ref = watcher.finish()
    HostWatchLog.model_validate_json((tmp_path / HOST_WATCH_FILE).read_bytes())
    assert ref.file == HOST_WATCH_FILE and len(ref.sha256) == 64


def test_proc_reading_agrees_with_the_kernel() -> None:
    me = read_proc(os.getpid())
    assert me is not None and me.ppid == os.getppid() and me.core in os.sched_getaffinity(0)
    procs = snapshot()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        tree = descendants({**procs, **{child.pid: read_proc(child.pid)}}, os.getpid())  # type: ignore[dict-item]
        assert {os.getpid(), child.pid} <= tree and 1 not in tree
    finally:
        child.kill()
        child.wait()


def _sample(t: float, done: int, core0: float = 0.0, gpu: list[WatchGpu] | None = None) -> WatchSample:
    return WatchSample(t_s=t, steps_done=done, foreign_s={"0": core0} if core0 else {}, blocks=[[0], [1]],
                       gpu_foreign=gpu or [])


def _log(samples: list[WatchSample]) -> HostWatchLog:
    return HostWatchLog(interval_s=0.5, cpus=[0, 1], gpus=[0], gpu_query="ok", cpu_query="ok", wall_s=10.0,
                        sampler_cpu_s=0.1, samples=samples)


def test_windows_map_by_the_step_counter_and_an_edge_interval_counts_for_both() -> None:
    samples = [_sample(0.0, 0), _sample(1.0, 10), _sample(2.0, 11, core0=0.2), _sample(3.0, 12, core0=0.9),
               _sample(4.0, 14), _sample(5.0, 16)]
    log = _log(samples)
    w1, w2, w3 = (window_figures(log, a, a + 1) for a in (10, 12, 14))
    # w1: intervals ending at 10, 11, 12 (the last one ran steps 11-12); w2: ending 12, 14; w3: ending 14, 16
    assert (w1["intervals"], w2["intervals"], w3["intervals"]) == (3, 2, 2)
    assert w1["cpu_share"] == pytest.approx(1.1 / 3, abs=1e-4) and w2["cpu_share"] == pytest.approx(0.45)
    assert w3["cpu_share"] == 0.0 and w1["blocks"] == [[0], [1]]
    block = host_watch_block({"A": log, "B": None}, ["A", "B"], steps=16, warmup=10, window=2)
    assert block["busy"] == [] and block["unwatched"] == ["B"] and "not watched: train-B" in block["words"]
    # the sentences are recomputed from the figures and the block's own threshold
    strict = {**block, "threshold": {**block["threshold"], "cpu_share": 0.4}}
    assert [s.split(":")[0] for s in busy_windows(strict)] == ["train-A w2 (steps 12-13)"]


def test_a_foreign_gpu_process_makes_its_window_busy() -> None:
    gpu = [WatchGpu(index=0, name="python3")]
    log = _log([_sample(0.0, 0), _sample(1.0, 14), _sample(2.0, 15, gpu=gpu), _sample(3.0, 16)])
    block = host_watch_block({"C": log}, ["C"], steps=16, warmup=10, window=2)
    assert [s.split(":")[0] for s in block["busy"]] == ["train-C w3 (steps 14-15)"]
    assert "foreign GPU processes: python3 (GPU 0)" in block["busy"][0]
    assert block["threshold"]["gpu_foreign"] == 0 and block["threshold"]["cpu_share"] == CPU_SHARE_MAX


def test_the_audit_reads_the_recorded_file_and_refuses_an_altered_one(tmp_path: Path) -> None:
    pkg = tmp_path / "packages" / "train-A"
    pkg.mkdir(parents=True)
    watcher = HostWatcher(pkg, [], interval_s=0.05)
    watcher.start()
    _steps(pkg, 16)
    time.sleep(0.2)
    ref = watcher.finish()
    entry = PackageEntry(name="train-A", kind="train", arm_label="A", arm="baseline", env={}, status="ok",
                         host_watch=ref)
    run = SimpleNamespace(package=lambda name: entry if name == "train-A" else None)
    ev = SimpleNamespace(run=run, run_dir=tmp_path)
    logs, problems = load_logs(ev, ["A", "C"])  # type: ignore[arg-type]
    assert problems == [] and logs["A"] is not None and logs["C"] is None
    path = pkg / HOST_WATCH_FILE
    path.chmod(0o644)
    path.write_bytes(path.read_bytes().replace(b'"steps_done":16', b'"steps_done":15'))
    logs, problems = load_logs(ev, ["A"])  # type: ignore[arg-type]
    assert logs["A"] is None and problems == [
        "packages/train-A/host_watch.json: sha256 is not the one run.json recorded (the host watch's samples were "
        "altered)"
    ]
    path.unlink()
    assert load_logs(ev, ["A"])[1] == ["packages/train-A/host_watch.json: missing (run.json records its sha256)"]  # type: ignore[arg-type]


def test_a_fifo_or_a_link_at_the_step_file_never_blocks_the_watch(tmp_path: Path) -> None:
    """Issue 49's battery: train-C replaced its step file with a FIFO, and the watch's sampler (in orch, outside the
    package) blocked opening it, so orch hung at the package's end. Now it reads nothing from it and goes on."""
    import threading

    from orchestrator.run.host_watch import HostWatcher

    os.mkfifo(tmp_path / "steps.rank0.jsonl")
    watcher = HostWatcher(tmp_path, [])
    done: list[int] = []
    reader = threading.Thread(target=lambda: done.append(watcher._read_steps()), daemon=True)
    reader.start()
    reader.join(10)
    assert done == [0]
    (tmp_path / "steps.rank0.jsonl").unlink()
    (tmp_path / "real.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    (tmp_path / "steps.rank0.jsonl").symlink_to(tmp_path / "real.jsonl")
    assert watcher._read_steps() == 0  # a link is not followed
    (tmp_path / "steps.rank0.jsonl").unlink()
    (tmp_path / "steps.rank0.jsonl").write_text('{"step": 0}\n')
    assert watcher._read_steps() == 1
