"""The Slurm backend without a cluster: the protocol's launcher.scheduler and its id, the commands orch would run,
sacct's output read, node names salted, and the refusal when no Slurm client is installed (tests/e2e/test_slurm_e2e.py
runs a real cluster)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.slurm import cluster as slurm
from orchestrator.slurm.accounting import parse_sacct, step_note
from protocol.errors import RefusedError
from protocol.schema import canonical_json, load_protocol

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "protocol" / "r3_mini.yaml"
SLURM = REPO / "protocol" / "r3_mini_slurm2.yaml"


def _variant(tmp_path: Path, source: Path, old: str, new: str) -> Path:
    text = source.read_text()
    assert old in text
    path = tmp_path / "protocol" / "p.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace(old, new, 1).replace('base: ".."', f'base: "{REPO}"', 1))
    return path


def test_local_protocols_keep_their_ids(tmp_path: Path) -> None:
    """scheduler and slurm stay out of the canonical JSON of a local protocol: every existing id is unchanged."""
    for shipped in sorted((REPO / "protocol").glob("*.yaml")):
        loaded = load_protocol(shipped)
        if loaded.protocol.launcher.scheduler == "local":
            assert b'"scheduler"' not in canonical_json(loaded.protocol), shipped.name
            assert b'"slurm"' not in canonical_json(loaded.protocol), shipped.name
    explicit = _variant(tmp_path, LOCAL, "  backend: gloo\n", "  backend: gloo\n  scheduler: local\n")
    plain = _variant(tmp_path / "b", LOCAL, "  backend: gloo\n", "  backend: gloo\n")
    assert load_protocol(explicit).id == load_protocol(plain).id


def test_slurm_protocol_is_another_protocol() -> None:
    loaded = load_protocol(SLURM)
    launcher = loaded.protocol.launcher
    assert launcher.scheduler == "slurm" and launcher.slurm is not None
    assert (launcher.slurm.nodes, launcher.nproc, launcher.world_size) == (2, 1, 2)
    assert b'"scheduler":"slurm"' in canonical_json(loaded.protocol)
    assert loaded.id != load_protocol(LOCAL).id


@pytest.mark.parametrize(("old", "new", "message"), [
    ('  slurm: {nodes: 2, gpus_per_node: 0, time_limit: "00:30:00"}\n', "", "needs a launcher.slurm section"),
    ("  scheduler: slurm\n", "", "launcher.slurm is given but launcher.scheduler is not slurm"),
    ('time_limit: "00:30:00"', 'time_limit: "half an hour"', "launcher.slurm.time_limit"),
    ("nodes: 2,", "nodes: 0,", "launcher.slurm.nodes"),
    ("scheduler: slurm", "scheduler: pbs", "launcher.scheduler"),
    ("  device: cpu\n", "  device: cuda\n", "gpus_per_node >= 1 on a cuda protocol"),
])
def test_slurm_section_refusals(tmp_path: Path, old: str, new: str, message: str) -> None:
    with pytest.raises(RefusedError, match=message.replace(".", r"\.")):
        load_protocol(_variant(tmp_path, SLURM, old, new))


def test_salloc_and_srun_commands() -> None:
    spec = load_protocol(SLURM).protocol.launcher.slurm
    assert spec is not None
    argv = slurm.salloc_argv(spec.model_copy(update={"gpus_per_node": 4, "partition": "gpu"}), "orch-x", 90.5)
    assert argv == ["salloc", "--nodes=2", "--ntasks-per-node=1", "--exclusive", "--job-name=orch-x",
                    "--gres=gpu:4", "--partition=gpu", "--time=00:30:00", "--immediate=91"]
    run = slurm.SlurmRun(slurm.Allocation("77", ["a", "b"], 4, 32), "RUN", Path("/nonexistent"))
    train = run.step("train-A", 4, Path("/scratch"))
    assert train.nodes == 2 and train.nproc_per_node == 4 and train.rdzv_id == "RUN.train-A"
    assert 20000 <= train.port < 40000 and train.port != run.step("train-B", 4, Path("/s")).port
    assert "--nodes=2" in train.srun and "--gres=gpu:4" in train.srun and "--kill-on-bad-exit=1" in train.srun
    assert "--job-name=RUN.train-A" in train.srun and "--cpus-per-task=32" in train.srun
    assert not any("a" == x or "b" == x for x in train.srun)  # node names never reach package.json
    assert run.prefix("reload", "reload-A")[:4] == ["srun", "--jobid=77", "--nodes=1", "--ntasks=1"]
    assert run.prefix("train", "train-A") == []


SACCT = """5|orch-slurm|billing=4,cpu=4,gres/gpu=2,node=2|182|COMPLETED
5.extern|extern|billing=4,cpu=4,gres/gpu=2,node=2|182|COMPLETED
5.0|R.seal|cpu=2,mem=0,node=2|1|COMPLETED
5.3|R.train-A|cpu=4,gres/gpu=2,mem=0,node=2|24|COMPLETED
5.4|R.reload-A|cpu=2,gres/gpu=1,mem=0,node=1|2|FAILED
5.5|R.train-C|cpu=4,gres/gpu=2,mem=0,node=2|7|CANCELLED by 0
"""


def test_rendezvous_ports_stay_out_of_the_hosts_ephemeral_range(tmp_path: Path) -> None:
    """A port the kernel may hand to any connection or bind(0) can be taken before the store listens (seen as
    torchrun's EADDRINUSE beside other launches): the rendezvous port avoids that range, stays one per package and
    is the same for the same step name."""
    names = [f"RUN{i}.train-{arm}" for i in range(300) for arm in "ACB"]
    ports = [slurm.rendezvous_port(n, (32768, 60999)) for n in names]
    assert all(20000 <= p < 32768 for p in ports)
    assert len(set(ports)) > 800  # 900 names spread over the 12,768 left (about 869 distinct expected), not a handful
    assert slurm.rendezvous_port(names[0], (32768, 60999)) == ports[0]
    low = [slurm.rendezvous_port(n, (1024, 29999)) for n in names]
    assert all(30000 <= p < 40000 for p in low)
    # a range that covers every candidate leaves them all in use rather than none
    assert all(20000 <= slurm.rendezvous_port(n, (1024, 65535)) < 40000 for n in names[:20])
    f = tmp_path / "range"
    f.write_text("40000\t50999\n")
    assert slurm.ephemeral_ports(f) == (40000, 50999)
    assert slurm.ephemeral_ports(tmp_path / "missing") == slurm.LINUX_EPHEMERAL
    f.write_text("garbage\n")
    assert slurm.ephemeral_ports(f) == slurm.LINUX_EPHEMERAL
    lo, hi = slurm.ephemeral_ports()
    run = slurm.SlurmRun(slurm.Allocation("77", ["a", "b"], 4, 32), "RUN", Path("/nonexistent"))
    assert not lo <= run.step("train-A", 4, Path("/scratch")).port <= hi or (lo <= 20000 and hi >= 39999)


def test_sacct_output_read() -> None:
    steps, job = parse_sacct(SACCT)
    assert job is not None and job.gpu_seconds == 364.0
    assert sorted(steps) == ["0", "3", "4", "5"]  # extern is Slurm's own
    assert steps["3"].gpu_seconds == 48.0 and steps["0"].gpus == 0 and steps["4"].state == "FAILED"
    assert steps["5"].final and steps["5"].name == "R.train-C"
    note = step_note("5", [steps["3"]])
    assert note == "slurm job 5 steps 3: 2 gres/gpu x 24 s" and slurm.STEP_NOTE.match(note)
    assert slurm.gres_gpus("cpu=2,gres/gpu:h100=8,node=1") == 8 and slurm.gres_gpus("cpu=2") == 0


def test_node_hash_is_salted(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one, again, other = (slurm.node_hash(tmp_path / d, "gpu-node-017") for d in ("a", "a", "b"))
    assert one == again != other and len(one) == 64 and "node" not in one


def test_launch_without_slurm_is_refused_in_one_line(tmp_path: Path) -> None:
    """No salloc/srun on PATH and no allocation: exit 3, one line, nothing recorded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=str(Path(sys.executable).parent), PYTHONPATH=str(REPO))
    home = tmp_path / "home"
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli.orch", "launch", str(SLURM), "--home", str(home),
                           "--json"], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 3, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "not found on PATH" in lines[0] and "salloc" in lines[0], lines
    assert json.loads(done.stdout)["exit_code"] == 3
    assert not home.exists()


