"""Synthetic, seeded prompt set of r3-mini (upstream `train/data_utils.py`): GenEval-like attribute prompts with a
TRAIN split for rollouts and a DEV split kept apart for the scorer; the per-policy-group prompt sampler."""

from __future__ import annotations

import numpy as np

# special tokens of the miniature vocabulary
PAD, START_THINK, END, START_EDIT, NO_EDIT, REFLECT = 0, 1, 2, 3, 4, 5
COLOR_BASE, COUNT_BASE, OBJECT_BASE, FILLER_BASE = 8, 16, 24, 40
NUM_COLORS, MAX_COUNT, NUM_OBJECTS = 8, 4, 16


class SyntheticPromptDataset:
    """Every (color, count, object) triple once, shuffled by data_seed; TRAIN first, then DEV (disjoint)."""

    def __init__(self, split: str, data_seed: int, num_train: int, num_dev: int, prompt_len: int, vocab_size: int):
        if prompt_len < 3 or vocab_size <= FILLER_BASE:
            raise ValueError("prompt_len must be >= 3 and vocab_size > 40")
        rng = np.random.default_rng(data_seed)
        combos = [(c, n, o) for c in range(NUM_COLORS) for n in range(1, MAX_COUNT + 1) for o in range(NUM_OBJECTS)]
        order = rng.permutation(len(combos))
        fillers = rng.integers(FILLER_BASE, vocab_size, size=(len(combos), prompt_len - 3))
        if num_train + num_dev > len(combos):
            raise ValueError(f"at most {len(combos)} prompts")
        chosen = order[:num_train] if split == "train" else order[num_train : num_train + num_dev]
        self.items = []
        for i, idx in enumerate(chosen):
            c, n, o = combos[idx]
            ids = [COLOR_BASE + c, COUNT_BASE + n, OBJECT_BASE + o, *(int(f) for f in fillers[idx])]
            self.items.append({"prompt_ids": ids, "metadata": {"color": c, "count": n, "object": o, "index": i}})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


class DistributedKRepeatSampler:
    """One prompt per policy group and step: all members of a group see the same prompt (k=1, batch 1)."""

    def __init__(self, dataset_len: int, policy_group_id: int, seed: int) -> None:
        self.dataset_len = dataset_len
        self.policy_group_id = policy_group_id
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def next_index(self) -> int:
        perm = np.random.default_rng(self.seed + self.epoch).permutation(self.dataset_len)
        return int(perm[self.policy_group_id % self.dataset_len])


def think_format_reward(tokens: list[int]) -> float:
    """1.0 unless the think block is closed before it says anything (END among its first two tokens)."""
    return 0.0 if END in tokens[:2] else 1.0


def loss_mask_until_end(tokens: list[int]) -> list[float]:
    """Tokens up to and including the first END are trained; the ones after it are padding."""
    mask, open_ = [], True
    for tok in tokens:
        mask.append(1.0 if open_ else 0.0)
        if tok == END:
            open_ = False
    return mask
