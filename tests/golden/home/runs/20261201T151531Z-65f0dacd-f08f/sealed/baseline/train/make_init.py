"""Writes the seeded initial state of r3-mini (the shared "loading adapter" input of both arms) as safetensors.
Usage: `python train/make_init.py --out PATH --seed S [size flags]`; the file is generated, never committed."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataclasses import dataclass

from safetensors.torch import save_file

from train.online_rl import DataArguments, ModelArguments, TrainingArguments, build_model
from train.train_utils import parse_args_into_dataclasses


@dataclass
class InitArguments:
    out: str = ""
    seed: int = 0


def main() -> None:
    init_args, model_args, _, training_args = parse_args_into_dataclasses(
        (InitArguments, ModelArguments, DataArguments, TrainingArguments)
    )
    if not init_args.out:
        raise SystemExit("make_init: --out PATH is required")
    model = build_model(model_args, training_args, init_args.seed)
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    os.makedirs(os.path.dirname(os.path.abspath(init_args.out)), exist_ok=True)
    save_file(state, init_args.out, metadata={"format": "pt", "seed": str(init_args.seed)})


if __name__ == "__main__":
    main()
