"""Package isolation: a read-only system but for the package's own folders, and no process of it outliving it.

Namespace mode (orchestrator/isolation/ns_init.py): the whole file system read-only but its holes, in a PID namespace
whose init ends and names what is left; scan mode (no namespaces): a cgroup v2, else the token scan, ends what is left,
and the interpreter's startup surface and the shared temporary folders are compared before and after.
docs/THREAT_MODEL.md says what each mode guarantees.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.isolation.cgroups import PackageCgroup, joiner
from orchestrator.isolation.process_group import group_members
from orchestrator.isolation.stragglers import carries_token
from orchestrator.isolation.surface import Snapshot, changes, snapshot

NS_INIT = Path(__file__).with_name("ns_init.py")
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")
GRACE_S = 1.0  # what is still ending when the package's main process ends is given this long
ENDINGS = ("pid-namespace", "cgroup", "token-scan")
NETWORKS = ("own", "host")
SETTLE_S = 0.5  # scan mode: a new shared entry counts only if a re-listing this much later still finds it


# a private TMPDIR of at most this many characters leaves 43 for what is made under it (multiprocessing's
# pymp-XXXXXXXX/listener-XXXXXXXX: 33) within the 107 of an AF_UNIX socket path
PRIVATE_TMP_MAX = 64


def private_tmp_base() -> str:
    """Where each package's private TMPDIR is made: /tmp (short whatever the home's path), else the system's."""
    return "/tmp" if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK) else tempfile.gettempdir()


def private_tmp_problem() -> str | None:
    """One line when a package's private TMPDIR would be too long for AF_UNIX sockets, else None (orch launch)."""
    longest = len(os.path.realpath(private_tmp_base())) + len("/orch-XXXXXXXX")
    if longest <= PRIVATE_TMP_MAX:
        return None
    return (f"a package's private TMPDIR under {private_tmp_base()} would be {longest} characters (at most "
            f"{PRIVATE_TMP_MAX}): socket paths under it pass the 107-character AF_UNIX limit and a DataLoader worker "
            "fails; set TMPDIR to a short folder")


def _user_home() -> str | None:
    try:
        home = pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        return None
    return home if home not in ("", "/") and os.path.isdir(home) else None


def protected_dirs() -> list[str]:
    """The shared folders scan mode lists (/tmp, /var/tmp, /dev/shm, the user's real home): a new entry there that
    stays, held open by no process outside the package, fails it."""
    out = [d for d in ("/tmp", "/var/tmp") if os.path.isdir(d) and not os.path.islink(d)]
    home = _user_home()
    if home is not None and all(not _under(home, d) for d in out):
        out.append(os.path.realpath(home))
    out += [d for d in ("/dev/shm",) if os.path.isdir(d)]
    return list(dict.fromkeys(os.path.realpath(d) for d in out))


