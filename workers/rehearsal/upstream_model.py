"""Upstream's own code on the tiny inputs: its modules imported from the snapshot, the model built as
online_rl.py builds it, its weights written, and each file checked by upstream's tokenizer and loaders.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

from workers.rehearsal.model_config import TRAINER_FLAGS, VIT_IMAGE_SIZE
from workers.rehearsal.sizes import Failed, Sizes
from workers.rehearsal.tokenizer import tokenizer_ids

POPPED_BY_LOADER = ("latent_pos_embed.pos_embed", "vit_pos_embed.pos_embed")  # FSDPCheckpoint.try_load_ckpt


def import_upstream(upstream: Path) -> types.SimpleNamespace:
    """upstream's modules, imported from DIR. flash_attn (imported at module top, called only in forwards) gets a
    build-only placeholder when none is installed: generating runs no attention."""
    try:
        import transformers
    except ImportError as exc:
        raise Failed(f"transformers is not importable ({exc}); put transformers 4.49 on PYTHONPATH") from exc
    if not transformers.__version__.startswith("4."):
        raise Failed(f"transformers {transformers.__version__} found; upstream R3 needs 4.x (4.49: 5.x fails in its "
                     "Qwen2 rope init): put transformers 4.49 first on PYTHONPATH")  # fmt: skip
    if importlib.util.find_spec("flash_attn") is None:
        placeholder = types.ModuleType("flash_attn")
        placeholder.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)

        def _not_here(*_: Any, **__: Any) -> Any:
            raise RuntimeError("flash_attn placeholder of make_inputs: generating inputs runs no attention")

        placeholder.flash_attn_varlen_func = _not_here  # type: ignore[attr-defined]
        placeholder.flash_attn_with_kvcache = _not_here  # type: ignore[attr-defined]
        sys.modules["flash_attn"] = placeholder
    sys.path.insert(0, str(upstream))
    try:
        from data.data_utils import add_special_tokens
        from modeling.autoencoder import load_ae
        from modeling.bagel import (
            Bagel,
            BagelConfig,
            Qwen2Config,
            Qwen2ForCausalLM,
            SiglipVisionConfig,
            SiglipVisionModel,
        )
        from modeling.qwen2 import Qwen2Tokenizer
    except ImportError as exc:
        raise Failed(f"upstream's modules do not import from {upstream} ({exc}); install what it needs") from exc
    return types.SimpleNamespace(
        add_special_tokens=add_special_tokens, load_ae=load_ae, Bagel=Bagel, BagelConfig=BagelConfig,
        Qwen2Config=Qwen2Config, Qwen2ForCausalLM=Qwen2ForCausalLM, SiglipVisionConfig=SiglipVisionConfig,
        SiglipVisionModel=SiglipVisionModel, Qwen2Tokenizer=Qwen2Tokenizer,
    )  # fmt: skip


def build_model(up: types.SimpleNamespace, model_dir: Path, s: Sizes, seed: int) -> tuple[Any, Any, list[str]]:
    """Bagel and the autoencoder as online_rl.py main() builds them from the written configs (same steps, same
    order), seeded; then llm2vae (zeros in upstream's init) and the MoT generation branch (a copy of the
    understanding branch after init_moe) get their own draws, as a trained checkpoint has."""
    import torch

    checks: list[str] = []
    f = TRAINER_FLAGS
    torch.manual_seed(seed)
    llm_cfg = up.Qwen2Config.from_pretrained(str(model_dir / "llm_config.json"))
    llm_cfg.layer_module = f["layer_module"]
    llm_cfg.qk_norm = f["llm_qk_norm"]
    llm_cfg.tie_word_embeddings = f["tie_word_embeddings"]
    llm_cfg.freeze_und = f["freeze_und"]
    read = (llm_cfg.num_hidden_layers, llm_cfg.hidden_size, llm_cfg.num_attention_heads, llm_cfg.num_key_value_heads,
            llm_cfg.intermediate_size)  # fmt: skip
    if read != (s.layers, s.hidden, s.heads, s.kv_heads, s.intermediate):
        raise Failed(f"upstream's Qwen2Config read {read} from llm_config.json, not the declared shape")
    checks.append("llm_config.json loads through upstream's Qwen2Config with the declared shape")
    language_model = up.Qwen2ForCausalLM(llm_cfg)
    language_model.init_moe()
    vit_cfg = up.SiglipVisionConfig.from_pretrained(str(model_dir / "vit_config.json"))
    if (vit_cfg.num_hidden_layers, vit_cfg.hidden_size, vit_cfg.image_size) != (s.vit_layers, s.vit_hidden,
                                                                               VIT_IMAGE_SIZE):  # fmt: skip
        raise Failed("upstream's SiglipVisionConfig did not read the declared shape from vit_config.json")
    vit_cfg.num_hidden_layers = vit_cfg.num_hidden_layers + 1 + int(f["vit_select_layer"])
    vit_cfg.rope = f["vit_rope"]
    checks.append("vit_config.json loads through upstream's SiglipVisionConfig with the declared shape")
    vit_model = up.SiglipVisionModel(vit_cfg)
    vae_model, vae_cfg = up.load_ae(local_path=None)  # built as load_ae builds it; its weights are written below
    config = up.BagelConfig(
        visual_gen=f["visual_gen"], visual_und=f["visual_und"], llm_config=llm_cfg, vit_config=vit_cfg,
        vae_config=vae_cfg, latent_patch_size=f["latent_patch_size"], max_latent_size=f["max_latent_size"],
        vit_max_num_patch_per_side=f["vit_max_num_patch_per_side"], connector_act=f["connector_act"],
        interpolate_pos=f["interpolate_pos"], timestep_shift=f["timestep_shift"],
    )  # fmt: skip
    model = up.Bagel(language_model, vit_model, config)
    model.vit_model.vision_model.embeddings.convert_conv2d_to_linear(vit_cfg)

    g = torch.Generator().manual_seed(seed + 1)
    std = float(llm_cfg.initializer_range)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("llm2vae.") or ("moe_gen" in name and p.dim() >= 2):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return model, vae_model, checks


def check_tokenizer(up: types.SimpleNamespace, model_dir: Path, length: int, bpe_vocab: int) -> str:
    tokenizer = up.Qwen2Tokenizer.from_pretrained(str(model_dir))
    tokenizer, new_token_ids, num_new = up.add_special_tokens(tokenizer)
    if num_new != 0 or len(tokenizer) != length:
        raise Failed(f"upstream's add_special_tokens added {num_new} tokens (len {len(tokenizer)}, vocab {length}): "
                     "the embeddings would be resized")  # fmt: skip
    if dict(new_token_ids) != tokenizer_ids(bpe_vocab):
        raise Failed(f"upstream's add_special_tokens returned ids {new_token_ids}, expected {tokenizer_ids(bpe_vocab)}")
    text = "<|im_start|>A photo of a red bus<|im_end|><|vision_start|><|vision_end|>"
    ids = tokenizer.encode(text)
    if ids[0] != new_token_ids["bos_token_id"] or tokenizer.decode(ids) != text:
        raise Failed("upstream's Qwen2Tokenizer does not round-trip the special tokens of the generated vocabulary")
    return f"Qwen2Tokenizer loads from the model folder, add_special_tokens adds 0 tokens, len = vocab = {length}"


def check_checkpoint(up: types.SimpleNamespace, ema_path: Path, model: Any) -> str:
    """FSDPCheckpoint.try_load_ckpt's matching (pop the two position tables, load_state_dict strict=False),
    made strict here: every other key of the model is loaded, none is ignored, every value arrives."""
    import torch
    from safetensors.torch import load_file

    sd = load_file(str(ema_path), device="cpu")
    for key in POPPED_BY_LOADER:
        sd.pop(key, None)
    fresh = model.state_dict()
    missing, unexpected = set(fresh) - set(sd), set(sd) - set(fresh)
    if missing != set(POPPED_BY_LOADER) or unexpected:
        raise Failed(f"ema.safetensors keys do not match the model: missing {sorted(missing - set(POPPED_BY_LOADER))}"
                     f", unexpected {sorted(unexpected)}")  # fmt: skip
    result = model.load_state_dict(sd, strict=False)  # shapes are checked even when not strict
    if set(result.missing_keys) != set(POPPED_BY_LOADER) or result.unexpected_keys:
        raise Failed(f"load_state_dict(strict=False) reported {result}")
    after = model.state_dict()
    for key, value in sd.items():
        if not torch.equal(after[key], value.to(after[key].dtype)):
            raise Failed(f"{key} does not arrive in the model unchanged from ema.safetensors")
    return (f"ema.safetensors loads as try_load_ckpt loads it: {len(sd)} keys, only {', '.join(POPPED_BY_LOADER)} "
            "missing (popped by the loader), none unexpected, values unchanged")  # fmt: skip


def write_weights(model: Any, vae_model: Any, model_dir: Path, s: Sizes) -> tuple[int, list[str]]:
    import torch
    from safetensors.torch import save_file

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[s.ema_dtype]
    sd = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(model_dir / "ema.safetensors"))
    ae_sd = {k: v.detach().contiguous() for k, v in vae_model.state_dict().items()} if s.ae == "random" else {}
    save_file(ae_sd, str(model_dir / "ae.safetensors"))
    zero = sorted(k for k, v in sd.items() if v.is_floating_point() and not bool(v.any()))
    return len(sd), zero


def check_ae(up: types.SimpleNamespace, ae_path: Path, vae_model: Any, s: Sizes) -> str:
    import torch

    loaded, _ = up.load_ae(local_path=str(ae_path))
    if s.ae == "empty":
        return "load_ae loads the empty ae.safetensors (strict=False: every rank keeps its own seeded init)"
    ref = vae_model.state_dict()
    got = loaded.state_dict()
    if set(got) != set(ref) or any(not torch.equal(got[k], ref[k]) for k in ref):
        raise Failed("load_ae does not load every autoencoder weight of ae.safetensors unchanged")
    return f"load_ae loads ae.safetensors: all {len(ref)} autoencoder tensors, unchanged"
