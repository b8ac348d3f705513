"""Package isolation: each package gets a private TMPDIR and HOME under the run's scratch and, where the kernel
allows, its own mount namespace in which the shared temporary folders and the user's home are read-only.

Guarantee (namespace mode): a package cannot write /tmp, /var/tmp, the user's home or orch's home (ledger,
witness, other runs) except the run directory, the run's scratch and TRITON_CACHE_DIR (a write fails with EROFS,
which names the path in the package's log), and gets a fresh /dev/shm that ends with it; so nothing it leaves
there can reach a later launch or the evidence. Without namespaces (scan mode) new entries in those folders are
detected after the package and fail it, naming them (a change inside an existing file, such as an append to the
ledger, is not). Limits: a process with privileges in its namespace (root, or the mapped root of an unprivileged
user namespace) can undo its own mounts, and root can always escape; folders other than these (e.g. the rest of a
project checkout) are not covered.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")
# argv: N_RO RO... N_RW RW... SHM(yes|no) CWD -- CMD...; read-only binds first, then writable holes in them
_SCRIPT = r"""set -e
n=$1; shift
while [ "$n" -gt 0 ]; do mount --bind "$1" "$1"; mount -o remount,bind,ro "$1"; shift; n=$((n-1)); done
n=$1; shift
while [ "$n" -gt 0 ]; do mount --bind "$1" "$1"; mount -o remount,bind,rw "$1"; shift; n=$((n-1)); done
if [ "$1" = yes ]; then mount -t tmpfs -o mode=1777,nosuid,nodev orch-shm /dev/shm; fi
cd "$2"
shift 3
exec "$@"
"""


def _user_home() -> str | None:
    try:
        home = pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        return None
    return home if home not in ("", "/") and os.path.isdir(home) else None


def protected_dirs() -> list[str]:
    """The shared folders a package may not write: /tmp, /var/tmp and the user's real home (where they exist)."""
    out = [d for d in ("/tmp", "/var/tmp") if os.path.isdir(d) and not os.path.islink(d)]
    home = _user_home()
    if home is not None and all(not _under(home, d) for d in out):
        out.append(os.path.realpath(home))
    return [os.path.realpath(d) for d in out]


def _under(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def _unshare_prefix() -> list[str] | None:
    exe = shutil.which("unshare")
    if exe is None or shutil.which("mount") is None:
        return None
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [exe, *user, "--mount", "--propagation", "private"]


@functools.cache
def namespaces_work() -> bool:
    """Whether this kernel and user may make the mount namespace (tried once per process, for real)."""
    prefix = _unshare_prefix()
    if prefix is None:
        return False
    with tempfile.TemporaryDirectory(prefix="orch-isolation-") as tmp:
        ro = [d for d in protected_dirs()]
        argv = [*prefix, "sh", "-c", _SCRIPT, "orch-isolate", str(len(ro)), *ro, "1", tmp,
                "yes" if os.path.isdir("/dev/shm") else "no", tmp, "--", "true"]
        try:
            return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False


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


@dataclass
class PackageIsolation:
    """The isolation of one package: its private folders, its mode, and (scan mode) the listing before it ran."""

    mode: str  # namespace | scan
    root: Path
    keep: list[str]
    protected: list[str]
    before: dict[str, set[str]] = field(default_factory=dict)

    @property
    def tmpdir(self) -> Path:
        return self.root / "tmp"

    @property
    def home(self) -> Path:
        return self.root / "home"

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {**env, "TMPDIR": str(self.tmpdir), "HOME": str(self.home)}

    def command(self, cmd: Sequence[str], cwd: str) -> list[str]:
        if self.mode != "namespace":
            return list(cmd)
        prefix = _unshare_prefix()
        assert prefix is not None
        holes = [k for k in self.keep if any(_under(k, d) for d in self.protected) and os.path.isdir(k)]
        shm = "yes" if os.path.isdir("/dev/shm") else "no"
        return [*prefix, "sh", "-c", _SCRIPT, "orch-isolate", str(len(self.protected)), *self.protected,
                str(len(holes)), *holes, shm, cwd, "--", *cmd]

    def start(self) -> None:
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        if self.mode == "scan":
            self.before = _listing(self.scanned())

    def scanned(self) -> list[str]:
        return [d for d in dict.fromkeys([*self.protected, "/dev/shm"]) if os.path.isdir(d)]

    def written_outside(self) -> list[str]:
        """Scan mode: entries that appeared in the shared folders while the package ran (owned by this user)."""
        if self.mode != "scan":
            return []
        after = _listing(self.scanned())
        found = []
        for d, names in after.items():
            for name in sorted(names - self.before.get(d, set())):
                path = os.path.join(d, name)
                if any(_under(k, path) or _under(path, k) for k in self.keep):
                    continue  # the run's own folders (or a folder above them) are allowed
                found.append(_shown(path))
        return found


def _shown(path: str) -> str:
    """A path as evidence may show it: the user's home becomes '~' (never an absolute private path)."""
    home = _user_home()
    if home is not None and _under(path, home):
        return "~/" + os.path.relpath(path, os.path.realpath(home))
    return path


def isolate(scratch_dir: str, name: str, keep: Sequence[str], mode: str = "auto",
            protect: Sequence[str] = ()) -> PackageIsolation:
    """The isolation of package `name`: private folders under scratch/isolated/NAME; mode auto = namespace where
    the kernel allows, else scan. `protect`: more folders made read-only in the namespace (orch's home: its ledger,
    witness and other runs), `keep` stays writable inside them."""
    if mode == "auto":
        mode = "namespace" if namespaces_work() else "scan"
    if mode not in ("namespace", "scan"):
        raise ValueError(f"isolation mode {mode!r} is not namespace, scan or auto")
    extra = [os.environ["TRITON_CACHE_DIR"]] if os.environ.get("TRITON_CACHE_DIR") else []
    keep_paths = [os.path.realpath(k) for k in [*keep, *extra]]
    protected = protected_dirs()
    more = [os.path.realpath(p) for p in protect if os.path.isdir(p)]
    protected += [p for p in more if not any(_under(p, d) for d in protected)]
    return PackageIsolation(mode, Path(scratch_dir) / "isolated" / name, keep_paths, protected)
