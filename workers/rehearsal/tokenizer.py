"""The tiny tokenizer of a rehearsal: a byte-level BPE with Qwen2's pre-tokenizer and special tokens, written as
the vocab.json, merges.txt and tokenizer_config.json that upstream's Qwen2Tokenizer reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workers.rehearsal.sizes import Failed, write_json

# Qwen2's special tokens, in Qwen2.5's id order; upstream's add_special_tokens finds the four it needs among them.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")  # fmt: skip
# Qwen2's pre-tokenizer split (the same regex as upstream's Qwen2Tokenizer), so merges fit its pre-tokens.
QWEN2_PRETOKENIZE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                     r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")  # fmt: skip


def train_bpe(corpus: list[str], vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE (all 256 byte symbols, then merges learned from the corpus) with Qwen2's pre-tokenizer."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )  # fmt: skip
    tok.train_from_iterator(corpus, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = dict(sorted(model["vocab"].items(), key=lambda kv: kv[1]))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise Failed("the trained BPE vocabulary has gaps in its ids")
    return vocab, [(a, b) for a, b in merges]


def tokenizer_config(first_special_id: int) -> dict[str, Any]:
    """Qwen2.5's tokenizer_config.json shape: the special tokens are added tokens after the BPE vocabulary."""
    added = {
        str(first_special_id + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                    "single_word": False, "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }  # fmt: skip
    return {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t != "<|endoftext|>"],
        "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 32768, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }  # fmt: skip


def write_tokenizer(model_dir: Path, corpus: list[str], vocab_size: int) -> tuple[int, int]:
    """vocab.json, merges.txt, tokenizer_config.json; returns (BPE entries, len(tokenizer))."""
    vocab, merges = train_bpe(corpus, vocab_size)
    (model_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False) + "\n", encoding="utf-8")
    (model_dir / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
                                          encoding="utf-8")  # fmt: skip
    write_json(model_dir / "tokenizer_config.json", tokenizer_config(len(vocab)))
    return len(vocab), len(vocab) + len(SPECIAL_TOKENS)


def tokenizer_ids(bpe_vocab: int) -> dict[str, int]:
    """The ids upstream's add_special_tokens will return for this vocabulary."""
    at = {t: bpe_vocab + i for i, t in enumerate(SPECIAL_TOKENS)}
    return {"bos_token_id": at["<|im_start|>"], "eos_token_id": at["<|im_end|>"],
            "start_of_image": at["<|vision_start|>"], "end_of_image": at["<|vision_end|>"]}  # fmt: skip
