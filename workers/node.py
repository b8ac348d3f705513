"""What orch runs on every node of a Slurm allocation, one srun task a node: the seal check, and the node's part of a
train package (its own step clock, then torchrun joining the c10d rendezvous hosted on the allocation's first node).

Usage: python -m workers.node seal ARM=DIR...  |  python -m workers.node train --spec package.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from manifests.core import hash_tree
from protocol.package import PackageSpec, parse_spec
from workers.clock import StepClock
from workers.common import WorkerFailed
from workers.rank_failure import killed_rank

CLOCK_FILE = "clock.node{node}.jsonl"  # in SlurmStep.clock_dir: the kernel stamps one node's clock received
LOG_FILE = "node{node}.log"  # the node's torchrun output (scratch: it may hold the trainer's own numbers)
EXIT_FILE = "node{node}.exit.json"  # how the node's torchrun ended: on its own, or stopped by Slurm


class _Stop:
    """Slurm's SIGTERM to the node agent (another node failed: srun --kill-on-bad-exit; or the package was stopped).

    The handler records it and never raises: a stop that lands after torchrun ended, while the agent is writing how
    it ended, must not cut that report short (the agent would then read as silent, and this node be named the cause).
    While torchrun still runs, the handler says "stopped" at once (Slurm may SIGKILL the agent after KillWait), ends
    torchrun, and kills it if it has not ended 30 s later.
    """

    def __init__(self, folder: Path, node_id: int) -> None:
        self.folder, self.node_id = folder, node_id
        self.proc: subprocess.Popen[bytes] | None = None
        self.ended = False  # torchrun's exit status is known: from now on a stop is only recorded
        self.stopped = False
        self._ending = False

    def __call__(self, signum: int, frame: object) -> None:
        self.stopped = True
        if self.proc is not None:
            self._end()

    def started(self, proc: subprocess.Popen[bytes]) -> None:
        """torchrun runs: a stop that came before (during the rendezvous lookup) ends it now."""
        self.proc = proc
        if self.stopped:
            self._end()

    def _end(self) -> None:
        if self.ended or self._ending or self.proc is None:
            return
        self._ending = True
        _write_exit(self.folder, self.node_id, None, True)
        self.proc.terminate()
        kill = threading.Timer(30, self.proc.kill)
        kill.daemon = True  # never keeps the agent alive once torchrun has ended
        kill.start()


def node_name() -> str:
    """The Slurm node this task runs on (several nodes can share a host); printed to orch only, never kept."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def seal(pairs: list[str]) -> int:
    """One JSON line: this node's name and the root of every sealed copy as this node reads it (None if unreadable)."""
    roots: dict[str, str | None] = {}
    errors: dict[str, str] = {}
    for pair in pairs:
        arm, _, path = pair.partition("=")
        try:
            roots[arm] = hash_tree(Path(path), ["**"], workers=1).root
        except Exception as exc:  # a missing or unreadable copy is this node's answer, not a crash
            roots[arm] = None
            errors[arm] = f"{type(exc).__name__}: {str(exc)[:160]}"
    print(json.dumps({"node": node_name(), "roots": roots, "errors": errors}, sort_keys=True), flush=True)
    return 0


def _scontrol(*args: str) -> str:
    return subprocess.run(["scontrol", *args], check=True, capture_output=True, text=True, timeout=60).stdout


def rendezvous_host() -> str:
    """The address of the step's first node, as Slurm knows it (NodeAddr), so each node finds it alone."""
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise WorkerFailed("not in a Slurm step: SLURM_STEP_NODELIST is not set")
    first = _scontrol("show", "hostnames", nodelist).split()[0]
    for field in _scontrol("show", "node", "-o", first).split():
        if field.startswith("NodeAddr="):
            return field.removeprefix("NodeAddr=")
    return first


def rendezvous_args(spec: PackageSpec, host: str, node_id: int) -> list[str]:
    """torchrun's multi-node options: c10d rendezvous, its store hosted by the first node of the step."""
    assert spec.slurm is not None
    return [
        f"--nnodes={spec.slurm.nodes}", f"--nproc_per_node={spec.slurm.nproc_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={host}:{spec.slurm.port}", f"--rdzv-id={spec.slurm.rdzv_id}",
        f"--rdzv-conf=is_host={'true' if node_id == 0 else 'false'}",
    ]  # fmt: skip


