"""The prime's stop (issue 51): it runs until one step, from step 1 on, adds nothing to the compile cache on any rank.

Each rank lists its compile-cache folders at every step boundary (names and sizes, nothing opened, no link followed);
the ranks agree through one MAX all-reduce of a CPU integer on a gloo group of their own, so that every rank stops
at the same step. No draw of any RNG, no forward pass, nothing on the trainer's streams or its process groups.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def _skipped(name: str) -> bool:
    return name.endswith(".lock") or name.startswith("tmp")  # lock files and a writer's temporaries, as orch counts


def listing(folders: tuple[str, ...]) -> frozenset[tuple[str, int]]:
    """(path, size) of every file under the folders, lock files and temporaries left out; folders are not followed
    through links (os.walk lists a link to a folder among the files' folders but does not enter it)."""
    out: set[tuple[str, int]] = set()
    for root in folders:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                if _skipped(name):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    out.add((path, os.lstat(path).st_size))
                except OSError:  # removed between the listing and the lstat: a writer's temporary
                    continue
    return frozenset(out)


class CacheGrowth:
    """What the prime's compile cache held at the last step boundary, and whether a step added to it."""

    def __init__(self, folders: tuple[str, ...]) -> None:
        self.folders = folders
        self.last = listing(folders)
        self.group: Any = None
        self.steps_grown: list[int] = []  # the steps that added to the cache (probe summary: host_controls)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CacheGrowth:
        return cls(tuple(env[v] for v in CACHE_VARS if env.get(v)))

    def grew(self, step: int) -> bool:
        """Whether step `step` added to the cache on this rank or any other (ranks agree)."""
        now = listing(self.folders)
        grown = now != self.last
        self.last = now
        grown = self._any_rank(grown)
        if grown:
            self.steps_grown.append(step)
        return grown

    def _any_rank(self, grown: bool) -> bool:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return grown
        if self.group is None:  # every rank makes it at the same boundary (the first): a collective of its own
            self.group = dist.new_group(backend="gloo")
        flag = torch.tensor([1 if grown else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())
