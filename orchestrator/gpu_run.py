"""gpu-run: run one command holding N GPUs (or CPU slots) of a shared host; never stops anyone else's job.

Parses arguments, waits for the lock (orchestrator.gpu_lock), runs CMD in its own process group, records.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from rich.console import Console
from rich.live import Live
from rich.text import Text

from orchestrator.gpu_lock import (
    DEFAULT_MIN_FOREIGN_MIB,
    ENV_FAKE_NVML,
    ENV_LOCK_DIR,
    ENV_SLOTS,
    Grant,
    acquire,
    exit_status,
    probe_from_env,
    resolve_slots,
    signal_group,
    spawn_in_group,
    wait_group,
)
from protocol.errors import EXIT_LOCK_TIMEOUT, EXIT_USAGE, LockTimeoutError, UsageError

RECORD_SCHEMA = "gpu-run.record/1"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_NOT_FOUND = 127  # as a shell: command not found
EXIT_NOT_EXECUTABLE = 126  # as a shell: found but not executable

DESCRIPTION = """\
Run CMD holding GPUs of a shared host. One lock file per GPU (gpu{i}.lock, or slot{i}.lock for CPU slots on a
host without GPUs) in a host-wide directory, taken with flock(2) so util-linux `flock FILE cmd` interoperates.
The N lowest free devices are taken all at once or not at all; a GPU that another process (outside this process
tree) uses per NVML counts as busy. Busy devices are waited for; nobody is ever signalled but CMD's own group.

CMD runs in its own process group with CUDA_VISIBLE_DEVICES set to the granted GPUs (and
CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers GPUs like NVML). For CPU slots CUDA_VISIBLE_DEVICES is set empty
(a slot grants no GPU) and GPU_RUN_SLOTS_GRANTED names the slots. GPU_RUN_KIND and GPU_RUN_DEVICES are always
set. SIGINT/SIGTERM/SIGHUP are forwarded to CMD's group, which gets SIGKILL after --grace seconds; CMD and its
group die with gpu-run, even when gpu-run is killed with SIGKILL.

Exit status: CMD's, or 128+N when signal N ended it (as a shell reports it); 75 when the devices were not
obtained within --timeout; 2 for a usage error; 126/127 when CMD cannot be run; 128+N when signal N
interrupted the wait."""


class _OneLineParser(argparse.ArgumentParser):
    """A usage error is one line (what is wrong, what to do), not argparse's usage block and message."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"gpu-run: {message}; see gpu-run --help\n")


