"""Helpers of the r3-mini trainer (upstream `train/train_utils.py`): determinism in one place, seeding, argument
parsing in HfArgumentParser style, the log writer, the fusion switches and group-relative advantages."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import typing
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

# ---- determinism and seeds ------------------------------------------------------------------------------------


def set_determinism() -> None:
    """The one place that makes every kernel deterministic (called before any CUDA work)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ---- fusion switches ------------------------------------------------------------------------------------------

FUSION_SWITCHES = ("CUDA_GRAPH", "ROLLOUT_UNSHARD", "VIT_CACHE", "REF_GATHER_ONCE", "TRITON_TOPK")


@dataclass(frozen=True)
class FusionSwitches:
    """R3_FUSE_<NAME> environment switches: "1" (default, the measured configuration) or "0" (baseline)."""

    cuda_graph: bool
    rollout_unshard: bool
    vit_cache: bool
    ref_gather_once: bool
    triton_topk: bool

    @classmethod
    def from_env(cls, environ: typing.Mapping[str, str] | None = None) -> FusionSwitches:
        environ = os.environ if environ is None else environ
        values = {}
        for name in FUSION_SWITCHES:
            raw = environ.get(f"R3_FUSE_{name}", "1")
            if raw not in ("0", "1"):
                raise ValueError(f"R3_FUSE_{name}={raw!r}: use '0' (off) or '1' (on)")
            values[name.lower()] = raw == "1"
        return cls(**values)

    def effective(self, device: str) -> dict[str, bool]:
        """What actually runs: graphs need CUDA and gathered params; the Triton kernel needs CUDA."""
        cuda = device == "cuda"
        return {
            "CUDA_GRAPH": self.cuda_graph and cuda and self.rollout_unshard,
            "ROLLOUT_UNSHARD": self.rollout_unshard,
            "VIT_CACHE": self.vit_cache,
            "REF_GATHER_ONCE": self.ref_gather_once,
            "TRITON_TOPK": self.triton_topk and cuda,
        }


# ---- arguments ------------------------------------------------------------------------------------------------


def str2bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


def parse_args_into_dataclasses(classes: tuple[type, ...], argv: list[str] | None = None) -> tuple:
    """`--field value` for every field of every dataclass; booleans take True/False strings like upstream."""
    parser = argparse.ArgumentParser(allow_abbrev=False)
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            if kind is bool:
                parser.add_argument(f"--{f.name}", type=str2bool, default=f.default)
            elif kind in (int, float, str):
                parser.add_argument(f"--{f.name}", type=kind, default=f.default)
            else:  # Optional[str]
                parser.add_argument(f"--{f.name}", type=str, default=f.default)
    namespace = vars(parser.parse_args(argv))
    return tuple(cls(**{f.name: namespace[f.name] for f in dataclasses.fields(cls)}) for cls in classes)


# ---- logging (log_dir only, never stdout) ---------------------------------------------------------------------


_LOG = logging.getLogger("r3_mini")


class RunLogger:
    """Appends JSON lines under log_dir on rank 0; with no log_dir it keeps nothing. Every rank also hands each
    record to Python logging, as upstream's logger.info does (unconfigured: nothing is printed)."""

    def __init__(self, log_dir: str | None, rank: int) -> None:
        self.dir = log_dir if (log_dir and rank == 0) else None
        if self.dir:
            os.makedirs(self.dir, exist_ok=True)

    def log(self, stream: str, record: dict) -> None:
        _LOG.info("%s %s", stream, record)
        if self.dir:
            with open(os.path.join(self.dir, f"{stream}.jsonl"), "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record, sort_keys=True) + "\n")


# ---- advantages -----------------------------------------------------------------------------------------------


def all_reduce_mean(value: torch.Tensor, group=None) -> torch.Tensor:
    """Mean over the ranks of a group (SUM then divide: gloo has no AVG)."""
    out = value.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out / dist.get_world_size(group)


def compute_advantages_for_multi_round_rollout(
    per_sample_rewards: list[list[float]], current_policy_group, device: torch.device
) -> tuple[list[list[float]], dict[str, float]]:
    """First round only (as the recipe packs one round per step): advantage = reward - policy-group mean."""
    rewards = torch.tensor([r[0] for r in per_sample_rewards], dtype=torch.float32, device=device)
    global_mean = all_reduce_mean(rewards.mean())
    group_mean = all_reduce_mean(rewards.mean(), group=current_policy_group)
    advantages = (rewards - group_mean).cpu().tolist()
    return [[a] for a in advantages], {"mean_reward": float(global_mean.item())}
