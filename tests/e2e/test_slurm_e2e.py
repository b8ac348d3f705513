"""orch on a real Slurm cluster started by this module (tests/e2e/slurm_cluster.py: slurmctld, three slurmd, slurmdbd on
MariaDB, munge): r3-mini (the minimal trainer in `make test`'s subset) across two nodes (gloo, one rank a node)
started by sbatch, audited exact and reconciled with sacct; a node that cannot read the sealed copy named by its
salted hash; killed ranks on one node, a node dying mid-train and orch killed mid-train each failing the run cleanly
(nothing left on any node); the cluster itself stopping without leaving a process. All seven with
ORCH_SLURM_TESTS=1 (`make test-slurm`); `make test` (so CI, where .ci/run lets it install Debian's packages) runs the
acceptance subset (marked slurm_ci); skipped, saying why, where the packages or root are missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from launchutil import MINIMAL_PROTOCOL, make_minimal_project
from slurm_cluster import Cluster, _alive, missing

from ledger.cost.store import Ledger
from orchestrator.slurm.cluster import node_hash

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "protocol" / "r3_mini_slurm2.yaml"

# ORCH_SLURM_TESTS=1 (`make test-slurm`): every test, the two-node run on the shipped protocol as it is (~4-6 min
# alone on the shared 2-core host). ORCH_SLURM_TESTS=ci (`make test`, so CI, with `-m slurm_ci`): the acceptance
# subset on the minimal trainer (launchutil.make_minimal_project) under the shipped protocol's Slurm launcher
# (minimal_protocol; audited like any run): what it tests is orch on Slurm, not r3-mini. Unset: every test skips.
MODE = os.environ.get("ORCH_SLURM_TESTS", "")
CI = MODE == "ci"

pytestmark = [
    pytest.mark.skipif(MODE not in ("1", "ci"), reason="the local Slurm cluster runs with ORCH_SLURM_TESTS=1 "
                       "(make test-slurm; make test runs its acceptance subset)"),
    pytest.mark.skipif(bool(missing()), reason=f"no local Slurm cluster: {', '.join(missing())} missing"),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="orch-slurm-", dir="/tmp"))  # short: the munge socket path is bounded
    c = Cluster(root)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        left = c.processes()
        shutil.rmtree(root, ignore_errors=True)
    assert left == [], f"processes of the test cluster outlived it: {left}"


def protocol(where: Path) -> Path:
    """The shipped Slurm protocol with one count-only GPU a node (so sacct accounts gres/gpu) and its base here."""
    text = SHIPPED.read_text().replace('base: ".."', f'base: "{REPO}"').replace("gpus_per_node: 0", "gpus_per_node: 1")
    where.mkdir(parents=True, exist_ok=True)
    path = where / "slurm.yaml"
    path.write_text(text)
    return path


def minimal_protocol(where: Path, prime: bool = False, pace: str | None = None) -> Path:
    """The minimal trainer's project in `where`, and its protocol under the shipped protocol's Slurm launcher (two
    nodes, one rank a node) with one count-only GPU a node; `prime`: measurement.compile: prime (the two-node test
    sees the prime span both nodes); `pace`: MINI_STEP_S, seconds of sleep a step (time to act while train-A runs)."""
    proj = make_minimal_project(where)
    shipped = yaml.safe_load(SHIPPED.read_text())["launcher"]
    data = yaml.safe_load((proj / "protocol" / MINIMAL_PROTOCOL).read_text())
    data["launcher"].update(nproc=shipped["nproc"], scheduler=shipped["scheduler"],
                            slurm={**shipped["slurm"], "gpus_per_node": 1})
    if prime:
        data["measurement"]["compile"] = "prime"
    if pace is not None:
        data["launcher"]["env"]["MINI_STEP_S"] = pace
    path = proj / "protocol" / "slurm.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def env(cluster: Cluster) -> dict[str, str]:
    out = {k: v for k, v in cluster.env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    return {**out, "PYTHONPATH": str(REPO)}


def orch(cluster: Cluster, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.orch", *args], capture_output=True, text=True,
                          cwd=REPO, env=env(cluster), timeout=timeout)


def sacct(cluster: Cluster, job: str) -> dict[str, list[str]]:
    out = cluster.run("sacct", "-j", job, "-n", "-P", "-o", "JobName%200,NNodes,AllocTRES%200,State").stdout
    return {line.split("|")[0]: line.split("|")[1:] for line in out.splitlines() if line}


def sbatch_wait(cluster: Cluster, argv: list[str], timeout: float) -> tuple[str, str, int]:
    """`sbatch ARGV` and its wait for the job's end: (job id, its final JobState, the batch script's exit status,
    128 + N when signal N ended it). Polled here every
    0.5 s: `sbatch --wait` sleeps 2, 8, then 32 s between its looks (while MinJobAge / 2 allows), which cost up to
    32 s after a job of minutes had ended."""
    done = subprocess.run(["sbatch", "--parsable", *argv], capture_output=True, text=True, cwd=REPO,
                          env=env(cluster), timeout=60)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while True:
        fields = dict(t.partition("=")[::2] for t in cluster.run("scontrol", "show", "job", "-o", job).stdout.split())
        state = fields.get("JobState", "")
        if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"):
            code, _, sig = fields.get("ExitCode", "1:0").partition(":")
            return job, state, int(code) if sig in ("", "0") else 128 + int(sig)
        assert time.monotonic() < deadline, f"job {job} still {state or 'unknown'} after {timeout} s"
        time.sleep(0.5)


@pytest.mark.slurm_ci
def test_two_nodes_run_exact_and_reconcile_with_sacct(cluster: Cluster, tmp_path: Path) -> None:
    """Started by sbatch, as on a GPU cluster (README's batch script): orch runs in the batch job's allocation."""
    home = tmp_path / "home"
    out, err = tmp_path / "job.json", tmp_path / "job.err"
    path = minimal_protocol(tmp_path, prime=True) if CI else protocol(tmp_path)
    _, state, rc = sbatch_wait(cluster, [
        "--nodes=2", "--ntasks-per-node=1", "--exclusive", "--gres=gpu:1", f"--output={out}", f"--error={err}",
        "--wrap", f"{sys.executable} -m orchestrator.cli.orch launch {path} --home {home} --json"],
        timeout=900)  # fmt: skip
    assert (state, rc) == ("COMPLETED", 0), err.read_text()[-3000:] if err.exists() else f"{state}, exit {rc}"
    doc = json.loads(out.read_text())
    run_dir = home / "runs" / doc["run_id"]
    audit = json.loads((run_dir / "audit.json").read_text())
    assert audit["exact"] is True and doc["verdict"] in ("accepted", "no difference shown")
    run = json.loads((run_dir / "run.json").read_text())
    job = run["slurm"]["job_id"]
    assert run["lock"]["kind"] == "slurm"  # never orch's flock lock
    assert run["slurm"]["nodes"] == [node_hash(home / "ledger", n) for n in ("n1", "n2")]
    train = json.loads((run_dir / "packages" / "train-A" / "result.json").read_text())
    assert train["world_size"] == 2 and [r["rank"] for r in train["ranks"]] == [0, 1]
    steps = json.loads((run_dir / "protocol.json").read_text())["measurement"]["steps"]
    assert all(r["clock"]["steps_checked"] == steps for r in train["ranks"])  # each node's own clock
    steps = sacct(cluster, job)
    for name in ("prime", "train-A", "train-C", "train-B", "watch-C"):  # the prime spans every node, as train does
        nnodes, tres, state = steps[f"{doc['run_id']}.{name}"]
        assert (nnodes, state) == ("2", "COMPLETED") and "gres/gpu=2" in tres, (name, tres)
    assert steps[f"{doc['run_id']}.reload-A"][0] == "1" and steps[f"{doc['run_id']}.seal"][0] == "2"
    assert "slurm: job " in err.read_text() and "salloc" not in err.read_text()  # the batch job's allocation
    records = {r.package: r for r in Ledger(home / "ledger" / "ledger.arrows").records(doc["run_id"])}
    assert records["train-A"].note is not None and records["train-A"].note.startswith(f"slurm job {job} steps ")
    assert records["train-A"].gpus == 2 and (records["train-A"].gpu_seconds or 0) > 0
    rec = orch(cluster, "ledger", "reconcile", "--home", str(home), "--json")
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout)["records"] == 10 and json.loads(rec.stdout)["mismatches"] == []  # 10 packages

    # a ledger whose figures are not what Slurm charged: each mismatch named
    other = tmp_path / "other"
    ledger = Ledger(other / "ledger" / "ledger.arrows")
    train_step = records["train-A"].note.split()[4].rstrip(":")  # type: ignore[union-attr]
    for package, note, gpu_s in (("train-A", f"slurm job {job} steps {train_step}: x", 1.0),
                                 ("train-B", f"slurm job {job} steps 999: x", 0.0)):
        ledger.append(run_id="R", package=package, kind="train", status="ok", gpus=2, gpu_seconds=gpu_s,
                      protocol_id="p" * 64, note=note)
    bad = orch(cluster, "ledger", "reconcile", "--home", str(other))
    assert bad.returncode == 1
    assert f"run R package train-A (job {job} steps {train_step}): ledger 1.0 GPU-s, sacct" in bad.stdout
    assert f"run R package train-B (job {job} steps 999): sacct has no step 999" in bad.stdout


def test_node_that_reads_another_sealed_copy_fails_the_run_named_by_hash(cluster: Cluster) -> None:
    """Started inside an allocation (sbatch): n3 does not see the shared folder; the run fails before any package."""
    if not cluster.skew:
        pytest.skip("no mount namespace for the skewed node here")
    where = cluster.root / "skew" / "case"  # on n3 this folder is another, empty one
    home = where / "home"
    out = where / "job.out"
    _, state, rc = sbatch_wait(cluster, [
        "--partition=skew", "--nodes=2", "--exclusive", f"--output={out}", "--wrap",
        f"{sys.executable} -m orchestrator.cli.orch launch {protocol(where)} --home {home}"], timeout=600)  # fmt: skip
    text = out.read_text()
    assert (state, rc) == ("FAILED", 1), text[-3000:]
    n3 = node_hash(home / "ledger", "n3")[:16]
    assert f"sealed copies differ across nodes before the first package: node {n3}: sealed copy of baseline is " \
           "unreadable" in text
    run_id = next((home / "runs").iterdir()).name
    records = {r.package: r for r in Ledger(home / "ledger" / "ledger.arrows").records(run_id)}
    assert records["checks"].status == "failed" and records["train-A"].status == "not-run"
    assert "n3" not in json.dumps(json.loads((home / "runs" / run_id / "run.json").read_text())["slurm"])


def _run_processes(run_id: str) -> dict[int, dict[str, str]]:
    """Processes of this host (every node of the test cluster) whose environment carries the run id."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        environ = dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)
        if environ.get("ORCH_RUN_ID") == run_id:
            found[int(entry.name)] = {"node": environ.get("SLURMD_NODENAME", ""), "cmd": cmd,
                                      "rank": environ.get("LOCAL_RANK", "")}  # torchrun sets it for its ranks only
    return found


def _inner_orch(where: str) -> list[int]:
    """`orch launch` processes inside an allocation (SLURM_JOB_ID set) whose command names `where`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "orchestrator.cli.orch launch" in cmd and where in cmd:
                if b"SLURM_JOB_ID=" in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def _launch_until_step(cluster: Cluster, tmp_path: Path, rank: int, step: int,
                       path: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    """`orch launch` of `path` (default: the shipped protocol) outside an allocation (so through salloc), running
    until train-A's rank `rank` logged `step` steps: (the process, the run id)."""
    home = tmp_path / "home"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.orch", "launch", str(path or protocol(tmp_path)),
                             "--home", str(home)], cwd=REPO, env=env(cluster), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    steps = None
    while time.monotonic() < deadline and proc.poll() is None:
        runs = list((home / "runs").glob("2*")) if (home / "runs").exists() else []
        steps = runs[0] / "packages" / "train-A" / f"steps.rank{rank}.jsonl" if runs else None
        if steps is not None and steps.exists() and len(steps.read_text().splitlines()) >= step:
            break
        time.sleep(0.5)
    if steps is None or proc.poll() is not None:
        proc.kill()
        raise AssertionError(f"train-A never reached step {step}: {proc.communicate()[1][-2000:]}")
    return proc, steps.parents[2].name


