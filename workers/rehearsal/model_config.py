"""The tiny model's configuration: the trainer flags its state dict depends on (checked against online_rl.py's
own defaults, read without importing it), and the Qwen2 and SigLIP config files at the declared sizes.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from workers.rehearsal.sizes import Failed, Sizes
from workers.rehearsal.tokenizer import SPECIAL_TOKENS

# online_rl.py flags the generated state dict's shapes and loading depend on: scripts/train_rl.sh's values where it
# passes them, else online_rl.py's defaults (checked against the upstream file's dataclasses while generating).
TRAINER_FLAGS: dict[str, int | float | str | bool] = {
    "layer_module": "Qwen2MoTDecoderLayer", "llm_qk_norm": True, "tie_word_embeddings": False,
    "max_latent_size": 64, "latent_patch_size": 2, "vit_patch_size": 14, "vit_max_num_patch_per_side": 70,
    "connector_act": "gelu_pytorch_tanh", "interpolate_pos": False, "vit_select_layer": -2, "vit_rope": False,
    "timestep_shift": 3.0, "visual_gen": True, "visual_und": True, "copy_init_moe": True, "freeze_und": False,
    "resume_model_only": True, "finetune_from_ema": True, "debug": False,
}  # fmt: skip
SET_BY_TRAIN_RL_SH = {"layer_module", "llm_qk_norm", "tie_word_embeddings", "max_latent_size", "freeze_und",
                      "resume_model_only", "finetune_from_ema", "debug"}  # fmt: skip
VIT_IMAGE_SIZE = 980  # SigLIP's position table must cover vit_max_num_patch_per_side (70) x patch 14


def llm_config(s: Sizes, vocab: int, bpe_vocab: int) -> dict[str, Any]:
    """Qwen2.5's config.json keys at tiny size. No pad_token_id, as Qwen2.5's: upstream reads it only as the
    embedding's padding_idx, which would zero that row and its gradient."""
    ids = {t: bpe_vocab + i for i, t in enumerate(SPECIAL_TOKENS)}
    return {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"], "hidden_act": "silu", "hidden_size": s.hidden, "initializer_range": 0.02,
        "intermediate_size": s.intermediate, "max_position_embeddings": 32768, "max_window_layers": s.layers,
        "model_type": "qwen2", "num_attention_heads": s.heads, "num_hidden_layers": s.layers,
        "num_key_value_heads": s.kv_heads, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
        "sliding_window": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "vocab_size": vocab,
    }  # fmt: skip


def vit_config(s: Sizes) -> dict[str, Any]:
    return {
        "architectures": ["SiglipVisionModel"], "attention_dropout": 0.0, "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": s.vit_hidden, "image_size": VIT_IMAGE_SIZE, "intermediate_size": s.vit_intermediate,
        "layer_norm_eps": 1e-06, "model_type": "siglip_vision_model", "num_attention_heads": s.vit_heads,
        "num_channels": 3, "num_hidden_layers": s.vit_layers, "patch_size": TRAINER_FLAGS["vit_patch_size"],
    }  # fmt: skip


# ---------------------------------------------------------------- upstream


def dataclass_defaults(online_rl: Path) -> dict[str, Any]:
    """`field(default=...)` constants of online_rl.py's argument dataclasses, read without importing it."""
    out: dict[str, Any] = {}
    for node in ast.walk(ast.parse(online_rl.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.ClassDef) and node.name.endswith("Arguments")):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            if isinstance(item.value, ast.Call):
                for kw in item.value.keywords:
                    if kw.arg == "default":
                        try:
                            out[item.target.id] = ast.literal_eval(kw.value)
                        except ValueError:
                            pass
    return out


def check_trainer_defaults(upstream: Path) -> str:
    defaults = dataclass_defaults(upstream / "train" / "online_rl.py")
    differ = [f"{k} (upstream {defaults.get(k, 'absent')!r}, assumed {v!r})" for k, v in TRAINER_FLAGS.items()
              if k not in SET_BY_TRAIN_RL_SH and defaults.get(k, object()) != v]  # fmt: skip
    if differ:
        raise Failed(f"online_rl.py defaults differ from what the inputs assume: {', '.join(differ)}; "
                     "update TRAINER_FLAGS in workers/rehearsal/model_config.py")  # fmt: skip
    n = len(TRAINER_FLAGS) - len(SET_BY_TRAIN_RL_SH)
    return f"online_rl.py argument defaults match the assumed flags ({n} not set by scripts/train_rl.sh)"