def test_enter_allocation_outside_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    spec = load_protocol(SLURM).protocol.launcher.slurm
    assert spec is not None
    with pytest.raises(RefusedError, match="not inside a Slurm allocation"):
        slurm.enter_allocation(spec, print)


def _summary(rank: int, exitcode: int) -> str:
    return (f"Root Cause (first observed failure):\n[0]:\n  time      : 2026-01-01_00:00:00\n  host      : h\n"
            f"  rank      : {rank} (local_rank: 0)\n  exitcode  : {exitcode} (pid: 7)\n  error_file: <N/A>\n"
            "============================================================")


def test_multi_node_failure_names_the_node_that_failed_first(tmp_path: Path) -> None:
    """Each node agent leaves its torchrun's log and exit; the cause is found across them (workers.train)."""
    from protocol.package import SlurmStep, TrainSpec
    from workers.common import RANK_FAILED
    from workers.node import EXIT_FILE, LOG_FILE
    from workers.train import node_cause

    step = SlurmStep(srun=["srun"], nodes=3, nproc_per_node=1, port=20001, rdzv_id="r", clock_dir=str(tmp_path))
    spec = TrainSpec(run_id="r", name="train-A", kind="train", package_dir=str(tmp_path), sealed_dir=str(tmp_path),
                       scratch_dir=str(tmp_path), result_path=str(tmp_path / "r.json"), device="cpu",
                       precision="fp32", nproc=3, slurm=step)

    def node(i: int, rc: int, stopped: bool, log: str) -> None:
        (tmp_path / EXIT_FILE.format(node=i)).write_text(json.dumps({"rc": rc, "stopped": stopped}))
        (tmp_path / LOG_FILE.format(node=i)).write_text(log)

    peer = RANK_FAILED.format(rank=0, time=100.5, cause="RuntimeError: Connection reset by peer")
    node(0, 1, False, f"{peer}\n{_summary(0, 1)}")  # lost its peer and failed on its own, first in node order
    node(1, 1, False, _summary(1, -9))  # its rank was SIGKILLed: the cause
    node(2, 143, True, "")  # stopped by Slurm
    assert node_cause(spec) == "node 1: rank 1 was killed by signal 9 (SIGKILL)"
    node(1, 1, False, RANK_FAILED.format(rank=1, time=99.0, cause="ValueError: boom") + "\n" + _summary(1, 1))
    assert node_cause(spec) == "node 1: rank 1: ValueError: boom"  # the rank that raised first, on any node
    node(1, -9, False, "")  # the node's torchrun itself was killed
    assert node_cause(spec) == "node 1: torchrun was killed by signal 9 (SIGKILL)"
    for i in range(3):
        node(i, 143 if i else 0, True, "")
    assert node_cause(spec) is None


