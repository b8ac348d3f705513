"""The torchrun command line of a train package: the probe around the arm's trainer, on one node or on each node
of a multi-node launch (workers.train runs it locally, workers.node on every node under Slurm).
"""

from __future__ import annotations

import sys

from protocol.package import PackageSpec
from workers.common import WorkerFailed


def torchrun_command(spec: PackageSpec, clock: str | None = None, rendezvous: list[str] | None = None) -> list[str]:
    """torchrun on one node; --standalone lets the c10d rendezvous bind a free local port itself.

    `rendezvous`: the options of one node of a multi-node launch instead (workers.node, under Slurm)."""
    if not spec.script:
        raise WorkerFailed("train spec has no script")
    target = ["-m", spec.script.split(None, 1)[1]] if spec.script.startswith("-m ") else [spec.script]
    # the timed launches (and the prime, so that it compiles what they compile) watch the warm-up only; the watched
    # replay (untimed) the steps from watch_from on: those train-C did not watch (issue 51), or every step
    first = getattr(spec, "watch_from", 0)
    watch = (f"{first}-{spec.steps - 1}" if spec.watch_all and first < spec.steps else "none" if spec.watch_all
             else f"0-{spec.warmup - 1}" if spec.warmup > 0 else "none")
    ckpt = ["--ckpt-dir", spec.ckpt_dir] if spec.ckpt_dir is not None else []
    until = ["--until-compiled"] if getattr(spec, "until_compiled", False) else []
    return [
        sys.executable, "-m", "torch.distributed.run",
        *(rendezvous if rendezvous is not None else ["--standalone", f"--nproc_per_node={spec.nproc}"]),
        "-m", "workers.probe",
        "--out", spec.package_dir,
        "--steps", str(spec.steps),
        "--digest-steps", f"{spec.digest_first}-{spec.digest_last}",
        "--watch-steps", watch,
        *ckpt,
        *until,
        "--host-controls", ",".join(spec.host_controls) or "none",
        *(["--clock-socket", clock] if clock is not None else []),
        "--", *target, *spec.args,
    ]  # fmt: skip