def _failed_cleanly(cluster: Cluster, home: Path, run_id: str) -> None:
    """Nothing of the run on any node, the allocation given back, train-A failed in the ledger with what Slurm
    charged, the rest not run, and no node name in the ledger or the run directory."""
    deadline = time.monotonic() + 60
    while _run_processes(run_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _run_processes(run_id) == {}  # nothing of the run on any node
    while cluster.run("squeue", "-h").stdout.strip() and time.monotonic() < deadline + 60:
        time.sleep(0.5)  # the job ends (COMPLETING for a moment)
    assert cluster.run("squeue", "-h").stdout.strip() == ""  # the allocation was given back
    records = {r.package: r for r in Ledger(home / "ledger" / "ledger.arrows").records(run_id)}
    assert records["train-A"].status == "failed" and records["reload-A"].status == "not-run"
    assert (records["train-A"].note or "").startswith("slurm job ") and (records["train-A"].gpu_seconds or 0) > 0
    named = re.compile(r"(?<![\w.-])n[123](?![\w-])")  # node names never in the ledger or the run directory
    assert not any(named.search(r.note or "") for r in records.values())
    for path in (home / "runs" / run_id).rglob("*"):
        if path.is_file() and path.suffix in (".json", ".log", ".jsonl", ".md"):
            assert not named.search(path.read_text(errors="replace")), path


@pytest.mark.slurm_ci
def test_killed_ranks_on_one_node_fail_the_run_with_nothing_left(cluster: Cluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = minimal_protocol(tmp_path, pace="0.5") if CI else None  # 16 steps of at least 0.5 s: time to kill
    proc, run_id = _launch_until_step(cluster, tmp_path, rank=1, step=3, path=path)
    try:
        ranks = [pid for pid, p in _run_processes(run_id).items() if p["node"] == "n2" and p["rank"]]
        assert ranks, _run_processes(run_id)
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert "package train-A failed" in err, err[-2000:]
    n2 = node_hash(home / "ledger", "n2")[:16]  # the worker's "node 1" (its index in the step) named by its hash
    assert re.search(rf"node {n2}: rank [01] was killed by signal 9 \(SIGKILL\)", err), err[-2000:]
    time.sleep(2)
    _failed_cleanly(cluster, home, run_id)


def test_node_dying_mid_train_fails_the_run_named_by_hash(cluster: Cluster, tmp_path: Path) -> None:
    """n2 dies as in a power loss (SIGKILL to its slurmd, its slurmstepds and all they run): Slurm marks it down
    and fails the step (NODE_FAIL); orch names it by its salted hash, accounts the package, and leaves nothing."""
    home = tmp_path / "home"
    proc, run_id = _launch_until_step(cluster, tmp_path, rank=0, step=3)
    try:
        victims = cluster.kill_node("n2")
        assert len(victims) >= 3, victims  # slurmd, a slurmstepd, what it runs
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.start_node("n2")  # ReturnToService=2: the node is back once its slurmd registers
    assert proc.returncode == 1, err[-3000:]
    n1, n2 = (node_hash(home / "ledger", n)[:16] for n in ("n1", "n2"))
    line = next(x for x in err.splitlines() if "package train-A failed" in x)
    assert f"node {n2}" in line and (f"Slurm reports node {n2} (DOWN" in line or f"node {n2}: no report" in line), line
    assert f"node {n1}: no report" not in line and f"Slurm reports node {n1}" not in line
    print(line)  # what the run said (pytest -s)
    _failed_cleanly(cluster, home, run_id)
    records = {r.package: r for r in Ledger(home / "ledger" / "ledger.arrows").records(run_id)}
    assert f"node {n2}" in (records["train-A"].note or ""), records["train-A"].note
    steps = sacct(cluster, json.loads((home / "runs" / run_id / "run.json").read_text())["slurm"]["job_id"])
    # the step ends FAILED (srun saw node 0 fail first) or NODE_FAIL (Slurm ended it first); the job NODE_FAIL
    assert steps[f"{run_id}.train-A"][2] in ("FAILED", "NODE_FAIL") and steps["orch-slurm"][2] == "NODE_FAIL", steps
    cluster.wait_idle(["n1", "n2"])


def test_allocation_not_granted_is_exit_75(cluster: Cluster, tmp_path: Path) -> None:
    """The nodes are busy: salloc --immediate gives up after --lock-timeout, orch says so (no run started)."""
    home = tmp_path / "home"
    busy = cluster.run("sbatch", "--parsable", "--nodes=2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 120")
    job = busy.stdout.strip()
    try:
        deadline = time.monotonic() + 60
        while cluster.run("squeue", "-h", "-j", job, "-o", "%t").stdout.strip() != "R":
            assert time.monotonic() < deadline, "the blocking job never started"
            time.sleep(0.5)
        t0 = time.monotonic()
        waited = orch(cluster, "launch", str(protocol(tmp_path / "b")), "--home", str(home), "--lock-timeout", "2",
                      "--json")
        assert waited.returncode == 75 and time.monotonic() - t0 < 60, waited.stderr
        assert json.loads(waited.stdout)["exit_code"] == 75
        assert "orch: Slurm allocation not obtained (salloc exit 1)" in waited.stderr
    finally:
        cluster.run("scancel", job)
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())  # no run was started


def test_orch_killed_mid_train_leaves_nothing_on_any_node(cluster: Cluster, tmp_path: Path) -> None:
    proc, run_id = _launch_until_step(cluster, tmp_path, rank=0, step=2)
    try:
        nodes = {p["node"] for p in _run_processes(run_id).values() if p["rank"]}
        assert nodes == {"n1", "n2"}, nodes  # ranks on both nodes
        inner = _inner_orch(str(tmp_path))  # the orch that salloc started
        assert len(inner) == 1, inner
        os.kill(inner[0], signal.SIGKILL)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 60
    while _run_processes(run_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _run_processes(run_id) == {}  # nothing of the run on any node
    while cluster.run("squeue", "-h").stdout.strip() and time.monotonic() < deadline + 60:
        time.sleep(0.5)  # salloc's command died: Slurm ends the job (COMPLETING for a moment)
    assert cluster.run("squeue", "-h").stdout.strip() == ""


def test_a_stopped_cluster_leaves_no_process(tmp_path: Path) -> None:
    """The fixture's own teardown, on a cluster of its own (no accounting: ~1 s to start): a job step running on
    both nodes when the cluster stops leaves no slurmstepd and nothing it ran (a SIGTERMed slurmd leaves its
    slurmstepds running)."""
    root = Path(tempfile.mkdtemp(prefix="orch-slurm-", dir="/tmp"))
    c = Cluster(root, accounting=False)
    try:
        c.start()
        job = c.run("sbatch", "--parsable", "--nodes=2", "--output=/dev/null", "--wrap", "srun sleep 300").stdout
        deadline = time.monotonic() + 60
        while len([p for p in c.step_processes() if _cmdline(p).startswith("/usr/bin/sleep")]) < 2:
            assert time.monotonic() < deadline, f"job {job.strip()} never ran its step on both nodes"
            time.sleep(0.2)
        running = c.processes()
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert [p for p in running if _alive(p)] == [] and c.processes() == []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
