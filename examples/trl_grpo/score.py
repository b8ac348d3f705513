"""The DEV scorer of the TRL GRPO example: greedy completions of held-out prompts by the trained policy, scored by
the training reward. Reads an orch.ckpt/1 checkpoint (rank 0's parameters: DDP replicates them on every rank).

    python score.py --ckpt CKPT_DIR --out dev.json [--layers 2 --hidden_size 64 --num_dev_prompts 64]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tiny_task import addition_reward, build_model, build_tokenizer, prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden_size", type=int, default=64)
    ap.add_argument("--num_dev_prompts", type=int, default=64)
    ap.add_argument("--max_completion_length", type=int, default=16)
    opts = ap.parse_args()
    doc = torch.load(opts.ckpt / "rank0.pt", map_location="cpu", weights_only=True)
    if doc.get("schema") != "orch.ckpt/1":
        raise SystemExit(f"score: {opts.ckpt / 'rank0.pt'} is not an orch.ckpt/1 checkpoint")
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, opts.layers, opts.hidden_size, seed=0)
    state = {name.removeprefix("module."): t for name, t in doc["params"].items()}
    model.load_state_dict(state, strict=True)
    model.eval()
    dev = prompts(opts.num_dev_prompts, seed=0, split="dev")
    batch = tokenizer(dev, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=opts.max_completion_length, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    completions = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    rewards = addition_reward(dev, completions)
    exact = sum(r == 1.0 for r in rewards)
    opts.out.write_text(json.dumps({"dev_reward": sum(rewards) / len(rewards), "dev_exact": exact / len(rewards),
                                    "dev_prompts": len(dev)}, sort_keys=True))


if __name__ == "__main__":
    main()
