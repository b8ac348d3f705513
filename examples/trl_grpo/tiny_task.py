"""The tiny task of the TRL GRPO example: a few-layer Qwen2 built from a config, a character tokenizer built with
`tokenizers`, in-memory prompts ("a+b=") and a deterministic reward; nothing is downloaded.
"""

from __future__ import annotations

import random
import re

import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL = ["<pad>", "<eos>", "<unk>"]
CHARS = list("0123456789+= abcdefgh")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (WordLevel over a fixed vocabulary), padded on the left for generation."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )


def build_model(tokenizer: PreTrainedTokenizerFast, layers: int, hidden: int, seed: int) -> Qwen2ForCausalLM:
    """A seeded few-layer Qwen2 (GQA, RoPE, RMSNorm, SwiGLU) in fp32, built from its config."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def prompts(n: int, seed: int, split: str = "train") -> list[str]:
    """`n` addition prompts "a+b=" in a seeded order; TRAIN and DEV are disjoint (by the parity of a+b+a*b)."""
    pairs = [(a, b) for a in range(50) for b in range(50) if ((a + b + a * b) % 2 == 0) == (split == "train")]
    random.Random(seed).shuffle(pairs)
    return [f"{a}+{b}=" for a, b in pairs[:n]]


def build_dataset(n: int, seed: int) -> Dataset:
    return Dataset.from_dict({"prompt": prompts(n, seed)})


def addition_reward(prompts: list[str], completions: list[str], **kwargs: object) -> list[float]:
    """1 for the right sum at the start of the completion, else the share of its characters that are digits."""
    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        a, b = (int(x) for x in re.findall(r"\d+", prompt)[:2])
        if completion.strip().startswith(str(a + b)):
            out.append(1.0)
        else:
            out.append(sum(c.isdigit() for c in completion) / max(1, len(completion)) * 0.5)
    return out
