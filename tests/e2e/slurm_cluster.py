"""A real Slurm cluster on this host for the tests, from Debian's packages (slurmctld, slurmd, slurmdbd, munge,
mariadb-server): munged, MariaDB, slurmdbd, slurmctld and three slurmd nodes, every port free, all under one folder.

n1 and n2 form partition `main` (the default); n3 runs in its own mount namespace in which the folder `skew/` is
another, empty one (a node that does not see the shared storage): partition `skew` = n1, n3. Each node has one
count-only gres/gpu (a placeholder character device: nothing uses it; Slurm accounts it as a GPU).
Cluster(root, accounting=False) starts without MariaDB and slurmdbd (~1 s; sacct does not answer).
Usage outside pytest: python tests/e2e/slurm_cluster.py DIR (starts it, prints SLURM_CONF, stops on Ctrl-C).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from protocol.process import die_with_parent

DAEMONS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd", "sacctmgr", "srun", "sacct")
ACCOUNTING_DAEMONS = ("mariadbd", "mariadb-install-db", "slurmdbd", "sacctmgr", "sacct")
LIBDIR = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm")
# a throw-away accounting database, in memory (/dev/shm) where it has room: every fsync on this host's disk costs
# (mariadb-install-db took ~2.9 s on disk, ~0.5 s there); no flush at each commit, no doublewrite, an 8 MB redo log in
# place of the 100 MB one that is otherwise written out (the database is ~25 MB, not ~115 MB)
SHM = Path("/dev/shm")
INNODB = ("--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M", "--innodb-flush-log-at-trx-commit=0",
          "--innodb-doublewrite=0")


def missing(accounting: bool = True) -> list[str]:
    """What this host lacks to run the cluster (empty when it can); without accounting: no MariaDB, no slurmdbd."""
    need = DAEMONS if accounting else tuple(d for d in DAEMONS if d not in ACCOUNTING_DAEMONS)
    gone = [d for d in need if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]
    if accounting and not gone and not any(LIBDIR.glob("accounting_storage_mysql.so")):
        gone.append("slurmdbd's accounting_storage/mysql plugin")
    if not gone and os.geteuid() != 0:
        gone.append("root (the daemons run as root here)")
    return gone


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _sbin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class Cluster:
    root: Path
    accounting: bool = True  # slurmdbd on MariaDB (sacct answers); without: munged, slurmctld and the slurmd only
    pids: list[int] = field(default_factory=list)  # every daemon this cluster started, in start order
    skew: bool = False  # n3 runs in its own mount namespace
    node_pids: dict[str, int] = field(default_factory=dict)  # slurmd of each node
    db_dir: Path | None = None  # MariaDB's data: in /dev/shm (removed by stop) or root/db

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)

    def _daemon(self, argv: list[str], pidfile: Path, timeout: float = 30) -> int:
        """A daemon in the foreground, our child, that the kernel stops when the process that started it dies
        (a killed pytest leaves no cluster behind); ready once its pid file names it."""
        log = open(self.root / "log" / f"{Path(argv[0]).name}.{len(self.pids)}.out", "wb")
        proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                preexec_fn=die_with_parent(signal.SIGTERM), start_new_session=True)
        log.close()
        self.pids.append(proc.pid)
        deadline = time.monotonic() + timeout
        while not (pidfile.is_file() and pidfile.read_text().strip() == str(proc.pid)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} did not start (exit {proc.poll()}); see {log.name}")
            time.sleep(0.2)
        return proc.pid

    def start(self) -> None:
        r = self.root
        for d in ("state", "spool", "log", "munge", "dev", "skew", "skew-elsewhere"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o755)
        p = dict(zip(("ctld", "dbd", "mysql", "n1", "n2", "n3"), _free_ports(6), strict=True))
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        sock = r / "munge" / "munge.socket"
        self._daemon([_sbin("munged"), "-F", "-f", f"--socket={sock}", f"--key-file={key}",
                      f"--log-file={r}/log/munged.log", f"--pid-file={r}/munge/munged.pid",
                      f"--seed-file={r}/munge/seed"], r / "munge" / "munged.pid")
        if self.accounting:
            self._start_accounting(p, sock)
        os.mknod(r / "dev" / "gpu0", 0o644 | 0o020000, os.makedev(1, 3))  # a character device, as gres/gpu wants
        nodes = "".join(
            f"NodeName={n} NodeHostname=localhost Port={p[n]} CPUs=2 RealMemory=1000 Gres=gpu:1 State=UNKNOWN\n"
            for n in ("n1", "n2", "n3")
        )
        accounting = (f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
                      f"AccountingStoragePort={p['dbd']}\nAccountingStoragePass={sock}\n"
                      "AccountingStorageTRES=gres/gpu\n") if self.accounting else ""
        self.conf.write_text(f"""ClusterName=orchtest
