"""Tiny, seeded inputs for rehearsing the unmodified upstream R3 trainer (`train/online_rl.py`) end to end.

`python -m workers.rehearsal.make_inputs --upstream DIR --out DIR [size flags]` writes, byte-identical for the
same flags and environment, one model folder and two prompt files, checks them against upstream's own classes and
loader, and prints `orch.rehearsal-inputs/1` (also `OUT/inputs.json`). Needs transformers 4.x (4.49 as upstream).

Layout (every path relative to OUT; what online_rl.py reads, as scripts/train_rl.sh points at BAGEL-7B-MoT):
  model/llm_config.json   --llm_path      Qwen2 config (MoT fields come from the trainer's flags)
  model/vit_config.json   --vit_path      SigLIP vision config (980 px, patch 14: 70 patches per side)
  model/ae.safetensors    --vae_path      FLUX autoencoder weights for load_ae (random; or empty: see --ae)
  model/ema.safetensors   --resume_from model (with --resume_model_only True --finetune_from_ema True)
  model/vocab.json, merges.txt, tokenizer_config.json   Qwen2Tokenizer (os.path.dirname(llm_path))
  data/train.jsonl, data/val.jsonl   geneval_plus prompts (lines of upstream's data/rl_test/test_geneval++.jsonl)
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.machinery
import importlib.util
import json
import sys
import types
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from protocol.hashing import sha256_file
from protocol.rehearsal_inputs import DataInfo, DeclaredModel, InputFile, RehearsalInputs, TokenizerInfo

REPO = Path(__file__).resolve().parents[2]
PROMPT_SOURCE = "data/rl_test/test_geneval++.jsonl"  # the snapshot lacks data/rl_train/train_geneval++.jsonl
UPSTREAM_REQUIRED = ("train/online_rl.py", "train/fsdp_utils.py", "modeling/bagel/__init__.py",
                     "modeling/autoencoder.py", "data/data_utils.py", PROMPT_SOURCE)  # fmt: skip

# Qwen2's special tokens, in Qwen2.5's id order; upstream's add_special_tokens finds the four it needs among them.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")  # fmt: skip
# Qwen2's pre-tokenizer split (the same regex as upstream's Qwen2Tokenizer), so merges fit its pre-tokens.
QWEN2_PRETOKENIZE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                     r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")  # fmt: skip

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
POPPED_BY_LOADER = ("latent_pos_embed.pos_embed", "vit_pos_embed.pos_embed")  # FSDPCheckpoint.try_load_ckpt


class Refused(Exception):
    """Bad flags or folders: one line, exit 2, nothing written."""


class Failed(Exception):
    """The inputs do not fit upstream (or upstream cannot be imported): one line, exit 1."""


@dataclass(frozen=True)
class Sizes:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vit_layers: int = 3
    vit_hidden: int = 64
    vit_heads: int = 4
    vit_intermediate: int = 128
    bpe_vocab: int = 512
    train_prompts: int = 48
    val_prompts: int = 1
    ema_dtype: str = "bf16"
    ae: str = "random"

    def check(self) -> None:
        if self.hidden % self.heads or (self.hidden // self.heads) % 8:
            raise Refused(f"--hidden {self.hidden} / --heads {self.heads} must give a head dim that is a multiple of 8")
        if self.heads % self.kv_heads:
            raise Refused(f"--heads {self.heads} must be a multiple of --kv-heads {self.kv_heads} (GQA)")
        if self.vit_hidden % self.vit_heads or (self.vit_hidden // self.vit_heads) % 8:
            raise Refused(f"--vit-hidden {self.vit_hidden} / --vit-heads {self.vit_heads} must give a head dim "
                          "that is a multiple of 8")  # fmt: skip
        if self.vit_layers < 2:
            raise Refused(f"--vit-layers {self.vit_layers}: upstream builds vit_layers - 1 layers; give at least 2")
        if min(self.layers, self.intermediate, self.vit_intermediate, self.train_prompts, self.val_prompts) < 1:
            raise Refused("--layers, --intermediate, --vit-intermediate, --train-prompts, --val-prompts must be >= 1")
        if self.bpe_vocab < 256:
            raise Refused(f"--bpe-vocab {self.bpe_vocab}: a byte-level BPE needs at least the 256 byte symbols")


def write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- data


def select_prompts(source: Path, n_train: int, n_val: int) -> tuple[list[bytes], list[bytes]]:
    """val = the first n_val lines, train = the next n_train (disjoint), raw bytes as upstream wrote them."""
    lines = [ln.rstrip(b"\r\n") + b"\n" for ln in source.read_bytes().splitlines() if ln.strip()]
    if len(lines) < n_val + n_train:
        raise Refused(f"{source.name} has {len(lines)} prompts, fewer than --val-prompts + --train-prompts "
                      f"({n_val + n_train}); ask for fewer")  # fmt: skip
    for i, line in enumerate(lines[: n_val + n_train]):
        doc = json.loads(line)
        if not isinstance(doc, dict) or not isinstance(doc.get("prompt"), str):
            raise Failed(f"{source.name} line {i + 1} has no 'prompt' string: not what GenevalPromptDataset reads")
    return lines[n_val : n_val + n_train], lines[:n_val]


# ---------------------------------------------------------------- tokenizer


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


# ---------------------------------------------------------------- configs


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
                     "update TRAINER_FLAGS in workers/rehearsal/make_inputs.py")  # fmt: skip
    n = len(TRAINER_FLAGS) - len(SET_BY_TRAIN_RL_SH)
    return f"online_rl.py argument defaults match the assumed flags ({n} not set by scripts/train_rl.sh)"


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


# ---------------------------------------------------------------- document


def file_entries(out: Path) -> list[InputFile]:
    return [InputFile(path=p.relative_to(out).as_posix(), bytes=p.stat().st_size, sha256=sha256_file(p))
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != "inputs.json"]  # fmt: skip


def trainer_args() -> list[str]:
    return ["--llm_path", "model/llm_config.json", "--vit_path", "model/vit_config.json",
            "--vae_path", "model/ae.safetensors", "--resume_from", "model",
            "--train_data_path", "data/train.jsonl", "--val_data_path", "data/val.jsonl"]  # fmt: skip


def prepare_out(out: Path) -> None:
    resolved = out.resolve()
    if resolved == REPO or REPO in resolved.parents:
        raise Refused(f"--out {out} is inside the orch repository; generate in scratch (e.g. under $ORCH_HOME)")
    if resolved.exists() and (not resolved.is_dir() or any(resolved.iterdir())):
        raise Refused(f"--out {out} exists and is not an empty folder; choose a new folder or remove it")


def check_upstream_dir(upstream: Path) -> None:
    lacking = [rel for rel in UPSTREAM_REQUIRED if not (upstream / rel).is_file()]
    if lacking:
        raise Refused(f"--upstream {upstream} is not an R3 source tree (lacks {', '.join(lacking)}); "
                      "point it at the upstream snapshot")  # fmt: skip


def generate(upstream: Path, out: Path, s: Sizes, seed: int) -> RehearsalInputs:
    s.check()
    prepare_out(out)
    check_upstream_dir(upstream)
    checks = [check_trainer_defaults(upstream)]
    up = import_upstream(upstream)
    model_dir, data_dir = out / "model", out / "data"
    model_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)

    source = upstream / PROMPT_SOURCE
    train, val = select_prompts(source, s.train_prompts, s.val_prompts)
    (data_dir / "train.jsonl").write_bytes(b"".join(train))
    (data_dir / "val.jsonl").write_bytes(b"".join(val))

    corpus = [json.loads(line)["prompt"] for line in val + train]
    bpe_vocab, length = write_tokenizer(model_dir, corpus, s.bpe_vocab)
    write_json(model_dir / "llm_config.json", llm_config(s, length, bpe_vocab))
    write_json(model_dir / "vit_config.json", vit_config(s))
    checks.append(check_tokenizer(up, model_dir, length, bpe_vocab))

    model, vae_model, build_checks = build_model(up, model_dir, s, seed)
    checks += build_checks
    n_tensors, zero = write_weights(model, vae_model, model_dir, s)
    checks.append(check_checkpoint(up, model_dir / "ema.safetensors", model))
    checks.append(check_ae(up, model_dir / "ae.safetensors", vae_model, s))

    declared = DeclaredModel(
        layers=s.layers, hidden=s.hidden, heads=s.heads, kv_heads=s.kv_heads, intermediate=s.intermediate,
        vocab=length, vit_layers=s.vit_layers, vit_layers_built=len(model.vit_model.vision_model.encoder.layers),
        vit_hidden=s.vit_hidden, vit_heads=s.vit_heads, vit_intermediate=s.vit_intermediate,
        layer_module=str(TRAINER_FLAGS["layer_module"]), bagel_parameters=sum(p.numel() for p in model.parameters()),
        ae_parameters=sum(p.numel() for p in vae_model.parameters()), ema_dtype=s.ema_dtype, ema_tensors=n_tensors,
        all_zero_tensors=zero,
    )  # fmt: skip
    doc = RehearsalInputs(
        seed=seed, sizes=asdict(s), model=declared,
        tokenizer=TokenizerInfo(bpe_vocab=bpe_vocab, special_tokens=list(SPECIAL_TOKENS), length=length,
                                ids=tokenizer_ids(bpe_vocab)),
        data=DataInfo(source=PROMPT_SOURCE, source_sha256=sha256_file(source), train_lines=len(train),
                      val_lines=len(val)),
        assumed_trainer_flags=TRAINER_FLAGS, trainer_args=trainer_args(), files=file_entries(out),
        upstream_checks=checks,
    )  # fmt: skip
    return doc


def document_text(doc: RehearsalInputs) -> str:
    return json.dumps(doc.model_dump(mode="json", by_alias=True), indent=1, sort_keys=True) + "\n"


def parse_args(argv: list[str] | None) -> tuple[Path, Path, Sizes, int]:
    d = Sizes()
    ap = argparse.ArgumentParser(
        prog="python -m workers.rehearsal.make_inputs",
        description="Generate tiny seeded inputs (model folder, prompts) for the unmodified upstream R3 trainer.",
        epilog="example: PYTHONPATH=/path/to/transformers-4.49 python -m workers.rehearsal.make_inputs "
        "--upstream ./R3 --out $ORCH_HOME/scratch/inputs",
    )
    ap.add_argument("--upstream", type=Path, required=True, help="the upstream R3 source tree (read only)")
    ap.add_argument("--out", type=Path, required=True, help="a new or empty folder outside the repository")
    ap.add_argument("--seed", type=int, default=0, help="seed of every random weight (default 0)")
    for name, help_ in (("layers", "LLM decoder layers"), ("hidden", "LLM hidden size"), ("heads", "attention heads"),
                        ("kv-heads", "key/value heads"), ("intermediate", "LLM MLP size"),
                        ("vit-layers", "SigLIP layers in vit_config.json (upstream builds one less)"),
                        ("vit-hidden", "SigLIP hidden size"), ("vit-heads", "SigLIP heads"),
                        ("vit-intermediate", "SigLIP MLP size"),
                        ("bpe-vocab", "byte-level BPE entries (256 bytes + merges) before the special tokens"),
                        ("train-prompts", "lines of data/train.jsonl"),
                        ("val-prompts", "lines of data/val.jsonl (step-0 evaluation runs over all)")):  # fmt: skip
        attr = name.replace("-", "_")
        ap.add_argument(f"--{name}", type=int, default=getattr(d, attr), help=f"{help_} (default {getattr(d, attr)})")
    ap.add_argument("--ema-dtype", choices=("bf16", "fp32"), default=d.ema_dtype,
                    help="dtype of ema.safetensors (default bf16, as BAGEL's checkpoint)")  # fmt: skip
    ap.add_argument("--ae", choices=("random", "empty"), default=d.ae,
                    help="ae.safetensors: seeded random FLUX weights (default: the same autoencoder on every rank) or "
                    "empty (load_ae keeps each rank's own seeded init, which differs across ranks)")  # fmt: skip
    o = ap.parse_args(argv)
    sizes = Sizes(layers=o.layers, hidden=o.hidden, heads=o.heads, kv_heads=o.kv_heads, intermediate=o.intermediate,
                  vit_layers=o.vit_layers, vit_hidden=o.vit_hidden, vit_heads=o.vit_heads,
                  vit_intermediate=o.vit_intermediate, bpe_vocab=o.bpe_vocab, train_prompts=o.train_prompts,
                  val_prompts=o.val_prompts, ema_dtype=o.ema_dtype, ae=o.ae)  # fmt: skip
    return o.upstream, o.out, sizes, o.seed


def main(argv: list[str] | None = None) -> int:
    upstream, out, sizes, seed = parse_args(argv)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout holds the one document; upstream's prints go to stderr
            doc = generate(upstream, out, sizes, seed)
    except Refused as exc:
        sys.stderr.write(f"make_inputs: {exc}\n")
        return 2
    except Failed as exc:
        sys.stderr.write(f"make_inputs: {exc}\n")
        return 1
    text = document_text(doc)
    (out / "inputs.json").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
