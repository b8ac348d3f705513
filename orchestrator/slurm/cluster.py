"""orch on a Slurm cluster: the allocation a run is in (or obtains through salloc), the srun commands of its packages,
and the seal checked on every node. The one module that starts Slurm commands for a run (sacct: slurm_accounting).

Node names stay in memory: evidence and the ledger name a node only by an HMAC of its name with the ledger's salt.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from ledger.cost.salt import ledger_salt
from protocol.errors import FailedError, LockTimeoutError, RefusedError
from protocol.package import SlurmStep
from protocol.schema import SlurmLauncher

STARTED_VAR = "ORCH_SLURM_STARTED"  # a file the run inside a new allocation creates: salloc did start it
SLURM_COMMANDS = ("salloc", "srun", "scontrol", "sacct")
ONE_NODE_KINDS = ("checks", "reload", "score")  # on the allocation's first node; train and replay span every node
SCONTROL_TIMEOUT_S = 60.0
SEAL_TIMEOUT_S = 600.0
RDZV_PORTS = (20000, 40000)  # a train package's rendezvous port is one of these, less the host's ephemeral range
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL = (32768, 60999)  # the kernel's default, where the file cannot be read
LOST_STATES = ("DOWN", "NOT_RESPONDING", "FAIL", "POWERED_DOWN", "POWERING_DOWN")  # scontrol's State flags
NODE_INDEX = re.compile(r"(?<![\w-])node (\d+): ")  # the train worker names a node by its index in the step


def require_slurm() -> None:
    """Refuse (exit 3, before any allocation) when a Slurm client command is missing."""
    missing = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
    if missing:
        raise RefusedError(f"launcher.scheduler is slurm but {', '.join(missing)} not found on PATH; run orch on a "
                           "Slurm login or compute node (or use scheduler: local)")


def node_hash(salt_dir: Path, name: str) -> str:
    """A node named in evidence: HMAC-SHA256 of its Slurm name keyed by the ledger's salt (as the host hash)."""
    return hmac.new(ledger_salt(salt_dir).encode(), name.encode(), hashlib.sha256).hexdigest()


def _run(argv: Sequence[str], timeout: float = SCONTROL_TIMEOUT_S) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise FailedError(f"{argv[0]} did not answer ({err}); check the Slurm controller") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise FailedError(f"{' '.join(argv[:3])} failed: {last[:200]}")
    return done.stdout


def job_fields(job_id: str) -> dict[str, str]:
    """`scontrol show job -o JOB` as key -> value (the first value of a repeated key)."""
    out: dict[str, str] = {}
    for token in _run(["scontrol", "show", "job", "-o", job_id]).split():
        key, eq, value = token.partition("=")
        if eq and key not in out:
            out[key] = value
    return out


def gres_gpus(tres: str) -> int:
    """gres/gpu in a TRES string such as `cpu=4,gres/gpu=2,node=2` (0 when absent)."""
    for part in tres.split(","):
        key, _, value = part.partition("=")
        if key == "gres/gpu" or key.startswith("gres/gpu:"):
            return int(value) if value.isdigit() else 0
    return 0


@dataclass
class Allocation:
    """The Slurm job a run uses in place of orch's GPU lock; entering and leaving it holds nothing."""

    job_id: str
    nodes: list[str]  # the first `want` nodes of the job, in Slurm's order (in memory only)
    gpus_per_node: int
    cpus_per_node: int
    wait_s: float = 0.0
    kind: str = "slurm"
    devices: list[int] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return len(self.nodes) * self.gpus_per_node

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return {}  # GPUs are bound by Slurm inside each step, not by orch's grant variables

    def __enter__(self) -> Allocation:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        return None


def enter_allocation(spec: SlurmLauncher, say: Callable[[str], None]) -> Allocation:
    """The allocation orch was started in (SLURM_JOB_ID), checked against what the protocol needs."""
    mark_started()  # from here on, what happens is this run's to report (salloc did start it)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        raise RefusedError("launcher.scheduler is slurm but orch is not inside a Slurm allocation; run it under "
                           "salloc or sbatch (`orch launch` alone obtains one itself)")
    fields = job_fields(job_id)
    names = _run(["scontrol", "show", "hostnames", fields.get("NodeList", "")]).split()
    if len(names) < spec.nodes:
        raise RefusedError(f"Slurm job {job_id} has {len(names)} node(s); the protocol needs {spec.nodes}: "
                           f"allocate --nodes {spec.nodes}")
    per_node = gres_gpus(fields.get("AllocTRES") or fields.get("TRES", "")) // max(1, len(names))
    if per_node < spec.gpus_per_node:
        raise RefusedError(f"Slurm job {job_id} has {per_node} GPU(s) a node; the protocol needs "
                           f"{spec.gpus_per_node}: allocate --gres=gpu:{spec.gpus_per_node}")
    cpus = int(fields.get("NumCPUs", "1") or 1) // max(1, len(names))
    say(f"slurm: job {job_id}, {spec.nodes} node(s) x {spec.gpus_per_node} GPU(s); orch's GPU lock is not used")
    return Allocation(job_id, names[: spec.nodes], spec.gpus_per_node, max(1, cpus))


