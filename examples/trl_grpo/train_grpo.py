"""GRPO with Hugging Face TRL on a tiny Qwen2 built from a config (the user's own training script).

    torchrun --nproc_per_node 2 train_grpo.py --output_dir OUT --learning_rate 1e-5 --beta 0.04 ...

Every GRPOConfig field is a flag (HfArgumentParser); the model sizes and prompt count are TaskArguments.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from tiny_task import addition_reward, build_dataset, build_model, build_tokenizer
from transformers import HfArgumentParser, TrainerCallback
from trl import GRPOConfig, GRPOTrainer


@dataclass
class TaskArguments:
    layers: int = 2
    hidden_size: int = 64
    model_seed: int = 1
    num_prompts: int = 512


class LogMetrics(TrainerCallback):
    """The trainer's metrics to Python logging (the console printer only prints), one line per logging step."""

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        logging.getLogger("train_grpo").info("step %d: %s", state.global_step, logs)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    task, args = HfArgumentParser((TaskArguments, GRPOConfig)).parse_args_into_dataclasses()
    tokenizer = build_tokenizer()
    # TRL builds its frozen reference model (beta > 0) from the policy's path: the initial model is saved once
    model_dir = os.path.join(args.output_dir, "initial_model")
    with args.main_process_first(desc="initial model"):
        if not os.path.exists(os.path.join(model_dir, "config.json")):
            build_model(tokenizer, task.layers, task.hidden_size, task.model_seed).save_pretrained(model_dir)
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=addition_reward,
        args=args,
        train_dataset=build_dataset(task.num_prompts, args.data_seed if args.data_seed is not None else args.seed),
        processing_class=tokenizer,
        callbacks=[LogMetrics()],
    )
    trainer.train()


if __name__ == "__main__":
    main()
