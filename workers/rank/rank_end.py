"""How a probed rank ends whatever its trainer does: a watchdog after the stop, this rank's own children ended,
the process group destroyed. The probe and its entry point both use it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

# the trainer's own cleanup after the stop may take this long before the rank exits anyway
STOP_GRACE_S = float(os.environ.get("ORCH_PROBE_STOP_GRACE_S", "20"))


def arm_watchdog() -> None:
    """If the trainer's cleanup (finally blocks, atexit, threads) hangs, the rank still ends."""

    def fire() -> None:
        time.sleep(STOP_GRACE_S)
        sys.stderr.write("probe: trainer cleanup exceeded the grace period; exiting\n")
        sys.stderr.flush()
        end_children()
        os._exit(0)

    threading.Thread(target=fire, name="probe-watchdog", daemon=True).start()


def end_children() -> None:
    """Terminate this rank's own descendants (e.g. a local reward server), nothing else."""
    import psutil

    kids = psutil.Process().children(recursive=True)
    for p in kids:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(kids, timeout=5)
    kill_and_wait(alive, timeout_s=5)


def kill_and_wait(procs: list[Any], timeout_s: float) -> None:
    """SIGKILL each of `procs` (one that ended by itself meanwhile is no error), then wait up to `timeout_s` until
    they are gone: a killed process holds its memory and devices until the kernel has torn it down. `procs` are
    psutil.Process objects (psutil is imported here, not at the top: the probe imports this module in every rank)."""
    import psutil

    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=timeout_s)


def destroy_process_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # a broken group must not keep the rank alive
        sys.stderr.write(f"probe: destroy_process_group failed: {exc}\n")