def salloc_argv(spec: SlurmLauncher, job_name: str, lock_timeout: float | None) -> list[str]:
    """salloc for whole nodes, one task a node, the protocol's GPUs, partition and time limit."""
    argv = ["salloc", f"--nodes={spec.nodes}", "--ntasks-per-node=1", "--exclusive", f"--job-name={job_name}"]
    if spec.gpus_per_node:
        argv.append(f"--gres=gpu:{spec.gpus_per_node}")
    if spec.partition:
        argv.append(f"--partition={spec.partition}")
    if spec.time_limit:
        argv.append(f"--time={spec.time_limit}")
    if lock_timeout is not None:
        argv.append(f"--immediate={max(1, math.ceil(lock_timeout))}")
    return argv


def run_in_new_allocation(spec: SlurmLauncher, job_name: str, orch_argv: list[str], lock_timeout: float | None,
                          say: Callable[[str], None]) -> int:
    """`salloc ... -- orch launch ...`: the same command again, inside an allocation; its exit status is orch's.

    salloc's own failure (no allocation in time, a refused request) is exit 75, told apart by the started file."""
    with tempfile.TemporaryDirectory(prefix="orch-salloc-") as tmp:
        started = Path(tmp) / "started"
        env = {**os.environ, STARTED_VAR: str(started)}
        argv = [*salloc_argv(spec, job_name, lock_timeout), "--", *orch_argv]
        say(f"slurm: {' '.join(argv[: argv.index('--')])}")
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        try:
            rc = proc.wait()
        except BaseException:
            proc.terminate()  # salloc relinquishes the allocation and ends what runs in it
            proc.wait(timeout=60)
            raise
        if not started.exists():
            raise LockTimeoutError(f"Slurm allocation not obtained (salloc exit {rc}); check the partition and "
                                   "the queue (squeue), or raise --lock-timeout")
        return rc


def mark_started() -> None:
    """Inside an allocation that run_in_new_allocation asked for: tell it that this run did start."""
    path = os.environ.get(STARTED_VAR)
    if path:
        Path(path).touch()


def needs_allocation(protocol: Path) -> SlurmLauncher | None:
    """The Slurm section of a protocol that `orch launch` must run under salloc: scheduler slurm, outside any
    allocation. None otherwise (local, inside an allocation, or a protocol the launch itself refuses in its words)."""
    from protocol.errors import OrchError
    from protocol.schema import load_protocol

    if os.environ.get("SLURM_JOB_ID"):
        return None
    try:
        return load_protocol(protocol).protocol.launcher.slurm
    except OrchError:
        return None


def rerun_in_allocation(spec: SlurmLauncher, protocol: Path, lock_timeout: float | None) -> int:
    """This very `orch launch` command again, inside a new allocation; returns its exit status."""
    require_slurm()
    orch_argv = [sys.executable, "-m", "orchestrator.cli.orch", *sys.argv[1:]]
    return run_in_new_allocation(spec, f"orch-{protocol.stem}"[:64], orch_argv, lock_timeout,
                                 lambda line: print(line, file=sys.stderr))


