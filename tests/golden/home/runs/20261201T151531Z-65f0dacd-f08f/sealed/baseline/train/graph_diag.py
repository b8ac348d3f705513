"""Static graph diagnostic of r3-mini: prints a deterministic description of the model (module tree, parameter
shapes/dtypes) and the aten op sequence of one rollout decode step and one denoise step (the captured work)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from modeling.bagel import SequencePlan
from torch.utils._python_dispatch import TorchDispatchMode

from train.fused_ops import topk_filter_reference
from train.online_rl import DataArguments, ModelArguments, TrainingArguments, build_model
from train.train_utils import parse_args_into_dataclasses, set_determinism


class _OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def describe(model_args: ModelArguments, training_args: TrainingArguments) -> list[str]:
    model = build_model(model_args, training_args, 0).eval()
    lines = ["# module tree"]
    for name, module in model.named_modules():
        lines.append(f"{name or '<root>'}: {type(module).__name__}")
    lines.append("# parameters")
    for name, p in model.named_parameters():
        frozen = "frozen" if name.startswith("vit_model") else "trainable"
        lines.append(f"{name}: {tuple(p.shape)} {p.dtype!s} {frozen}")
    batch, ctx, new = 2, 4, 3
    plan = SequencePlan((("text", ctx),))
    with torch.no_grad():
        prefill = model(mode="prefill", plan=plan, segment_inputs=[torch.zeros(batch, ctx, dtype=torch.long)])
        caches = []
        for k, v in prefill["kvs"]:
            kc = k.new_zeros((*k.shape[:2], ctx + new, k.shape[3]))
            vc = v.new_zeros((*v.shape[:2], ctx + new, v.shape[3]))
            kc[:, :, :ctx].copy_(k)
            vc[:, :, :ctx].copy_(v)
            caches.append((kc, vc))
        temp = torch.tensor(0.9)
        rec = _OpRecorder()
        with rec:
            logits = model(
                mode="decode",
                token_ids=torch.zeros(batch, dtype=torch.long),
                rope_pos=torch.tensor(ctx),
                slot=torch.tensor(ctx),
                slot_range=torch.arange(ctx + new),
                caches=caches,
            )
            torch.softmax(topk_filter_reference(logits, temp, training_args.top_k), dim=-1)
        lines.append(f"# decode step ops ({len(rec.ops)})")
        lines.extend(rec.ops)
        rec = _OpRecorder()
        n_img = model.config.num_image_tokens
        with rec:
            model(
                mode="denoise",
                x_t=torch.zeros(batch, n_img, model.patch_latent_dim),
                t=torch.ones(batch),
                img_group=ctx + new,
                prefix_len=ctx + new,
                caches=caches,
            )
        lines.append(f"# denoise step ops ({len(rec.ops)})")
        lines.extend(rec.ops)
    return lines


def main() -> None:
    set_determinism()
    model_args, _, training_args = parse_args_into_dataclasses((ModelArguments, DataArguments, TrainingArguments))
    sys.stdout.write("\n".join(describe(model_args, training_args)) + "\n")


if __name__ == "__main__":
    main()