SlurmctldHost=localhost
SlurmctldPort={p['ctld']}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
{accounting}GresTypes=gpu
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
{nodes}PartitionName=main Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
PartitionName=skew Nodes=n1,n3 MaxTime=INFINITE State=UP
""")
        (r / "gres.conf").write_text(f"NodeName=n[1-3] Name=gpu File={r}/dev/gpu0\n")
        if self.accounting:
            self._daemon([_sbin("slurmdbd"), "-D"], r / "slurmdbd.pid", timeout=90)
            for argv in (["add", "cluster", "orchtest"], ["add", "account", "orch"],
                         ["add", "user", "root", "account=orch"]):
                self._retry(["sacctmgr", "-i", *argv])
        self._daemon([_sbin("slurmctld"), "-D", "-f", str(self.conf)], r / "slurmctld.pid")
        for n in ("n1", "n2"):
            self.start_node(n)
        self.skew = self._start_skewed_node()
        self.wait_idle(["n1", "n2", *(["n3"] if self.skew else [])])

    def _start_accounting(self, p: dict[str, int], sock: Path) -> None:
        """MariaDB and slurmdbd's configuration on it (sacct needs slurmdbd; its only storage is MySQL/MariaDB)."""
        r = self.root
        if _free_bytes(SHM) >= 1 << 30:
            self.db_dir = Path(tempfile.mkdtemp(prefix="orch-slurm-db-", dir=SHM))
        else:
            self.db_dir = r / "db"
            self.db_dir.mkdir()
        subprocess.run([_sbin("mariadb-install-db"), "--user=root", f"--datadir={self.db_dir}", "--skip-test-db",
                        "--auth-root-authentication-method=socket", *INNODB], capture_output=True, check=True,
                       timeout=120)
        mysql_sock = r / "mysql.sock"
        self._daemon([_sbin("mariadbd"), "--no-defaults", "--user=root", f"--datadir={self.db_dir}",
                      f"--socket={mysql_sock}", f"--port={p['mysql']}", "--bind-address=127.0.0.1",
                      f"--pid-file={r}/mysql.pid", f"--log-error={r}/log/mysql.err", "--skip-log-bin", *INNODB],
                     r / "mysql.pid", timeout=60)
        while not mysql_sock.exists():
            time.sleep(0.2)
        subprocess.run(["mariadb", f"--socket={mysql_sock}", "-u", "root", "-e",
                        "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm'; "
                        "GRANT ALL ON *.* TO 'slurm'@'127.0.0.1';"], check=True, capture_output=True, timeout=60)
        (r / "slurmdbd.conf").write_text(f"""AuthType=auth/munge
AuthInfo=socket={sock}
DbdHost=localhost
DbdPort={p['dbd']}
SlurmUser=root
LogFile={r}/log/slurmdbd.log
PidFile={r}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={p['mysql']}
StorageUser=slurm
StoragePass=slurm
StorageLoc=orch_acct
""")
        (r / "slurmdbd.conf").chmod(0o600)

    def start_node(self, name: str) -> None:
        """The slurmd of node `name` (again, after kill_node: ReturnToService=2 puts it back in service)."""
        self.node_pids[name] = self._daemon([_sbin("slurmd"), "-D", "-f", str(self.conf), "-N", name],
                                            self.root / f"slurmd.{name}.pid")

    def _retry(self, argv: list[str], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            done = self.run(*argv)
            if done.returncode == 0 or "Nothing new added" in done.stdout + done.stderr:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()[-300:]}")

    def _start_skewed_node(self) -> bool:
        """n3 in its own mount namespace, where skew/ is bind-mounted from skew-elsewhere (empty)."""
        r = self.root
        probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=30)
        if probe.returncode != 0:
            return False
        inner = (f"mount --make-rprivate / && mount --bind {r}/skew-elsewhere {r}/skew && "
                 f"exec {_sbin('slurmd')} -D -f {self.conf} -N n3")
        self._daemon(["unshare", "--mount", "sh", "-c", inner], r / "slurmd.n3.pid")
        return True

    def wait_idle(self, nodes: list[str], timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split("\n")
            states = dict(line.split()[:2] for line in out if len(line.split()) >= 2)
            if all(states.get(n, "").startswith("idle") for n in nodes):
                return
            time.sleep(0.2)
        raise RuntimeError(f"nodes not idle after {timeout} s: {states}")

    def processes(self) -> list[int]:
        """Every live process of this cluster: its daemons, every slurmstepd (they detach from slurmd: SIGTERM to a
        slurmd leaves them running) and what runs under them; all carry this cluster's SLURM_CONF (slurmstepd has
        slurmd's environment), or descend from one that does."""
        me = os.getpid()
        marked = set()
        wanted = f"SLURM_CONF={self.conf}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                if wanted in (entry / "environ").read_bytes().split(b"\0"):
                    marked.add(int(entry.name))
            except OSError:
                continue
        # with their descendants: a job started with --export=NONE has no SLURM_CONF
        return sorted(pid for pid in _descendants(marked) - {me} if _alive(pid))

    def step_processes(self) -> list[int]:
        """The cluster's slurmstepd processes and what they run (its jobs' steps on every node)."""
        steps = set()
        for pid in self.processes():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"slurmstepd"):
                    steps.add(pid)
            except OSError:
                continue
        return sorted(pid for pid in _descendants(steps) if _alive(pid))

    def node_processes(self, name: str) -> list[int]:
        """What runs as node `name`: its slurmd, its slurmstepds (they log into the node's slurmd log) and their
        descendants."""
        log = str(self.root / "log" / f"slurmd.{name}.log")
        roots = {self.node_pids[name]} if name in self.node_pids else set()
        for pid in self.processes():
            try:
                if (Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"slurmstepd")
                        and any(os.readlink(fd) == log for fd in Path(f"/proc/{pid}/fd").iterdir())):
                    roots.add(pid)
            except OSError:
                continue
        return sorted(pid for pid in _descendants(roots) if _alive(pid))

    def kill_node(self, name: str) -> list[int]:
        """Node `name` dies (as in a power loss): SIGKILL to its slurmd and everything its slurmstepds run."""
        victims = self.node_processes(name)
        for pid in victims:
            _kill(pid, signal.SIGKILL)
        self.node_pids.pop(name, None)
        return victims

    def stop(self) -> None:
        """Cancel every job (Slurm ends its steps on every node), SIGTERM every daemon this cluster started (newest
        first), SIGKILL what is left after a grace, then whatever of the cluster still runs (a slurmstepd of a node
        whose slurmd died, what it ran)."""
        if self.pids and self.conf.is_file():
            try:
                jobs = self.run("squeue", "-h", "-o", "%A", timeout=15).stdout.split()
                if jobs:
                    self.run("scancel", *jobs, timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                pass  # no controller to ask (it never started or died): the sweep below ends what runs
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.step_processes():
                time.sleep(0.2)
        for pid in reversed(self.pids):
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for pid in reversed(self.pids):
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            if _alive(pid):
                _kill(pid, signal.SIGKILL)
        self.pids.clear()
        self.node_pids.clear()
        deadline = time.monotonic() + 10
        while (left := self.processes()) and time.monotonic() < deadline:
            for pid in left:
                _kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        if self.db_dir is not None and self.db_dir.parent == SHM:
            shutil.rmtree(self.db_dir, ignore_errors=True)  # memory, not the root's folder: the caller removes that


def _free_bytes(folder: Path) -> int:
    try:
        st = os.statvfs(folder)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _kill(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _descendants(roots: set[int]) -> set[int]:
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found = set(roots)
    while more := {pid for pid, pp in parent.items() if pp in found and pid not in found}:
        found |= more
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours (mariadbd is our child) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_term)  # a background job ignores SIGINT: SIGTERM stops the cluster
    cluster = Cluster(Path(sys.argv[1]).resolve())
    try:
        cluster.start()
        print(f"SLURM_CONF={cluster.conf}", flush=True)
        signal.pause()
    finally:
        cluster.stop()