@dataclass
class SlurmRun:
    """One run's use of its allocation: the steps of its packages and the seal checked on every node."""

    alloc: Allocation
    run_id: str
    salt_dir: Path

    def scrub(self, text: str) -> str:
        """Text with every node name of the allocation replaced by `node <salted hash>` (srun's own error lines
        name nodes: "srun: error: NODE: task 0: Exited with exit code 1")."""
        for name in sorted(self.alloc.nodes, key=len, reverse=True):
            text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", f"node {node_hash(self.salt_dir, name)[:16]}",
                          text)
        return text

    def scrub_logs(self, folder: Path) -> None:
        """The package's logs in the run directory without node names (its srun wrote into them)."""
        for log in (folder / "stdout.log", folder / "stderr.log"):
            try:
                text = log.read_text(errors="replace")
            except OSError:
                continue
            clean = self.scrub(text)
            if clean != text:
                log.write_text(clean)

    def node_states(self, names: Sequence[str]) -> dict[str, str]:
        """Slurm's State of each node (`DOWN+NOT_RESPONDING`, `ALLOCATED`, ...); {} when scontrol cannot say."""
        try:
            out = _run(["scontrol", "show", "node", "-o", ",".join(names)])
        except FailedError:
            return {}
        states = {}
        for line in out.splitlines():
            fields = dict(t.partition("=")[::2] for t in line.split() if "=" in t)
            if fields.get("NodeName") in names:
                states[fields["NodeName"]] = fields.get("State", "")
        return states

    def explain_failure(self, note: str | None, kind: str) -> str | None:
        """A failed package's note with the nodes named by salted hash: the nodes of its step that Slurm reports
        lost first, then the worker's `node I:` (I: the node's index in the step) as `node <hash>`."""
        count = 1 if kind in ONE_NODE_KINDS else len(self.alloc.nodes)
        names = self.alloc.nodes[:count]
        states = self.node_states(names)
        lost = [f"node {node_hash(self.salt_dir, n)[:16]} ({states[n]})" for n in names
                if any(flag in states.get(n, "").split("+") for flag in LOST_STATES)]

        def named(m: re.Match[str]) -> str:
            i = int(m.group(1))
            return f"node {node_hash(self.salt_dir, names[i])[:16]}: " if i < len(names) else m.group(0)

        text = None if note is None else NODE_INDEX.sub(named, note)
        if not lost:
            return text
        head = f"Slurm reports {', '.join(lost)} lost"
        return f"{head}; {text}" if text else head

    def step_name(self, package: str) -> str:
        return f"{self.run_id}.{package}"

    def srun(self, package: str, nodes: int, gpus_per_node: int) -> list[str]:
        return [
            "srun", f"--jobid={self.alloc.job_id}", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            "--relative=0", f"--cpus-per-task={self.alloc.cpus_per_node}", "--kill-on-bad-exit=1", "--wait=60",
            f"--job-name={self.step_name(package)}", "--export=ALL", "--quiet",
            f"--gres=gpu:{gpus_per_node}" if gpus_per_node else "--gres=none",
        ]  # fmt: skip

    def prefix(self, kind: str, package: str) -> list[str]:
        """What a one-node package's worker command is run under: srun on the allocation's first node."""
        if kind not in ONE_NODE_KINDS:
            return []
        return self.srun(package, 1, self.alloc.gpus_per_node)

    def step(self, package: str, nproc_per_node: int, scratch: Path) -> SlurmStep:
        """A train package on every node: the node agent's srun, the rendezvous port and id, the clock folder."""
        nodes = len(self.alloc.nodes)
        port = rendezvous_port(self.step_name(package), ephemeral_ports())
        return SlurmStep(srun=self.srun(package, nodes, self.alloc.gpus_per_node), nodes=nodes,
                         nproc_per_node=nproc_per_node, port=port, rdzv_id=self.step_name(package),
                         clock_dir=str(scratch / "clock" / package))

    def check_seals(self, expected: dict[str, tuple[Path, str]], when: str) -> None:
        """Every node hashes every sealed copy (one srun task a node); a node that reads another root fails the run,
        named by its salted hash. `expected`: arm -> (sealed path, root of the seal's manifest)."""
        pairs = [f"{arm}={path}" for arm, (path, _) in sorted(expected.items())]
        argv = [*self.srun("seal", len(self.alloc.nodes), 0), sys.executable, "-m", "workers.node", "seal", *pairs]
        out = _run(argv, timeout=SEAL_TIMEOUT_S)
        seen: dict[str, dict[str, object]] = {}
        for line in out.splitlines():
            if line.startswith("{"):
                doc = json.loads(line)
                seen[str(doc["node"])] = doc
        problems = []
        for name in self.alloc.nodes:
            doc = seen.get(name)
            who = f"node {node_hash(self.salt_dir, name)[:16]}"
            if doc is None:
                problems.append(f"{who} did not answer the seal check")
                continue
            roots = doc["roots"]
            assert isinstance(roots, dict)
            for arm, (_, root) in sorted(expected.items()):
                got = roots.get(arm)
                if got != root:
                    shown = "unreadable" if got is None else f"root {str(got)[:12]}"
                    problems.append(f"{who}: sealed copy of {arm} is {shown}, expected {root[:12]}")
        if problems:
            raise FailedError(f"sealed copies differ across nodes {when}: {'; '.join(problems)}; every node must read "
                              "the same sealed copy (shared storage)")


STEP_NOTE = re.compile(r"^slurm job (\d+) steps ([0-9,]+)")


def ephemeral_ports(path: Path = EPHEMERAL_RANGE) -> tuple[int, int]:
    """The range the kernel hands out for outgoing connections and bind(0) on this host (inclusive)."""
    try:
        lo, hi = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return lo, hi


def rendezvous_port(step_name: str, ephemeral: tuple[int, int]) -> int:
    """A train package's rendezvous port: one per package, from its step name (a lingering store of an earlier
    package never collides), outside the ephemeral range. A port in that range can be taken by any process's
    connection or bind(0) on the node before the store listens: seen as torchrun's EADDRINUSE on a host running
    other launches beside. The range is read on orch's host; the allocation's nodes are taken to use the same one
    (the kernel's default unless configured). Where it covers every candidate, every candidate is used."""
    lo, hi = ephemeral
    ports = [p for p in range(*RDZV_PORTS) if not lo <= p <= hi] or list(range(*RDZV_PORTS))
    digest = hashlib.sha256(step_name.encode()).digest()
    return ports[int.from_bytes(digest[:4], "big") % len(ports)]
