"""How `orch init` classifies a training script's arguments: the recipe keys of the trainers it recognises (with the
probe's observations), the run settings that are no recipe value, and the rule for the script's own numbers.
Anything else is left unclassified and listed (docs/REFERENCE.md, "orch init"); nothing is guessed silently.
"""

from __future__ import annotations

import re
from typing import Any, Final

Observe = dict[str, Any]
_LR: Final[Observe] = {"kind": "optimizer", "field": "lr"}
_B0: Final[Observe] = {"kind": "optimizer", "field": "betas", "index": 0}
_B1: Final[Observe] = {"kind": "optimizer", "field": "betas", "index": 1}
_EPS: Final[Observe] = {"kind": "optimizer", "field": "eps"}
_WD: Final[Observe] = {"kind": "optimizer", "field": "weight_decay"}
_CLIP: Final[Observe] = {"kind": "grad_clip"}
_WARM: Final[Observe] = {"kind": "warmup"}
SCHEDULE_NOTE: Final = "the probe records every step's learning rate; arms must agree step for step"
STEPS_NOTE: Final = "the linear schedule depends on it; the probe stops the trainer after the protocol's steps"

# Hugging Face Trainer (transformers.TrainingArguments and every config derived from it, TRL's included):
# key -> (observe, note), in the order a draft lists them
HF_TRAINER: Final[dict[str, tuple[Observe | None, str]]] = {
    "learning_rate": (_LR, ""),
    "warmup_steps": (_WARM, ""),
    "lr_scheduler_type": (None, SCHEDULE_NOTE),
    "adam_beta1": (_B0, ""),
    "adam_beta2": (_B1, ""),
    "adam_epsilon": (_EPS, ""),
    "weight_decay": (_WD, ""),
    "max_grad_norm": (_CLIP, ""),
}
HF_TRAINER_LATER: Final[dict[str, tuple[Observe | None, str]]] = {
    "per_device_train_batch_size": (None, ""),
    "gradient_accumulation_steps": (None, ""),
    "seed": (None, ""),
    "max_steps": (None, STEPS_NOTE),
}
# fields left unclassified that may still change the bits: why, in the draft's list (the owner decides)
MAY_MATTER: Final[dict[str, str]] = {
    "num_train_epochs": "with max_steps -1 the epochs set the schedule's length, so every step's learning rate",
    "optim": "which optimizer the Trainer builds (a fused and a plain AdamW round differently)",
    "optim_args": "arguments of that optimizer",
    "lr_scheduler_kwargs": "arguments of the learning-rate schedule",
    "label_smoothing_factor": "changes the loss",
    "average_tokens_across_devices": "changes how the loss is normalised across ranks",
    "data_seed": "the sampler's seed (else seed)",
    "full_determinism": "deterministic kernels: other bits, other speed",
    "neftune_noise_alpha": "adds noise to the embeddings",
    "torch_empty_cache_steps": "emptying the allocator's cache: speed, not bits",
    "remove_unused_columns": "which dataset columns reach the model",
    "train_sampling_strategy": "the order of the training samples",
}
# TRL's GRPOConfig, between the optimizer's keys and the batch
TRL_GRPO: Final[dict[str, tuple[Observe | None, str]]] = {
    "beta": (None, "KL weight to the frozen reference model TRL builds when beta > 0"),
    "epsilon": (None, ""),
    "num_generations": (None, ""),
    "max_completion_length": (None, ""),
    "temperature": (None, ""),
}
HF_CLASS: Final = "transformers.training_args.TrainingArguments"
GRPO_CLASS: Final = "trl.trainer.grpo_config.GRPOConfig"
# sen-ye/R3 train/online_rl.py (and r3-mini's copy of its arguments): recognised by these fields together
R3_SIGNATURE: Final = ("group_size", "policy_group_size", "kl_weight_text", "kl_weight_image", "freeze_vit")
R3_FROZEN: Final[Observe] = {"kind": "frozen", "label": "ViT", "patterns": [r"(?i)(^|[.:#_])vit($|[.:#_]|\d)"]}
R3: Final[dict[str, tuple[Observe | None, str]]] = {
    "group_size": (None, ""), "policy_group_size": (None, ""), "rounds": (None, ""), "global_seed": (None, ""),
    "data_seed": (None, ""), "lr": (_LR, ""), "warmup_steps": (_WARM, ""), "beta1": (_B0, ""), "beta2": (_B1, ""),
    "eps": (_EPS, ""), "weight_decay": (_WD, ""), "max_grad_norm": (_CLIP, ""), "kl_weight_text": (None, ""),
    "kl_weight_image": (None, ""), "freeze_vit": (R3_FROZEN, ""), "total_steps": (None, ""),
}
# words that make an argument a run setting (where files go, logging, devices, precision, parallel layout, hubs):
# never a recipe value; a protocol passes the ones it needs in launcher.args
RUN_WORDS: Final = frozenset((
    "dir", "path", "paths", "file", "files", "url", "urls", "port", "host", "log", "logging", "logs", "wandb",
    "tensorboard", "save", "eval", "evaluation", "debug", "exp", "name", "resume", "checkpoint", "device", "cpu",
    "cuda", "gpu", "precision", "bf16", "fp16", "tf32", "workers", "prefetch", "report", "output", "project", "key",
    "client", "runid", "verbose", "tqdm", "print", "hub", "push", "offline", "vis", "results", "mydir", "ddp", "fsdp",
    "deepspeed", "dataloader", "token", "auto", "overwrite", "accelerator", "liger", "compile",
    "vllm", "server", "api", "timeout", "backend", "config", "only", "remote", "every", "freq",
))
RUN_NAMES: Final = frozenset((
    "gradient_checkpointing", "gradient_checkpointing_kwargs", "use_cpu", "do_train", "do_predict", "disable_tqdm",
    "run_name", "local_rank", "label_names", "include_num_input_tokens_seen",
))


def run_setting(name: str) -> bool:
    """Whether an argument's name marks it as a run setting (no recipe value)."""
    return name in RUN_NAMES or bool(RUN_WORDS & set(re.split(r"[_\-]", name.lower())))


def recognised_table(names: set[str], mro: set[str]) -> tuple[str, dict[str, tuple[Observe | None, str]]]:
    """The recipe keys of the trainer recognised from the script's fields and library classes ("" when none)."""
    if GRPO_CLASS in mro:  # the batch between the group's size and the completions' length
        grpo = {**HF_TRAINER, **{k: TRL_GRPO[k] for k in ("beta", "epsilon", "num_generations")}}
        grpo |= {k: HF_TRAINER_LATER[k] for k in ("per_device_train_batch_size", "gradient_accumulation_steps")}
        return "TRL GRPOTrainer", grpo | TRL_GRPO | HF_TRAINER_LATER
    if HF_CLASS in mro:
        return "Hugging Face Trainer", {**HF_TRAINER, **HF_TRAINER_LATER}
    if set(R3_SIGNATURE) <= names:
        return "R3 online_rl.py", dict(R3)
    return "", {}