def _two_nodes(tmp_path: Path) -> tuple[Any, Callable[[int, int | None, bool, str], None]]:
    """A two-node train spec whose node agents' exit files and logs live in tmp_path, and a writer of node i's."""
    from protocol.package import SlurmStep, TrainSpec
    from workers.node import EXIT_FILE, LOG_FILE

    step = SlurmStep(srun=["srun"], nodes=2, nproc_per_node=1, port=20001, rdzv_id="r", clock_dir=str(tmp_path))
    spec = TrainSpec(run_id="r", name="train-A", kind="train", package_dir=str(tmp_path), sealed_dir=str(tmp_path),
                     scratch_dir=str(tmp_path), result_path=str(tmp_path / "r.json"), device="cpu",
                     precision="fp32", nproc=2, slurm=step)

    def node(i: int, rc: int | None, stopped: bool, log: str) -> None:
        (tmp_path / EXIT_FILE.format(node=i)).write_text(json.dumps({"rc": rc, "stopped": stopped}))
        (tmp_path / LOG_FILE.format(node=i)).write_text(log)

    return spec, node


def test_a_stopped_node_whose_torchrun_reported_a_killed_rank_is_the_cause(tmp_path: Path) -> None:
    """Seen once in make test: the ranks of node 1 SIGKILLed, node 0's rank lost its peer, and the note named node
    0's lost connection. Read from the code: srun's kill-on-bad-exit can stop node 1's agent while its torchrun is
    reporting the dead rank, and a stopped node was never read. A rank killed by a signal that the stop does not
    send is node 1's own failure."""
    from workers.common import RANK_FAILED
    from workers.train import node_cause

    spec, node = _two_nodes(tmp_path)

    peer = RANK_FAILED.format(rank=0, time=100.5, cause="RuntimeError: Connection closed by peer")
    node(0, 1, False, f"{peer}\n{_summary(0, 1)}")
    node(1, 1, True, _summary(1, -9))
    assert node_cause(spec) == "node 1: rank 1 was killed by signal 9 (SIGKILL)"
    node(1, None, True, _summary(1, -9))  # the agent itself SIGKILLed after KillWait, before its last word
    assert node_cause(spec) == "node 1: rank 1 was killed by signal 9 (SIGKILL)"
    node(1, 1, True, _summary(1, -15))  # its rank ended by the stop's SIGTERM: a consequence, not a cause
    assert node_cause(spec) == "node 0: rank 0: RuntimeError: Connection closed by peer"
    node(1, 1, True, RANK_FAILED.format(rank=1, time=100.7, cause="RuntimeError: Connection closed by peer"))
    assert node_cause(spec) == "node 0: rank 0: RuntimeError: Connection closed by peer"  # a stopped node's raise