def _under(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def ns_command(holes: Sequence[str], dev_staging: str, report_fd: int, cwd: str, cmd: Sequence[str],
               grace_s: float = GRACE_S, network: str = "own",
               endpoints: Sequence[tuple[str, int]] = ()) -> list[str]:
    """The command line that runs `cmd` in the package's namespaces (orchestrator/isolation/ns_init.py, isolated
    Python). `network`: own (a network namespace of its own, the host's path sockets masked, only `endpoints` relayed)
    or host (srun, which needs slurmctld and munge)."""
    if network not in NETWORKS:
        raise ValueError(f"network {network!r} is not own or host")
    cfg = {"holes": list(holes), "dev_staging": dev_staging, "report_fd": report_fd, "cwd": cwd, "grace_s": grace_s,
           "network": network, "endpoints": [[host, port] for host, port in endpoints]}
    return [sys.executable, "-I", "-S", str(NS_INIT), json.dumps(cfg, sort_keys=True), "--", *cmd]


def read_report(fd: int, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The init's report (read to EOF; every writer has ended with the package), or None if it never came."""
    chunks = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        doc = json.loads(b"".join(chunks))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


@functools.cache
def namespaces_work() -> bool:
    """Whether this kernel and user may make the package's namespaces (tried once per process, for real)."""
    with tempfile.TemporaryDirectory(prefix="orch-isolation-") as tmp:
        (Path(tmp) / "dev").mkdir()
        (Path(tmp) / "hole").mkdir()
        read_fd, write_fd = os.pipe()
        argv = ns_command([f"{tmp}/hole"], f"{tmp}/dev", write_fd, tmp, ["sh", "-c", f"echo ok > {tmp}/hole/ok"])
        try:
            rc = subprocess.run(argv, capture_output=True, timeout=30, check=False, pass_fds=(write_fd,)).returncode
        except (OSError, subprocess.TimeoutExpired):
            rc = -1
        finally:
            os.close(write_fd)
        report = read_report(read_fd, timeout_s=5)
        return rc == 0 and report is not None and (Path(tmp) / "hole" / "ok").is_file()


@functools.cache
def cgroups_work() -> bool:
    """Whether this user may make a cgroup v2 with cgroup.kill here (tried once per process)."""
    group = PackageCgroup.make(f"orch-probe-{os.getpid()}")
    if group is None:
        return False
    group.kill_and_remove()
    return True


def _listing(dirs: Sequence[str]) -> dict[str, set[str]]:
    uid = os.geteuid()
    out: dict[str, set[str]] = {}
    for d in dirs:
        names: set[str] = set()
        try:
            with os.scandir(d) as it:
                for entry in it:
                    try:
                        if entry.stat(follow_symlinks=False).st_uid == uid:
                            names.add(entry.name)
                    except OSError:
                        continue
        except OSError:
            pass
        out[d] = names
    return out


def held_open(paths: Sequence[str], token: str | None) -> set[str]:
    """Which of `paths` (an open file or working folder at or below one) a live process outside the package holds:
    /proc/PID/fd and cwd of every process, skipping what cannot be read (another user's, or gone); a process that
    carries the package's `token` is the package's own."""
    if not paths:
        return set()
    held: set[str] = set()
    me = os.getpid()
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        targets = _open_paths(pid)
        hits = {p for p in paths if p not in held and any(_at_or_below(t, p) for t in targets)}
        if hits and (pid == me or token is None or not carries_token(pid, token)):
            held |= hits
    return held


def _open_paths(pid: int) -> list[str]:
    out = []
    try:
        with os.scandir(f"/proc/{pid}/fd") as it:
            for entry in it:
                try:
                    out.append(os.readlink(entry.path))
                except OSError:
                    continue
    except OSError:
        pass
    try:
        out.append(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        pass
    return out


def _at_or_below(target: str, path: str) -> bool:
    return target == path or target.startswith(path.rstrip("/") + "/")


def fresh_folders(scratch_dir: str, name: str, trainer: bool) -> list[str]:
    """Make package `name`'s private folders in scratch anew: isolated/NAME (its TMPDIR, HOME, /dev staging) and, for
    a package with one, trainer/NAME. Returns those that were there already or that lie under a link (lstat, never
    followed): an earlier package planted them (none is ever reused; the package must fail, naming them)."""
    planted = []
    for parent, leaf in [("isolated", name), *([("trainer", name)] if trainer else [])]:
        above = Path(scratch_dir) / parent
        above.mkdir(parents=True, exist_ok=True)
        if not stat.S_ISDIR(os.lstat(above).st_mode):
            planted.append(str(above))
            continue
        try:
            os.mkdir(above / leaf)
        except FileExistsError:
            planted.append(str(above / leaf))
    return planted


def _named(procs: Sequence[tuple[int, str]]) -> list[str]:
    return [f"{name} (pid {pid})" for pid, name in procs]


@dataclass
class PackageIsolation:
    """The isolation of one package: its private folders, its mode, how its processes are ended, what it found."""

    mode: str  # namespace | scan
    ending: str  # pid-namespace | cgroup | token-scan
    root: Path
    keep: list[str]  # the writable holes (namespace mode), the allowed places (scan mode)
    protected: list[str]
    surface: list[str] = field(default_factory=list)
    before: dict[str, set[str]] = field(default_factory=dict)
    surface_before: Snapshot = field(default_factory=dict)
    survivors: list[str] = field(default_factory=list)
    cgroup: PackageCgroup | None = None
    network_wanted: str = "own"  # own | host (namespace mode; ns_command)
    endpoints: list[tuple[str, int]] = field(default_factory=list)
    network: str = "host"  # what held, as run.json says it: namespace | host | host: why (the init's report)
    _report: tuple[int, int] | None = None
    private_tmp: Path | None = None  # its TMPDIR: /tmp/orch-XXXXXXXX (start() makes it; finish() removes it)
    _cgroup_fd: int | None = None

    @property
    def tmpdir(self) -> Path:
        return self.private_tmp if self.private_tmp is not None else self.root / "tmp"

    @property
    def home(self) -> Path:
        return self.root / "home"

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {**env, "TMPDIR": str(self.tmpdir), "HOME": str(self.home)}

    def command(self, cmd: Sequence[str], cwd: str) -> list[str]:
        if self.mode != "namespace":
            return list(cmd)
        assert self._report is not None, "start() first"
        return ns_command(self.keep, str(self.root / "dev"), self._report[1], cwd, cmd,
                          network=self.network_wanted, endpoints=self.endpoints)

    def start(self) -> None:
        """Make its folders (holes must exist to be mounted), then what its mode needs before it runs."""
        if self.private_tmp is None:  # short: socket paths under it (DataLoader workers, shared memory) stay legal
            self.private_tmp = Path(os.path.realpath(tempfile.mkdtemp(prefix="orch-", dir=private_tmp_base())))
            self.keep.append(str(self.private_tmp))
        for d in (self.tmpdir, self.home, self.root / "dev"):
            d.mkdir(parents=True, exist_ok=True)
        if self.mode == "namespace":
            self._report = os.pipe()
        else:
            self.before = _listing(self.scanned())
            self.surface_before = snapshot(self.surface)
        if self.ending == "cgroup":
            self.cgroup = PackageCgroup.make(f"orch-{self.root.parent.parent.name}-{self.root.name}-{os.getpid()}")
            if self.cgroup is None:
                self.ending = "token-scan"
            else:
                self._cgroup_fd = joiner(self.cgroup.procs_file())

    def spawn_args(self) -> dict[str, Any]:
        """What spawn_in_group needs: the init's report pipe, or the cgroup to join."""
        return {"pass_fds": () if self._report is None else (self._report[1],), "cgroup_fd": self._cgroup_fd}

    def spawned(self) -> None:
        """After the spawn: the parent's copies of the child's descriptors are closed."""
        if self._report is not None:
            os.close(self._report[1])
        if self._cgroup_fd is not None:
            os.close(self._cgroup_fd)
            self._cgroup_fd = None

    def leader_exited(self, proc: subprocess.Popen[bytes]) -> None:
        """Scan mode, once the main process has ended: what is still running after the grace is named."""
        if self.mode == "namespace":
            return
        deadline = time.monotonic() + GRACE_S
        while True:
            left = self.cgroup.members() if self.cgroup is not None else group_members(proc.pid)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        self.survivors += _named(left)

    def finish(self) -> None:
        """After the package: the init's report read (namespace mode), or its cgroup killed and removed; its private
        TMPDIR removed."""
        try:
            self._finish()
        finally:
            if self.private_tmp is not None:
                shutil.rmtree(self.private_tmp, ignore_errors=True)  # never follows a link it holds

    def _finish(self) -> None:
        if self._report is not None:
            report = read_report(self._report[0])
            self._report = None
            if report is None:
                return
            self.network = str(report.get("network", "host: no report from the namespace's init"))
            self.survivors += _named([(int(s["pid"]), str(s["name"])) for s in report.get("survivors", [])])
            more = int(report.get("survivor_count", 0)) - len(report.get("survivors", []))
            if more > 0:
                self.survivors.append(f"{more} more")
        if self.cgroup is not None:
            self.cgroup.kill_and_remove()
            self.cgroup = None

    def scanned(self) -> list[str]:
        return [d for d in self.protected if os.path.isdir(d)]

    def written_outside(self, token: str | None = None) -> list[str]:
        """Scan mode: the entries of this user's that appeared in the shared folders while the package ran, are still
        there SETTLE_S later (a re-listing) and that no live process outside the package holds open. Scan mode cannot
        tell which process made an entry; this leaves out what another process of the user is using or has already
        removed (a compiler's temporaries). The package's own processes: those carrying `token` (its
        ORCH_PACKAGE_TOKEN); its cgroup's were all killed with it (finish())."""
        if self.mode != "scan":
            return []
        new = self._new_entries(_listing(self.scanned()))
        if not new:
            return []
        time.sleep(SETTLE_S)
        again = _listing(self.scanned())
        stayed = [p for p in new if os.path.basename(p) in again.get(os.path.dirname(p), set())]
        held = held_open(stayed, token)
        return [_shown(p) for p in stayed if p not in held]

    def _new_entries(self, after: dict[str, set[str]]) -> list[str]:
        found = []
        for d, names in after.items():
            for name in sorted(names - self.before.get(d, set())):
                path = os.path.join(d, name)
                if any(_under(k, path) or _under(path, k) for k in self.keep):
                    continue  # the run's own folders (or a folder above them) are allowed
                found.append(path)
        return found

    def surface_changed(self) -> list[str]:
        """Scan mode: what changed in the interpreter's startup surface while the package ran."""
        if self.mode != "scan":
            return []
        return [_shown(c) for c in changes(self.surface_before, snapshot(self.surface))]


def _shown(path: str) -> str:
    """A path as evidence may show it: the user's home becomes '~' (never an absolute private path)."""
    home = _user_home()
    if home is not None and _under(path, home):
        return "~/" + os.path.relpath(path, os.path.realpath(home))
    return path


def isolate(scratch_dir: str, name: str, keep: Sequence[str], mode: str = "auto",
            protect: Sequence[str] = (), surface: Sequence[str] = (), ending: str = "auto",
            shared: Sequence[str] | None = None, network: str = "own",
            endpoints: Sequence[tuple[str, int]] = ()) -> PackageIsolation:
    """The isolation of package `name`: private folders under scratch/isolated/NAME; mode auto = namespace where
    the kernel allows, else scan. `keep`: the package's own folders (writable; the rest is read-only in the
    namespace). `protect`: more folders scan mode lists (orch's home). `surface`: the interpreter's startup
    folders scan mode compares. `ending` (scan mode): auto = a cgroup where one can be made, else the token scan;
    mode "scan+ENDING" (as run.json records it) names both. `shared`: the shared folders scan mode lists instead
    of the host's (protected_dirs()); only tests name one, a private folder no other process on the host touches.
    `network` (namespace mode): own = a network namespace of its own reaching only `endpoints` (host, port), the
    host's path sockets masked; host = the host's network (srun); scan mode always shares the host's."""
    if mode.startswith("scan+"):
        mode, ending = "scan", mode.removeprefix("scan+")
    if mode == "auto":
        mode = "namespace" if namespaces_work() else "scan"
    if mode not in ("namespace", "scan"):
        raise ValueError(f"isolation mode {mode!r} is not namespace, scan or auto")
    if mode == "namespace":
        ending = "pid-namespace"
    elif ending == "auto":
        ending = "cgroup" if cgroups_work() else "token-scan"
    if ending not in ENDINGS or (mode == "scan" and ending == "pid-namespace"):
        raise ValueError(f"ending {ending!r} does not go with isolation mode {mode!r}")
    root = Path(scratch_dir) / "isolated" / name
    keep_paths = list(dict.fromkeys(os.path.realpath(k) for k in [*keep, str(root)]))
    protected = protected_dirs() if shared is None else [os.path.realpath(d) for d in shared]
    more = [os.path.realpath(p) for p in protect if os.path.isdir(p)]
    protected += [p for p in more if p not in protected]  # a listing is one level deep: one under /tmp counts too
    if network not in NETWORKS:
        raise ValueError(f"network {network!r} is not own or host")
    return PackageIsolation(mode, ending, root, keep_paths, protected, list(surface), network_wanted=network,
                            endpoints=list(endpoints))
