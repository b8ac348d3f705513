"""Where orch keeps its state: `--home`, else $ORCH_HOME, else ./.orch, with runs/, ledger/ and scratch/.

Shared by the launcher, the ledger and the audit so that every command finds the same files and run ids.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from protocol.errors import UsageError

LEDGER_FILE = "ledger.arrows"
OWNERS_DIR = ".owners"  # under scratch/: one flock'd file per live run (the kernel drops it when orch dies)
# what `orch launch` prints (e.g. 20260101T000000Z-0123abcd-9f3e) and what tests name runs: one path segment
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
HOME_FOLDERS = ("runs", "ledger", "scratch")
# written into every home: git never lists it (a home inside a project is never committed by accident)
GITIGNORE = "# orch's home (runs, ledger, scratch): never committed\n*\n"


def is_home(path: Path) -> bool:
    """Whether a folder is an orch home (it holds runs/, ledger/ and scratch/): never a source, never sealed."""
    return all(os.path.isdir(os.path.join(path, d)) and not os.path.islink(os.path.join(path, d))
               for d in HOME_FOLDERS)


def validate_run_id(run_id: str) -> str:
    """The run id itself, or UsageError when it is not one plain folder name under runs/ (no `/`, no `..`)."""
    if not RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise UsageError(f"{run_id!r} is not a run id (letters, digits, '.', '_' or '-'; no '/' and no '..'); "
                         "give a run id printed by `orch launch`")
    return run_id


@dataclass(frozen=True)
class Home:
    root: Path

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def ledger_dir(self) -> Path:
        return self.root / "ledger"

    @property
    def ledger_path(self) -> Path:
        return self.ledger_dir / LEDGER_FILE

    @property
    def scratch(self) -> Path:
        return self.root / "scratch"

    @property
    def witness_dir(self) -> Path:
        return self.root / "witness"

    def create(self) -> None:
        """Its folders, and a .gitignore that keeps git from listing any of it (the default ./.orch is in a project)."""
        for d in HOME_FOLDERS:
            (self.root / d).mkdir(parents=True, exist_ok=True)
        ignore = self.root / ".gitignore"
        if not ignore.exists():
            ignore.write_text(GITIGNORE)

    def run_dir(self, run_id: str) -> Path:
        return self.runs / validate_run_id(run_id)

    def owner_lock(self, run_id: str) -> Path:
        return self.scratch / OWNERS_DIR / f"{validate_run_id(run_id)}.lock"

    @contextlib.contextmanager
    def hold_owner(self, run_id: str) -> Iterator[None]:
        """Hold the run's owner lock while the run lives; the file appears already locked (rename into place)."""
        final = self.owner_lock(run_id)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # no content: the lock is the record (nothing to write on a full disk)
            os.replace(tmp, final)
            yield
            final.unlink(missing_ok=True)  # unlinked while still held: nobody can think it free meanwhile
        finally:
            tmp.unlink(missing_ok=True)
            os.close(fd)

    def run_is_live(self, run_id: str) -> bool | None:
        """True while the run's orch process holds its owner lock, False once it is gone, None when the run
        has no owner lock (a run of an older orch, or one that ended: its lock file is removed at its end)."""
        try:
            fd = os.open(self.owner_lock(run_id), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops a lock taken just now
        return False


def resolve_home(home: Path | None = None) -> Home:
    """`home` if given, else $ORCH_HOME, else ./.orch (made absolute, not created)."""
    if home is None:
        env = os.environ.get("ORCH_HOME")
        home = Path(env) if env else Path(".orch")
    return Home(home.expanduser().resolve())
