"""Independent check of generated rehearsal inputs with upstream R3's own code (run as a subprocess by
tests/unit/test_rehearsal_inputs.py): `python tests/rehearsal_upstream_check.py UPSTREAM INPUTS_DIR` prints one JSON.

The model is built as online_rl.py main() builds it (rank 0 of 1: seed 4396), then upstream's real
FSDPCheckpoint.try_load_ckpt loads the folder with --finetune_from_ema True; every loaded tensor must equal the file.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path


def main(upstream: Path, inputs: Path) -> dict[str, object]:
    if importlib.util.find_spec("flash_attn") is None:  # imported at module top, called only in forwards
        stub = types.ModuleType("flash_attn")
        stub.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
        stub.flash_attn_varlen_func = stub.flash_attn_with_kvcache = None  # type: ignore[attr-defined]
        sys.modules["flash_attn"] = stub
    sys.path.insert(0, str(upstream))
    import torch
    from data.data_utils import add_special_tokens
    from modeling.autoencoder import load_ae
    from modeling.bagel import Bagel, BagelConfig, Qwen2Config, Qwen2ForCausalLM, SiglipVisionConfig, SiglipVisionModel
    from modeling.qwen2 import Qwen2Tokenizer
    from safetensors.torch import load_file
    from train.fsdp_utils import FSDPCheckpoint
    from transformers import set_seed

    doc = json.loads((inputs / "inputs.json").read_text())
    model_dir = inputs / "model"
    set_seed(4396)
    llm_config = Qwen2Config.from_pretrained(str(model_dir / "llm_config.json"))
    llm_config.layer_module = "Qwen2MoTDecoderLayer"
    llm_config.qk_norm = True
    llm_config.tie_word_embeddings = False
    llm_config.freeze_und = False
    language_model = Qwen2ForCausalLM(llm_config)
    language_model.init_moe()
    vit_config = SiglipVisionConfig.from_pretrained(str(model_dir / "vit_config.json"))
    vit_config.num_hidden_layers = vit_config.num_hidden_layers + 1 + -2
    vit_config.rope = False
    vit_model = SiglipVisionModel(vit_config)
    vae_model, vae_config = load_ae(local_path=str(model_dir / "ae.safetensors"))
    config = BagelConfig(visual_gen=True, visual_und=True, llm_config=llm_config, vit_config=vit_config,
                         vae_config=vae_config, latent_patch_size=2, max_latent_size=64, vit_max_num_patch_per_side=70,
                         connector_act="gelu_pytorch_tanh", interpolate_pos=False, timestep_shift=3.0)  # fmt: skip
    model = Bagel(language_model, vit_model, config)
    model.vit_model.vision_model.embeddings.convert_conv2d_to_linear(vit_config)
    tokenizer = Qwen2Tokenizer.from_pretrained(str(model_dir))
    tokenizer, new_token_ids, num_new_tokens = add_special_tokens(tokenizer)

    model, _ = FSDPCheckpoint.try_load_ckpt(str(model_dir), logging.getLogger("check"), model, None,
                                            resume_from_ema=True)  # fmt: skip
    ema = load_file(str(model_dir / "ema.safetensors"))
    state = model.state_dict()
    popped = {"latent_pos_embed.pos_embed", "vit_pos_embed.pos_embed"}
    differ = sorted(k for k in state if k not in popped and not torch.equal(state[k], ema[k].to(state[k].dtype)))
    return {
        "llm": [llm_config.num_hidden_layers, llm_config.hidden_size, llm_config.num_attention_heads,
                llm_config.num_key_value_heads, llm_config.vocab_size],
        "vit_layers_built": len(model.vit_model.vision_model.encoder.layers),
        "num_new_tokens": num_new_tokens, "len_tokenizer": len(tokenizer), "new_token_ids": dict(new_token_ids),
        "bagel_parameters": sum(p.numel() for p in model.parameters()),
        "ae_parameters": sum(p.numel() for p in vae_model.parameters()),
        "ema_keys_not_in_model": sorted(set(ema) - set(state)), "model_keys_not_in_ema": sorted(set(state) - set(ema)),
        "loaded_values_differ": differ, "llm2vae_nonzero": bool(state["llm2vae.weight"].any()),
        "declared": doc["model"],
    }  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