def test_a_torchrun_that_srun_ended_with_sigterm_is_never_the_cause(tmp_path: Path) -> None:
    """Seen in make test (test_killed_ranks_on_one_node_fail_the_run_with_nothing_left, now and then): node 1's ranks
    SIGKILLed, srun then SIGTERMed node 0's torchrun, and the note named node 0's 'torchrun was killed by signal 15'
    whenever that report came in first (both counted as kills, the lower node index won). srun's SIGTERM follows
    from another node's failure; it is named only when nothing else is known."""
    from workers.train import node_cause

    spec, node = _two_nodes(tmp_path)

    node(0, -15, False, "")
    node(1, 1, False, _summary(1, -9))
    assert node_cause(spec) == "node 1: rank 1 was killed by signal 9 (SIGKILL)"
    node(1, -15, False, _summary(1, -9))  # node 1's torchrun reported its rank, then srun's SIGTERM reached it too
    assert node_cause(spec) == "node 1: rank 1 was killed by signal 9 (SIGKILL)"
    node(1, -9, False, "")  # node 1's torchrun itself SIGKILLed
    assert node_cause(spec) == "node 1: torchrun was killed by signal 9 (SIGKILL)"
    node(1, -15, False, "")  # both ended by SIGTERM and nothing else known: the first node's
    assert node_cause(spec) == "node 0: torchrun was killed by signal 15 (SIGTERM)"


def test_node_names_are_scrubbed_from_notes_and_logs(tmp_path: Path) -> None:
    (tmp_path / "ledger").mkdir()
    run = slurm.SlurmRun(slurm.Allocation("9", ["gpu-a1", "gpu-a10"], 0, 1), "R", tmp_path / "ledger")
    a1, a10 = (slurm.node_hash(tmp_path / "ledger", n)[:16] for n in ("gpu-a1", "gpu-a10"))
    line = "srun: error: gpu-a10: task 1: Exited with exit code 1; gpu-a1: Killed; gpu-a100 stays; x.gpu-a1.y"
    assert run.scrub(line) == (f"srun: error: node {a10}: task 1: Exited with exit code 1; node {a1}: Killed; "
                               "gpu-a100 stays; x.gpu-a1.y")
    (tmp_path / "stderr.log").write_text("srun: error: gpu-a1: task 0: Exited with exit code 1\n")
    run.scrub_logs(tmp_path)
    assert (tmp_path / "stderr.log").read_text() == f"srun: error: node {a1}: task 0: Exited with exit code 1\n"


