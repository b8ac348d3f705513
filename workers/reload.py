"""The reload package: a fresh process loads the train package's checkpoint and recomputes its final digests.

Usage: python -m workers.reload --spec package.json -> result.json (orch.reload/1); same digest, same device kind.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from protocol.fileio import open_regular
from protocol.hashing import sha256_fd
from protocol.package import PackageSpec
from protocol.results import ReloadRank, ReloadResult
from workers.common import WorkerFailed, run_entry_point
from workers.rank.digest import combined_digest, digest_many


def checkpoint_tensors(doc: dict[str, Any], device: str) -> dict[str, Any]:
    """The digest names of an orch.ckpt/1 document, each tensor on the device kind it was digested on."""
    import torch

    if doc.get("schema") != "orch.ckpt/1":
        raise WorkerFailed(f"checkpoint schema is {doc.get('schema')!r}, expected 'orch.ckpt/1'")
    named: dict[str, Any] = {f"param/{k}": v for k, v in doc["params"].items()}
    for fqn, state in doc["optim"].items():
        named.update({f"optim/{fqn}/{key}": v for key, v in state.items()})
    out = {}
    for name, t in named.items():
        kind = doc["devices"].get(name, "cpu")
        if kind == "cuda":
            if device != "cuda" or not torch.cuda.is_available():
                raise WorkerFailed(f"{name} was digested on CUDA; this reload has no CUDA device")
            t = t.to("cuda")
        out[name] = t
    return out


def reload_rank(path: Path, device: str) -> tuple[ReloadRank, int]:
    import torch

    if device == "cuda":
        torch.cuda.set_device(0)
    # one descriptor of a regular file (a link or FIFO is refused, never followed or waited on): the SHA256 is read from
    # it by offset in a second thread while torch.load reads it (seconds of a large checkpoint), so both are of one file
    with os.fdopen(open_regular(path), "rb") as fh, ThreadPoolExecutor(1) as pool:
        sha = pool.submit(sha256_fd, fh.fileno())
        doc = torch.load(fh, map_location="cpu", weights_only=True)
        digests = digest_many(checkpoint_tensors(doc, device))
        rank = ReloadRank(
            rank=int(doc["rank"]), checkpoint_sha256=sha.result()[0], combined=combined_digest(digests),
            digests=digests,
        )  # fmt: skip
    return rank, int(doc["world_size"])


def run(spec: PackageSpec) -> ReloadResult:
    if spec.ckpt_dir is None:
        raise WorkerFailed("reload spec has no ckpt_dir")
    files = sorted(Path(spec.ckpt_dir).glob("rank*.pt"), key=lambda p: int(p.stem.removeprefix("rank")))
    if len(files) != spec.nproc:
        raise WorkerFailed(f"{len(files)} checkpoint files in {spec.ckpt_dir}, expected {spec.nproc}")
    ranks = []
    for path in files:
        rank, world = reload_rank(path, spec.device)
        if world != spec.nproc:
            raise WorkerFailed(f"{path.name} was written by a world of {world}, expected {spec.nproc}")
        ranks.append(rank)
    if [r.rank for r in ranks] != list(range(spec.nproc)):
        raise WorkerFailed("checkpoint files do not hold ranks 0..N-1")
    return ReloadResult(arm=str(spec.arm_label), world_size=spec.nproc, ranks=ranks)


def main(argv: list[str] | None = None) -> int:
    spec, result = run_entry_point("reload", run, argv)
    print(f"reload {spec.arm_label}: {len(result.ranks)} checkpoints digested, result {spec.result_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