def train(spec_path: str) -> int:
    """torchrun for this node's ranks under the probe; the node's clock stamps are written for the train worker."""
    from protocol.process import die_with_parent
    from workers.torchrun import torchrun_command

    spec = parse_spec(Path(spec_path).read_bytes())
    if spec.kind not in ("train", "replay", "prime") or spec.slurm is None:
        raise WorkerFailed(f"{spec_path} is not a train package spec with a slurm section")
    node_id = int(os.environ.get("SLURM_NODEID", "0"))
    folder = Path(spec.slurm.clock_dir)
    folder.mkdir(parents=True, exist_ok=True)
    clock = StepClock(spec.nproc)  # every rank of the world may land on this node
    clock.start()
    stop = _Stop(folder, node_id)
    signal.signal(signal.SIGTERM, stop)
    try:
        cmd = torchrun_command(spec, clock.name, rendezvous_args(spec, rendezvous_host(), node_id))
        with open(folder / LOG_FILE.format(node=node_id), "wb") as log:
            proc = subprocess.Popen(cmd, cwd=spec.sealed_dir, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=die_with_parent(signal.SIGTERM))
            stop.started(proc)
            rc = proc.wait()
            stop.ended = True
        _write_exit(folder, node_id, rc, stop.stopped)
    finally:
        clock.stop()
    rows = [{"rank": r, "step": s, "event": e, "t_ns": t} for r, rows in clock.arrivals.items() for s, e, t in rows]
    doc = {"malformed": clock.malformed, "unstamped": clock.unstamped, "arrivals": rows}
    (folder / CLOCK_FILE.format(node=node_id)).write_text(json.dumps(doc) + "\n")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return rc


def _write_exit(folder: Path, node_id: int, rc: int | None, stopped: bool) -> None:
    """How this node's torchrun ended (rc None: stopped by Slurm, not yet ended), replaced whole (rename)."""
    tmp = folder / (EXIT_FILE.format(node=node_id) + ".tmp")
    tmp.write_text(json.dumps({"rc": rc, "stopped": stopped}) + "\n")
    tmp.replace(folder / EXIT_FILE.format(node=node_id))


def silent_nodes(spec: PackageSpec) -> list[int]:
    """Nodes of the step that never said how their torchrun ended while another node did: the node agent was
    killed without Slurm's SIGTERM first, or the node itself died (a node's slurmd, power, network)."""
    assert spec.slurm is not None
    folder = Path(spec.slurm.clock_dir)
    said = [(folder / EXIT_FILE.format(node=n)).is_file() for n in range(spec.slurm.nodes)]
    return [n for n, ok in enumerate(said) if not ok] if any(said) else []


def load_clock(spec: PackageSpec) -> StepClock:
    """The stamps of every node's clock as one StepClock (each rank's stamps come from the clock of its own node)."""
    assert spec.slurm is not None
    clock = StepClock(spec.nproc)
    clock.stop()  # never bound: only its records are used
    for node in range(spec.slurm.nodes):
        path = Path(spec.slurm.clock_dir) / CLOCK_FILE.format(node=node)
        if not path.is_file():
            raise WorkerFailed(f"node {node} of the step wrote no step-clock stamps")
        doc = json.loads(path.read_text())
        clock.malformed += int(doc["malformed"])
        clock.unstamped += int(doc["unstamped"])
        for row in doc["arrivals"]:
            clock.arrivals[int(row["rank"])].append((int(row["step"]), str(row["event"]), int(row["t_ns"])))
    return clock


def failed_nodes(spec: PackageSpec) -> list[tuple[int, int, str]]:
    """(node index, torchrun's exit status, its output) of every node whose torchrun failed on its own: not stopped
    by Slurm after another node failed (srun --kill-on-bad-exit), or stopped while its output already names a rank
    killed by a signal the stop does not send (the stop can reach a node whose rank died first while its torchrun is
    still reporting it)."""
    assert spec.slurm is not None
    folder = Path(spec.slurm.clock_dir)
    out = []
    for node in range(spec.slurm.nodes):
        try:
            doc = json.loads((folder / EXIT_FILE.format(node=node)).read_text())
            text = (folder / LOG_FILE.format(node=node)).read_text(errors="replace")
        except (OSError, ValueError):
            continue  # killed before it could say
        if doc.get("rc") != 0 and (not doc.get("stopped") or killed_rank(text) is not None):
            out.append((node, int(doc.get("rc") or 1), text))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workers.node")
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("seal").add_argument("pairs", nargs="+", metavar="ARM=DIR")
    sub.add_parser("train").add_argument("--spec", required=True)
    opts = ap.parse_args(argv)
    try:
        return seal(opts.pairs) if opts.what == "seal" else train(opts.spec)
    except WorkerFailed as exc:
        sys.stderr.write(f"node {os.environ.get('SLURM_NODEID', '?')}: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
