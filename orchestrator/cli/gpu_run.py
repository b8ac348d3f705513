"""gpu-run: run one command holding N GPUs (or CPU slots) of a shared host; never stops anyone else's job.

Parses arguments, waits for the lock (orchestrator.lock.gpu_lock), runs CMD in its own process group, records.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from orchestrator.cli.common import CONTEXT, OrchCommand, examples
from orchestrator.cli.entry import run_app
from orchestrator.isolation.process_group import exit_status, signal_group, spawn_in_group, wait_group
from orchestrator.lock.gpu_devices import ENV_FAKE_NVML, probe_from_env
from orchestrator.lock.gpu_lock import (
    DEFAULT_MIN_FOREIGN_MIB,
    ENV_LOCK_DIR,
    ENV_SLOTS,
    Grant,
    acquire,
    resolve_slots,
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
obtained within --timeout; 2 for a usage error; 126/127 when CMD cannot be run (said at once, before any
wait); 128+N when signal N interrupted the wait."""


@dataclass(frozen=True)
class Args:
    """gpu-run's parsed options (the command line contract of DESIGN.md section 4)."""

    gpus: int | None = None
    devices: str | None = None
    timeout: float | None = None
    lock_dir: Path | None = None
    record: Path | None = None
    slots: int | None = None
    min_foreign_mib: float = DEFAULT_MIN_FOREIGN_MIB
    grace: float = 10.0


def runnable(cmd: list[str]) -> tuple[int, str] | None:
    """None when CMD can be started; else gpu-run's exit status for it (127 not found, 126 not executable) and
    the line that says so. Checked before waiting for any device."""
    exe = cmd[0]
    if "/" not in exe:
        if shutil.which(exe) is None:
            return EXIT_NOT_FOUND, f"command not found: {exe}; check the command after --"
        return None
    path = Path(exe)
    if not path.exists():
        return EXIT_NOT_FOUND, f"command not found: {exe}; check the command after --"
    if path.is_dir() or not os.access(path, os.X_OK):
        return EXIT_NOT_EXECUTABLE, f"cannot execute {exe}; check its permissions"
    return None


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


def run(args: Args, cmd: list[str]) -> int:
    """Wait for the devices, run CMD, write the record; returns the exit status."""
    refused = runnable(cmd)
    if refused is not None:
        print(f"gpu-run: {refused[1]}", file=sys.stderr)
        return refused[0]
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


app = typer.Typer(add_completion=True, pretty_exceptions_enable=False)


class _GpuRunCommand(OrchCommand):
    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return ["[--gpus N | --devices 0,3] [--timeout S] [--record FILE] [OPTIONS] -- CMD..."]


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"gpu-run (orch {version('orch')})")
        raise typer.Exit(0)


@app.command(
    help="\n\n".join(" ".join(part.split()) for part in DESCRIPTION.split("\n\n")),
    epilog=examples(
        "gpu-run --gpus 8 -- torchrun --nproc-per-node 8 train.py",
        "gpu-run --devices 0,3 --timeout 600 -- python bench.py",
        "gpu-run --gpus 2 --record run.json -- ./job.sh",
    ).replace("$ orch ", "$ ")
    + f"\n\nTests without hardware: ${ENV_FAKE_NVML}=FILE presents GPUs described by a JSON file.",
    cls=_GpuRunCommand,
    context_settings={**CONTEXT, "allow_interspersed_args": False},
)
def gpu_run(
    cmd: Annotated[list[str] | None, typer.Argument(metavar="CMD", help="the command, after --",
                                                    show_default=False)] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", metavar="N", help="take the N lowest free devices (default 1)",
                                             show_default=False)] = None,
    devices: Annotated[str | None, typer.Option("--devices", metavar="LIST",
                                                help="take exactly these device indices, e.g. 0,3")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", metavar="S",
                                                  help="give up after S seconds with exit 75 (default: wait)")] = None,
    lock_dir: Annotated[Path | None, typer.Option(
        "--lock-dir", metavar="DIR",
        help=f"lock directory (default ${ENV_LOCK_DIR}, else /var/lock/gpu-run if writable, else /tmp/gpu-run)",
    )] = None,
    record: Annotated[Path | None, typer.Option("--record", metavar="FILE",
                                                help="write a JSON record of the grant (for the ledger)")] = None,
    slots: Annotated[int | None, typer.Option(
        "--slots", metavar="N", help=f"CPU slots on a host without GPUs (default ${ENV_SLOTS}, else the CPU count)",
    )] = None,
    min_foreign_mib: Annotated[float, typer.Option(
        "--min-foreign-mib", metavar="M",
        help="a foreign GPU process using less memory than this does not make the GPU busy (display servers)",
    )] = DEFAULT_MIN_FOREIGN_MIB,
    grace: Annotated[float, typer.Option("--grace", metavar="S",
                                         help="seconds between a forwarded signal and SIGKILL of CMD's group")] = 10.0,
    version: Annotated[bool, typer.Option("--version", help="print the version and exit", callback=_show_version,
                                          is_eager=True)] = False,
) -> None:
    command = list(cmd or [])
    if command and command[0] == "--":
        command = command[1:]
    if gpus is not None and devices is not None:
        print("gpu-run: give either --gpus N or --devices LIST, not both", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE)
    if not command:
        print("gpu-run: no command given; put it after --, e.g. gpu-run --gpus 1 -- python job.py", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE)
    args = Args(gpus, devices, timeout, lock_dir, record, slots, min_foreign_mib, grace)
    try:
        if args.slots is not None:
            resolve_slots(args.slots)
        rc = run(args, command)
    except UsageError as err:
        print(f"gpu-run: {err.message}", file=sys.stderr)
        rc = EXIT_USAGE
    raise typer.Exit(rc)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point of `gpu-run`; returns the exit status."""
    if argv is not None:
        sys.argv = ["gpu-run", *argv]
    try:
        run_app(app, "gpu-run")  # usage errors in one line (orchestrator.cli.entry)
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_USAGE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
