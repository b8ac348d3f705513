"""What a torchrun log says about its failed ranks: the one cause a failed package's note names, and whether a rank
was killed by a signal that neither torchrun nor Slurm's stop sends (SIGTERM)."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

from workers.common import RANK_FAILED_RE

_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):\s*\[\d+\]:(?:\n\s+\w+\s*:.*)*?"
                         r"\n\s+rank\s*:\s*(\d+).*?\n\s+exitcode\s*:\s*(-?\d+)")
_FAILURE = re.compile(r"^\s+rank\s*:\s*(\d+).*\n\s+exitcode\s*:\s*(-?\d+)", re.MULTILINE)
RANK_FAILED_LINE = re.compile(RANK_FAILED_RE)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "an unknown signal"


def _failures(log: str) -> list[tuple[int, int]]:
    """(rank, exit code) of each failure torchrun lists, its root cause first."""
    failures = [(int(m.group(1)), int(m.group(2))) for m in _FAILURE.finditer(log)]
    root = _ROOT_CAUSE.search(log)
    if root:
        failures.insert(0, (int(root.group(1)), int(root.group(2))))
    return failures


def killed_rank(log: str) -> tuple[int, int] | None:
    """(rank, signal) of the first rank killed by a signal other than SIGTERM (which torchrun sends to the survivors
    and Slurm's stop to every task), or None."""
    return next(((r, -e) for r, e in _failures(log) if e < 0 and -e != signal.SIGTERM), None)


def failure_cause(log: str) -> str | None:
    """The first error line of the failing rank, never torchrun's banner.

    A rank killed by a signal torchrun does not send (it sends SIGTERM to the survivors) is the cause; else the
    rank whose trainer raised first (the probe's timed line per rank); else torchrun's first observed failure;
    else the final line of the first traceback in the log that is not torchrun's own.
    """
    lines = log.splitlines()
    killed = killed_rank(log)
    if killed:
        return f"rank {killed[0]} was killed by signal {killed[1]} ({signal_name(killed[1])})"
    raised = sorted((float(m.group(2)), int(m.group(1)), m.group(3)) for m in map(RANK_FAILED_LINE.match, lines) if m)
    if raised:
        return f"rank {raised[0][1]}: {raised[0][2]}"
    failures = _failures(log)
    rank, exitcode = failures[0] if failures else (None, None)
    if exitcode is not None and exitcode < 0:
        return f"rank {rank} was killed by signal {-exitcode} ({signal_name(-exitcode)})"
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" not in line:
            continue
        final = next((ln for ln in lines[i + 1 :] if ln and not ln[0].isspace()), None)
        if final is not None and "ChildFailedError" not in final:
            return (f"rank {rank} exited with {exitcode}: " if rank is not None else "") + final.strip()
    return None if rank is None else f"rank {rank} exited with {exitcode}"


# errors after which a rank waits forever instead of failing: a DataLoader worker's queue thread cannot open its
# AF_UNIX socket (its path under TMPDIR passes the 107-character limit), and the rank blocks on that worker's queue
_HANGS = re.compile(r"^[\w.]*Error: AF_UNIX path too long.*$", re.MULTILINE)


def wait_or_hung(proc: subprocess.Popen[bytes], log: Path, poll_s: float = 1.0) -> tuple[int, str | None]:
    """torchrun's exit status; or, as soon as its log shows an error after which ranks hang, torchrun ended
    (SIGTERM, then SIGKILL after 30 s) and that error's line."""
    offset, carry = 0, b""
    while True:
        try:
            return proc.wait(timeout=poll_s), None
        except subprocess.TimeoutExpired:
            pass
        try:
            with open(log, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except OSError:
            continue
        offset += len(chunk)
        found = _HANGS.search((carry + chunk).decode(errors="replace"))
        carry = (carry + chunk)[-200:]  # a line cut between two reads
        if found:
            proc.terminate()
            try:
                return proc.wait(timeout=30), found.group(0).strip()
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait(), found.group(0).strip()
