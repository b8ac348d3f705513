"""A small SigLIP-style vision encoder of r3-mini (upstream `modeling/bagel/siglip_navit.py`).
It reads 64-value latent patches; in training it is frozen (eval mode, requires_grad=False)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class SiglipVisionConfig:
    patch_dim: int = 64
    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 1
    num_attention_heads: int = 2
    num_patches: int = 16
    layer_norm_eps: float = 1e-6


class SiglipEncoderLayer(nn.Module):
    def __init__(self, config: SiglipVisionConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.layer_norm1 = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.qkv = nn.Linear(d, 3 * d)
        self.out_proj = nn.Linear(d, d)
        self.layer_norm2 = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.fc1 = nn.Linear(d, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.num_heads
        q, k, v = self.qkv(self.layer_norm1(x)).view(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
        probs = torch.softmax(torch.matmul(q, k.transpose(-1, -2)).float() * (d // h) ** -0.5, dim=-1)
        attn = torch.matmul(probs.to(v.dtype), v).transpose(1, 2).reshape(b, n, d)
        x = x + self.out_proj(attn)
        return x + self.fc2(F.gelu(self.fc1(self.layer_norm2(x)), approximate="tanh"))


class SiglipVisionModel(nn.Module):
    def __init__(self, config: SiglipVisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embedding = nn.Linear(config.patch_dim, config.hidden_size)
        self.position_embedding = nn.Embedding(config.num_patches, config.hidden_size)
        self.layers = nn.ModuleList([SiglipEncoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """patches [n, P, patch_dim] -> features [n, P, hidden]."""
        x = self.patch_embedding(patches) + self.position_embedding.weight[: patches.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.post_layernorm(x)