def test_a_node_that_never_reported_is_the_cause(tmp_path: Path) -> None:
    """A node that died (or whose agent was SIGKILLed unannounced) leaves no exit report; the others' errors (peer
    connection reset) follow from it, so it is named first. A node that Slurm stopped says so at once."""
    from protocol.package import SlurmStep, TrainSpec
    from workers.common import RANK_FAILED
    from workers.node import EXIT_FILE, LOG_FILE
    from workers.train import node_cause

    step = SlurmStep(srun=["srun"], nodes=2, nproc_per_node=1, port=20001, rdzv_id="r", clock_dir=str(tmp_path))
    spec = TrainSpec(run_id="r", name="train-A", kind="train", package_dir=str(tmp_path), sealed_dir=str(tmp_path),
                     scratch_dir=str(tmp_path), result_path=str(tmp_path / "r.json"), device="cpu",
                     precision="fp32", nproc=2, slurm=step)
    assert node_cause(spec) is None  # no node said anything: the step never started
    peer = RANK_FAILED.format(rank=0, time=100.5, cause="RuntimeError: Connection reset by peer")
    (tmp_path / EXIT_FILE.format(node=0)).write_text(json.dumps({"rc": 1, "stopped": False}))
    (tmp_path / LOG_FILE.format(node=0)).write_text(f"{peer}\n{_summary(0, 1)}")
    assert node_cause(spec) == "node 1: no report from it (its node agent was killed, or the node died)"
    (tmp_path / EXIT_FILE.format(node=1)).write_text(json.dumps({"rc": None, "stopped": True}))  # Slurm's SIGTERM
    assert node_cause(spec) == "node 0: rank 0: RuntimeError: Connection reset by peer"
    (tmp_path / EXIT_FILE.format(node=1)).unlink()
    (tmp_path / EXIT_FILE.format(node=0)).write_text(json.dumps({"rc": 1, "stopped": False}))
    (tmp_path / LOG_FILE.format(node=0)).write_text(_summary(0, -9))
    # node 0's rank was SIGKILLed; srun's kill-on-bad-exit then ended node 1's agent before it said anything
    assert node_cause(spec) == "node 0: rank 0 was killed by signal 9 (SIGKILL)"


