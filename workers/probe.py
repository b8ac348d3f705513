"""The probe's entry point: runs an unmodified trainer inside a torchrun rank with the probe
(workers/rank/probe_steps.py) installed right after the trainer imports torch, and ends the rank cleanly after the
protocol's step count.

Usage: python -m workers.probe --out DIR --steps 16 --digest-steps 0-13 --watch-steps 0-9 --ckpt-dir DIR -- SCRIPT ARGS
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import time
import traceback
from pathlib import Path

from protocol.process import die_with_parent, process_started
from workers.common import RANK_FAILED
from workers.rank.after_import import AfterImport as _AfterImport
from workers.rank.prime_stop import CacheGrowth
from workers.rank.probe_steps import Probe, ProbeStop
from workers.rank.rank_end import arm_watchdog, destroy_process_group, end_children
from workers.trainer_path import enter_trainer_path


def parse_steps(text: str) -> set[int]:
    """'0-13' or '0-9,12' or '' / 'none' -> the set of step numbers."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part or part == "none":
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _die_with_launcher() -> None:
    """torchrun starts each rank in its own session: without this a rank outlives a SIGKILLed launcher."""
    try:
        arm = die_with_parent(signal.SIGKILL, parent=os.getppid())
    except (OSError, AttributeError):  # no prctl: not Linux
        return
    arm()


def pin_cpus() -> str:
    """Pin this rank to its own block of the cores it may use (by LOCAL_RANK), so ranks never share a core."""
    cpus = sorted(os.sched_getaffinity(0))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    block = max(1, len(cpus) // max(1, local_world))
    mine = cpus[(local_rank * block) % len(cpus) :][:block]
    os.sched_setaffinity(0, mine)
    return ",".join(map(str, mine))


def main(argv: list[str] | None = None) -> int:
    entered = time.time()
    argv = list(sys.argv[1:] if argv is None else argv)
    _die_with_launcher()
    if "--" not in argv:
        sys.stderr.write("probe: usage: python -m workers.probe [options] -- SCRIPT ARGS | -m MODULE ARGS\n")
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m workers.probe")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--digest-steps", default="0-13")
    ap.add_argument("--watch-steps", default="0-9")
    ap.add_argument("--ckpt-dir", type=Path, default=None)
    ap.add_argument("--host-controls", default="none", help="comma list: pin_cpus, gc_at_boundaries; or none")
    ap.add_argument("--clock-socket", default=None, help="abstract name of the train worker's step-clock socket")
    ap.add_argument("--until-compiled", action="store_true",
                    help="the prime: stop after the first step from step 1 on that added nothing to the compile cache")
    opts = ap.parse_args(argv[:cut])
    controls = frozenset() if opts.host_controls == "none" else frozenset(opts.host_controls.split(","))
    unknown = controls - {"pin_cpus", "gc_at_boundaries"}
    if unknown:
        sys.stderr.write(f"probe: unknown host controls {sorted(unknown)}\n")
        return 2
    target = argv[cut + 1 :]
    module = None
    if target[:1] == ["-m"]:
        module, target = target[1], target[2:]
    elif not target:
        sys.stderr.write("probe: no trainer given after --\n")
        return 2
    probe = Probe(
        opts.out, opts.steps, parse_steps(opts.digest_steps), parse_steps(opts.watch_steps), opts.ckpt_dir, controls
    )
    probe.startup.update(process=process_started() or entered, probe=entered)  # start-up figures (run.json)
    if opts.until_compiled:
        probe.until_compiled = CacheGrowth.from_env(os.environ)
    if "pin_cpus" in controls:
        probe.applied_controls["cpus"] = pin_cpus()  # before the trainer starts its threads
    if opts.clock_socket is not None:
        probe.open_clock(opts.clock_socket)
    if "torch" in sys.modules:
        probe.install()
    else:
        sys.meta_path.insert(0, _AfterImport("torch", lambda _module: probe.install()))
    for library, hook in (("wandb", probe.numbers.install_wandb),
                          ("transformers.trainer_callback", probe.numbers.install_transformers)):
        if library in sys.modules:
            hook(sys.modules[library])
        else:
            sys.meta_path.insert(0, _AfterImport(library, hook))
    code = 0
    try:
        if module is not None:
            sys.argv = [module, *target]
            enter_trainer_path(os.getcwd())  # as `python -m MODULE` would, now that orch's modules are in
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            script = target[0]
            sys.argv = [script, *target[1:]]
            enter_trainer_path(os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT` would
            runpy.run_path(script, run_name="__main__")
        code = 1
    except ProbeStop:
        code = 0
    except SystemExit as exc:
        code = 1 if exc.code in (0, None) else exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # the trainer failed: report it, still end this rank's children
        failed_at = time.time()
        traceback.print_exc()
        # the cause in one line, named by rank: what the package's failure note shows (workers.train)
        cause = traceback.format_exception_only(exc)[-1].strip().replace("\n", " ")
        sys.stderr.write(RANK_FAILED.format(rank=probe.rank, time=failed_at, cause=cause) + "\n")
        code = 1
    if code != 0 and probe.step < probe.steps:
        sys.stderr.write(f"probe: rank {probe.rank}: the trainer ended after {probe.step} of {probe.steps} steps\n")
        if not probe.steps_file.closed:
            probe.write_summary(complete=False)
    arm_watchdog()
    destroy_process_group()
    end_children()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the trainer's atexit handlers and threads do not get to run after the stop


if __name__ == "__main__":
    sys.exit(main())
