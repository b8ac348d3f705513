"""The miniature BAGEL model of r3-mini (upstream `modeling/bagel/bagel.py`): MoT language model, frozen ViT with a
trainable connector, vae2llm/llm2vae on 64-value latent patches, timestep and position embeddings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from modeling.bagel.qwen2_navit import Qwen2Config, Qwen2ForCausalLM
from modeling.bagel.siglip_navit import SiglipVisionConfig, SiglipVisionModel

UND_KINDS = ("text", "vit")
GEN_KINDS = ("vae", "noisy")


@dataclass
class BagelConfig:
    llm_config: Qwen2Config = field(default_factory=Qwen2Config)
    vit_config: SiglipVisionConfig = field(default_factory=SiglipVisionConfig)
    latent_patch_dim: int = 64
    max_latent_size: int = 4  # latent grid side; an image is max_latent_size**2 patches of 64 values
    timestep_shift: float = 3.0
    precision: str = "fp32"

    @property
    def num_image_tokens(self) -> int:
        return self.max_latent_size**2


@dataclass(frozen=True)
class SequencePlan:
    """Logical layout of one sample: segments (kind, length) in order; physically [und tokens | gen tokens].

    Each text token is its own attention group; each image block (vit, vae, noisy) is one group, so its tokens
    see each other and share one RoPE position (BAGEL's scheme). Token i attends to j iff group_j <= group_i.
    """

    segments: tuple[tuple[str, int], ...]
    start_group: int = 0

    def _groups(self) -> tuple[list[int], list[int], int]:
        und, gen, g = [], [], self.start_group
        for kind, n in self.segments:
            if kind == "text":
                und.extend(range(g, g + n))
                g += n
            else:
                (und if kind in UND_KINDS else gen).extend([g] * n)
                g += 1
        return und, gen, g

    @property
    def und_len(self) -> int:
        return sum(n for k, n in self.segments if k in UND_KINDS)

    @property
    def gen_len(self) -> int:
        return sum(n for k, n in self.segments if k in GEN_KINDS)

    @property
    def next_group(self) -> int:
        return self._groups()[2]

    def positions(self, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        und, gen, _ = self._groups()
        pu = torch.tensor(und, dtype=torch.long, device=device).expand(batch, len(und))
        pg = torch.tensor(gen, dtype=torch.long, device=device).expand(batch, len(gen))
        return pu, pg

    def mask(self, device: torch.device, past_groups: list[int] | None = None) -> torch.Tensor:
        und, gen, _ = self._groups()
        q = torch.tensor(und + gen, dtype=torch.long, device=device)
        keys = torch.tensor((past_groups or []) + und + gen, dtype=torch.long, device=device)
        return (keys[None, :] <= q[:, None])[None, None]

    def physical_groups(self) -> list[int]:
        und, gen, _ = self._groups()
        return und + gen


def sincos_2d(side: int, dim: int) -> torch.Tensor:
    """Fixed 2-D sin-cos position table [side*side, dim] (upstream PositionEmbedding)."""
    ys, xs = torch.meshgrid(
        torch.arange(side, dtype=torch.float64), torch.arange(side, dtype=torch.float64), indexing="ij"
    )
    quarter = dim // 4
    omega = 1.0 / (10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter))
    parts = []
    for grid in (ys.reshape(-1), xs.reshape(-1)):
        out = grid[:, None] * omega[None]
        parts += [out.sin(), out.cos()]
    return torch.cat(parts, dim=1).float()


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden_size: int, frequency_embedding_size: int = 32) -> None:
        super().__init__()
        self.frequency_embedding_size = frequency_embedding_size
        self.mlp = nn.Sequential(
            nn.Linear(frequency_embedding_size, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )
        half = frequency_embedding_size // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        self.register_buffer("freqs", freqs, persistent=False)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        args = (t.float() * 1000.0)[:, None] * self.freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class MLPconnector(nn.Module):
    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, out_dim)
        self.fc2 = nn.Linear(out_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Bagel(nn.Module):
    """All entry points go through `forward(mode=...)` so FSDP2's root hooks see every call, as in training."""

    def __init__(self, language_model: Qwen2ForCausalLM, vit_model: SiglipVisionModel, config: BagelConfig) -> None:
        super().__init__()
        self.config = config
        self.language_model = language_model
        self.vit_model = vit_model
        d = config.llm_config.hidden_size
        self.hidden_size = d
        self.patch_latent_dim = config.latent_patch_dim
        self.time_embedder = TimestepEmbedder(d)
        self.vae2llm = nn.Linear(config.latent_patch_dim, d)
        self.llm2vae = nn.Linear(d, config.latent_patch_dim)
        self.connector = MLPconnector(config.vit_config.hidden_size, d)
        self.register_buffer("latent_pos_embed", sincos_2d(config.max_latent_size, d), persistent=False)
        self.register_buffer("vit_pos_embed", sincos_2d(config.max_latent_size, d), persistent=False)

    # ---- embeddings -------------------------------------------------------------------------------------------
    def embed_latents(self, latents: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """latents [B, N, 64], t [B] -> gen-stream embeddings [B, N, D]."""
        n = latents.shape[1]
        return self.vae2llm(latents) + self.time_embedder(t)[:, None] + self.latent_pos_embed[:n]

    def embed_vit(self, vit_features: torch.Tensor) -> torch.Tensor:
        return self.connector(vit_features) + self.vit_pos_embed[: vit_features.shape[1]]

    def vit_features_per_image(self, images: torch.Tensor) -> torch.Tensor:
        """Frozen ViT features, one image per call so every caller computes the same bits for the same image."""
        return torch.cat([self.vit_model(images[i : i + 1]) for i in range(images.shape[0])], dim=0)

    def _embed_plan(self, plan: SequencePlan, inputs: dict) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Builds the und and gen streams of a plan from its per-segment inputs (list aligned with segments)."""
        und, gen = [], []
        for (kind, _), x in zip(plan.segments, inputs["segment_inputs"], strict=True):
            if kind == "text":
                und.append(self.language_model.model.embed_tokens(x))
            elif kind == "vit":
                feats = x["features"] if "features" in x else self.vit_features_per_image(x["images"])
                und.append(self.embed_vit(feats))
            else:
                gen.append(self.embed_latents(x["latents"], x["t"]))
        h_und = torch.cat(und, dim=1) if und else None
        h_gen = torch.cat(gen, dim=1) if gen else None
        return h_und, h_gen

    # ---- forward modes ----------------------------------------------------------------------------------------
    def forward(self, mode: str, **kw):
        device_type = "cuda" if self.vae2llm.weight.is_cuda else "cpu"
        with torch.autocast(
            device_type, dtype=torch.bfloat16, enabled=self.config.precision == "bf16", cache_enabled=False
        ):
            return getattr(self, f"forward_{mode}")(**kw)

    def forward_vit(self, images: torch.Tensor) -> torch.Tensor:
        return self.vit_features_per_image(images)

    def forward_train(self, plan: SequencePlan, segment_inputs: list, label_len: int) -> dict:
        """Packed training forward: logits of the positions predicting the last `label_len` text tokens, and the
        velocity prediction of the final (noisy) image block."""
        h_und, h_gen = self._embed_plan(plan, {"segment_inputs": segment_inputs})
        batch = (h_und if h_und is not None else h_gen).shape[0]
        device = (h_und if h_und is not None else h_gen).device
        pos_und, pos_gen = plan.positions(batch, device)
        out_und, out_gen, _ = self.language_model.model(h_und, h_gen, pos_und, pos_gen, plan.mask(device))
        logits = self.language_model.lm_head(out_und[:, -(label_len + 1) : -1]).float()
        n_img = plan.segments[-1][1]
        v_pred = self.llm2vae(out_gen[:, -n_img:]).float()
        return {"logits": logits, "packed_mse_preds": v_pred}

    def forward_prefill(self, plan: SequencePlan, segment_inputs: list) -> dict:
        """Context forward of a rollout: last und token's logits and every layer's (k, v) for the KV cache."""
        h_und, h_gen = self._embed_plan(plan, {"segment_inputs": segment_inputs})
        batch, device = h_und.shape[0], h_und.device
        pos_und, pos_gen = plan.positions(batch, device)
        out_und, _, new_kvs = self.language_model.model(h_und, h_gen, pos_und, pos_gen, plan.mask(device))
        return {"logits": self.language_model.lm_head(out_und[:, -1]).float(), "kvs": new_kvs}

    def forward_decode(self, token_ids, rope_pos, slot, slot_range, caches) -> torch.Tensor:
        """One text token per sample against the static KV cache; all shapes static (CUDA-graph capturable)."""
        batch = token_ids.shape[0]
        h = self.language_model.model.embed_tokens(token_ids)[:, None]
        pos = rope_pos.view(1, 1).expand(batch, 1)
        slot_mask = (slot_range == slot).view(1, 1, -1, 1)
        valid = (slot_range <= slot).view(1, 1, 1, -1)
        out_und, _, _ = self.language_model.model(
            h, None, pos, None, valid, cache_slots=[(kc, vc, slot_mask) for kc, vc in caches]
        )
        return self.language_model.lm_head(out_und[:, 0]).float()

    def forward_denoise(self, x_t, t, img_group: int, prefix_len: int, caches) -> torch.Tensor:
        """Velocity of a latent image block attending to the cached prefix and to itself."""
        batch, n, _ = x_t.shape
        h_gen = self.embed_latents(x_t, t)
        pos = torch.full((batch, n), img_group, dtype=torch.long, device=x_t.device)
        past = [(kc[:, :, :prefix_len], vc[:, :, :prefix_len]) for kc, vc in caches]
        _, out_gen, _ = self.language_model.model(None, h_gen, None, pos, None, past_kvs=past)
        return self.llm2vae(out_gen).float()


def build_bagel(config: BagelConfig) -> Bagel:
    return Bagel(Qwen2ForCausalLM(config.llm_config), SiglipVisionModel(config.vit_config), config)