def test_failure_notes_name_nodes_by_hash_and_slurm_lost_nodes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                      ) -> None:
    """`node I:` of the train worker (I: index in the step) becomes the I-th node's salted hash; a node Slurm
    reports DOWN or NOT_RESPONDING is named first. scontrol here is a script printing what a controller would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\necho 'NodeName=gpu-a1 Arch=x86_64 State=ALLOCATED Partitions=main'\n"
        "echo 'NodeName=gpu-a2 Arch=x86_64 State=DOWN+NOT_RESPONDING Partitions=main'\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "ledger").mkdir()
    run = slurm.SlurmRun(slurm.Allocation("9", ["gpu-a1", "gpu-a2"], 0, 1), "R", tmp_path / "ledger")
    a1, a2 = (slurm.node_hash(tmp_path / "ledger", n)[:16] for n in ("gpu-a1", "gpu-a2"))
    note = ("exit 1: train: torchrun exited with 1: node 1: no report from it (its node agent was killed, or the node "
            "died)")
    assert run.explain_failure(note, "train") == (
        f"Slurm reports node {a2} (DOWN+NOT_RESPONDING) lost; exit 1: train: torchrun exited with 1: node {a2}: no "
        "report from it (its node agent was killed, or the node died)")
    assert run.explain_failure("node 0: rank 0: ValueError: x; node 7: ?", "reload") == \
        f"node {a1}: rank 0: ValueError: x; node 7: ?"  # a one-node package: only its node; no such index 7
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 1\n")  # Slurm cannot say: the note, nodes by hash
    assert run.explain_failure("node 0: rank 0 was killed", "train") == f"node {a1}: rank 0 was killed"


def _agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str,
           host: Callable[[], str] = lambda: "127.0.0.1") -> tuple[int, Path]:
    """workers.node's train agent with its torchrun replaced by `python -c script` (no Slurm, no rendezvous):
    (its return, the folder where it says how torchrun ended)."""
    import workers.torchrun
    from protocol.package import SlurmStep, TrainSpec
    from workers import node

    step = SlurmStep(srun=["srun"], nodes=1, nproc_per_node=1, port=20001, rdzv_id="r",
                     clock_dir=str(tmp_path / "clock"))
    spec = TrainSpec(run_id="r", name="train-A", kind="train", package_dir=str(tmp_path), sealed_dir=str(tmp_path),
                     scratch_dir=str(tmp_path), result_path=str(tmp_path / "r.json"), device="cpu",
                     precision="fp32", nproc=1, slurm=step)
    (tmp_path / "package.json").write_text(spec.model_dump_json(by_alias=True))
    monkeypatch.setattr(node, "rendezvous_host", host)
    monkeypatch.setattr(workers.torchrun, "torchrun_command", lambda *a: [sys.executable, "-c", script])
    monkeypatch.setenv("SLURM_NODEID", "0")
    previous = signal.getsignal(signal.SIGTERM)
    try:
        return node.train(str(tmp_path / "package.json")), tmp_path / "clock"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_stop_after_torchrun_ended_does_not_silence_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """CI at 55b9742: node 1's rank SIGKILLed, and the note named node 0 "no report from it". node 0's torchrun had
    ended on its own (its peer lost) when srun's kill-on-bad-exit SIGTERM reached the agent, which then raised out of
    its own ending before it said how torchrun ended. A stop that lands while the agent reports is only recorded."""
    from workers import node
    from workers.clock import StepClock

    real_stop = StepClock.stop

    def stop_then_sigterm(self: StepClock) -> None:  # Slurm's SIGTERM lands while the agent ends
        os.kill(os.getpid(), signal.SIGTERM)
        real_stop(self)

    monkeypatch.setattr(StepClock, "stop", stop_then_sigterm)
    rc, folder = _agent(tmp_path, monkeypatch, "raise SystemExit(3)")
    assert rc == 3
    # said before the stop landed: torchrun ended on its own, and that is this node's report
    assert json.loads((folder / node.EXIT_FILE.format(node=0)).read_text()) == {"rc": 3, "stopped": False}
    assert (folder / node.CLOCK_FILE.format(node=0)).is_file()


def test_a_stop_while_torchrun_runs_is_said_at_once_and_ends_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """The agent's SIGTERM (here sent by its own child, as slurmstepd would) is written down before torchrun is
    ended, then torchrun's end replaces it."""
    from workers import node

    script = ("import os, signal\n"
              "def said(*_):\n"
              "    open('said.json', 'w').write(open('clock/node0.exit.json').read())\n"
              "    os._exit(7)\n"
              "signal.signal(signal.SIGTERM, said)\n"
              "os.kill(os.getppid(), signal.SIGTERM)\n"
              "signal.pause()\n")
    rc, folder = _agent(tmp_path, monkeypatch, script)
    assert json.loads((tmp_path / "said.json").read_text()) == {"rc": None, "stopped": True}  # before torchrun ended
    assert rc == 7
    assert json.loads((folder / node.EXIT_FILE.format(node=0)).read_text()) == {"rc": 7, "stopped": True}


def test_a_stop_before_torchrun_started_ends_it_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's SIGTERM while the agent still looks up the rendezvous host: torchrun, once started, is ended at
    once instead of waiting for peers that are being stopped too."""
    import time

    from workers import node

    def stopped_during_lookup() -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        return "127.0.0.1"

    t0 = time.monotonic()
    rc, folder = _agent(tmp_path, monkeypatch, "import time; time.sleep(60)", host=stopped_during_lookup)
    assert rc == -signal.SIGTERM and time.monotonic() - t0 < 30
    assert json.loads((folder / node.EXIT_FILE.format(node=0)).read_text()) == {"rc": -15, "stopped": True}