def _parser() -> argparse.ArgumentParser:
    p = _OneLineParser(
        prog="gpu-run",
        usage="gpu-run [--gpus N | --devices 0,3] [--timeout S] [--lock-dir DIR] [--record FILE] [options] -- CMD...",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--gpus", type=int, metavar="N", help="take the N lowest free devices (default 1)")
    which.add_argument("--devices", metavar="LIST", help="take exactly these device indices, e.g. 0,3")
    p.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds with exit 75 (default: wait)")
    p.add_argument(
        "--lock-dir",
        type=Path,
        metavar="DIR",
        help=f"lock directory (default ${ENV_LOCK_DIR}, else /var/lock/gpu-run if writable, else /tmp/gpu-run)",
    )
    p.add_argument("--record", type=Path, metavar="FILE", help="write a JSON record of the grant (for the ledger)")
    p.add_argument(
        "--slots",
        type=int,
        metavar="N",
        help=f"CPU slots on a host without GPUs (default ${ENV_SLOTS}, else the CPU count)",
    )
    p.add_argument(
        "--min-foreign-mib",
        type=float,
        default=DEFAULT_MIN_FOREIGN_MIB,
        metavar="M",
        help="a foreign GPU process using less memory than this does not make the GPU busy (display servers); "
        f"default {DEFAULT_MIN_FOREIGN_MIB:g}",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds between a forwarded signal and SIGKILL of CMD's group (default 10)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command, after --")
    p.epilog = f"Tests without hardware: ${ENV_FAKE_NVML}=FILE presents GPUs described by a JSON file."
    return p


class _StatusLine:
    """While waiting: a live line on a terminal, else one plain stderr line per change."""

    def __init__(self) -> None:
        self.console = Console(stderr=True)
        self.live: Live | None = None
        self.line = ""
        self.t0 = time.monotonic()
        self.shown = False

    def __rich__(self) -> Text:
        return Text(f"gpu-run: {self.line} [{time.monotonic() - self.t0:.0f} s]", style="yellow")

    def __call__(self, line: str) -> None:
        if line == self.line:
            return
        self.line, self.shown = line, True
        if not self.console.is_terminal:
            print(f"gpu-run: {line}", file=sys.stderr, flush=True)
        elif self.live is None:
            self.live = Live(self, console=self.console, transient=True, refresh_per_second=2)
            self.live.start()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


class _Signalled(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Forwarder:
    """While waiting a signal ends the wait; then it is forwarded to CMD's group and starts the grace period."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.waiting = True
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []
        self.kill_at: float | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.waiting:
            raise _Signalled(signum)
        if self.proc is None:
            self.pending.append(signum)  # arrived before CMD started: forwarded once it exists
        else:
            signal_group(self.proc, signum)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace_s


def _utc(dt: datetime) -> str:
    return dt.isoformat(timespec="microseconds").replace("+00:00", "Z")  # one time format everywhere


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write JSON atomically: a temporary file in the same directory, fsync, then rename over `path`."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh, sort_keys=True, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _record(
    kind: str,
    devices: list[int],
    wait_s: float,
    held_s: float,
    status: int,
    started: datetime,
    acquired: datetime | None,
    ended: datetime,
) -> dict[str, Any]:
    return {
        "schema": RECORD_SCHEMA,
        "kind": kind,
        "devices": devices,
        "lock_wait_s": round(wait_s, 6),
        "held_s": round(held_s, 6),
        "gpu_seconds": round(held_s * len(devices), 6),  # device-seconds; for CPU slots, slot-seconds
        "exit_status": status,
        "started": _utc(started),
        "acquired": None if acquired is None else _utc(acquired),
        "ended": _utc(ended),
    }


def _run_child(cmd: list[str], grant: Grant, fwd: _Forwarder) -> int:
    """Run CMD under the grant in its own group; returns gpu-run's exit status for it."""
    try:
        proc = spawn_in_group(cmd, env=grant.env())
    except FileNotFoundError:
        print(f"gpu-run: command not found: {cmd[0]}; check the command after --", file=sys.stderr)
        return EXIT_NOT_FOUND
    except PermissionError:
        print(f"gpu-run: cannot execute {cmd[0]}; check its permissions", file=sys.stderr)
        return EXIT_NOT_EXECUTABLE
    fwd.proc = proc
    for signum in fwd.pending:
        signal_group(proc, signum)
    while True:
        # poll, so the grace deadline of a forwarded signal is honoured
        with contextlib.suppress(subprocess.TimeoutExpired):
            return exit_status(wait_group(proc, timeout=0.5, poll_s=0.1))
        if fwd.kill_at is not None and time.monotonic() >= fwd.kill_at:
            signal_group(proc, signal.SIGKILL)


def run(args: argparse.Namespace, cmd: list[str]) -> int:
    """Wait for the devices, run CMD, write the record; returns the exit status."""
    started = datetime.now(UTC)
    t0 = time.monotonic()
    devices = None
    if args.devices is not None:
        try:
            devices = [int(x) for x in args.devices.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--devices {args.devices!r} is not a comma-separated list of indices") from None
    probe = probe_from_env()
    if args.record is not None and not args.record.parent.is_dir():
        raise UsageError(f"--record {args.record}: directory {args.record.parent} does not exist")

    fwd = _Forwarder(args.grace)
    for sig in FORWARDED:
        signal.signal(sig, fwd)
    status = _StatusLine()
    try:
        grant = acquire(
            gpus=args.gpus,
            devices=devices,
            timeout=args.timeout,
            lock_dir=args.lock_dir,
            status=status,
            slots=args.slots,
            probe=probe,
            min_foreign_mib=args.min_foreign_mib,
            command=shlex.join(cmd),
        )
        fwd.waiting = False  # from here on, signals are forwarded to CMD (queued until it starts)
    except LockTimeoutError as err:
        status.close()
        for line in err.message.splitlines():
            print(f"gpu-run: {line}", file=sys.stderr)
        if args.record is not None:
            kind = "gpu" if probe.count() > 0 else "cpu-slot"
            now = datetime.now(UTC)
            write_record(
                args.record, _record(kind, [], time.monotonic() - t0, 0.0, EXIT_LOCK_TIMEOUT, started, None, now)
            )
        return EXIT_LOCK_TIMEOUT
    except (_Signalled, KeyboardInterrupt) as err:
        status.close()
        signum = err.signum if isinstance(err, _Signalled) else signal.SIGINT
        print(f"gpu-run: interrupted by {signal.Signals(signum).name} while waiting; nothing ran", file=sys.stderr)
        return 128 + signum
    finally:
        status.close()
    with grant:
        if status.shown:
            print(f"gpu-run: got {','.join(grant.labels)} after {grant.wait_s:.1f} s", file=sys.stderr)
        rc = _run_child(cmd, grant, fwd)
    if args.record is not None:
        write_record(
            args.record,
            _record(
                grant.kind,
                grant.devices,
                grant.wait_s,
                grant.held_s(),
                rc,
                started,
                grant.acquired_at,
                datetime.now(UTC),
            ),
        )
    return rc


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point of `gpu-run`; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("gpu-run: no command given; put it after --, e.g. gpu-run --gpus 1 -- python train.py", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.slots is not None:
            resolve_slots(args.slots)
        return run(args, cmd)
    except UsageError as err:
        print(f"gpu-run: {err.message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
