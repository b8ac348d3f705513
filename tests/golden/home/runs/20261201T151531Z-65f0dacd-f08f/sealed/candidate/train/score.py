"""DEV scorer of r3-mini: reassembles the full model from an "orch.ckpt/1" checkpoint in one process and writes
the mean reward on the DEV split (greedy text, ODE denoising from fixed noise: no sampling noise) to --out."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import glob
import json
from dataclasses import dataclass

import torch
from safetensors.torch import load_file

from train.data_utils import SyntheticPromptDataset
from train.online_rl import (
    DataArguments,
    ModelArguments,
    TrainingArguments,
    build_model,
    evaluate_dev_indices,
)
from train.reward_func import RewardClient
from train.rollout_controller import MultiRoundRolloutController
from train.train_utils import parse_args_into_dataclasses, set_determinism

CKPT_SCHEMA = "orch.ckpt/1"


@dataclass
class ScoreArguments:
    ckpt: str = ""
    out: str = ""


def load_full_params(ckpt_dir: str) -> dict[str, torch.Tensor]:
    """Full tensors from per-rank shards: Shard(0) pieces concatenated in rank order along dim 0."""
    files = sorted(glob.glob(os.path.join(ckpt_dir, "rank*.pt")), key=lambda p: int(os.path.basename(p)[4:-3]))
    if not files:
        raise FileNotFoundError(f"no rank*.pt under {ckpt_dir}")
    shards = [torch.load(f, map_location="cpu", weights_only=True) for f in files]
    world = shards[0]["world_size"]
    if len(shards) != world or any(s["schema"] != CKPT_SCHEMA for s in shards):
        raise ValueError(f"{ckpt_dir}: expected {world} rank files of schema {CKPT_SCHEMA}")
    shards.sort(key=lambda s: s["rank"])
    full = {}
    for fqn, meta in shards[0]["param_meta"].items():
        if meta["placement"] == "shard0":
            tensor = torch.cat([s["params"][fqn] for s in shards], dim=0)
        else:
            tensor = shards[0]["params"][fqn]
        if list(tensor.shape) != list(meta["global_shape"]):
            raise ValueError(f"{fqn}: reassembled {list(tensor.shape)} != global shape {meta['global_shape']}")
        full[fqn] = tensor
    return full


def main() -> None:
    set_determinism()
    score_args, model_args, data_args, training_args = parse_args_into_dataclasses(
        (ScoreArguments, ModelArguments, DataArguments, TrainingArguments)
    )
    if not score_args.ckpt or not score_args.out:
        raise SystemExit("score: --ckpt DIR and --out FILE.json are required")
    device = torch.device("cuda" if training_args.device == "cuda" else "cpu")
    model = build_model(model_args, training_args, training_args.global_seed)
    if training_args.resume_from:  # frozen weights a checkpoint may leave out come from the initial state
        model.load_state_dict(load_file(training_args.resume_from), strict=False)
    params = load_full_params(score_args.ckpt)
    own = dict(model.named_parameters())
    unknown = sorted(set(params) - set(own))
    missing = sorted(n for n, p in own.items() if p.requires_grad and n not in params and "vit_model" not in n)
    if unknown or missing:
        raise ValueError(f"checkpoint does not fit the model: unknown {unknown[:3]}, missing {missing[:3]}")
    with torch.no_grad():
        for name, tensor in params.items():
            own[name].copy_(tensor)
    model.to(device).eval()
    switches = {
        "CUDA_GRAPH": False,
        "ROLLOUT_UNSHARD": False,
        "VIT_CACHE": False,
        "REF_GATHER_ONCE": False,
        "TRITON_TOPK": False,
    }
    controller = MultiRoundRolloutController(model, training_args, switches, device)
    dev = SyntheticPromptDataset(
        "dev",
        data_args.data_seed,
        data_args.num_train_prompts,
        data_args.num_dev_prompts,
        data_args.prompt_len,
        model_args.vocab_size,
    )
    client = RewardClient(training_args.reward_mode, training_args.reward_batch, data_args.data_seed)
    try:
        rewards = evaluate_dev_indices(controller, dev, list(range(len(dev))), training_args, data_args, client, device)
    finally:
        client.close()
    result = {
        "schema": "r3mini.dev_score/1",
        "dev_mean_reward": sum(rewards) / len(rewards),
        "num_dev_prompts": len(rewards),
    }
    os.makedirs(os.path.dirname(os.path.abspath(score_args.out)), exist_ok=True)
    with open(score_args.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, sort_keys=True)


if __name__ == "__main__":
    main()
