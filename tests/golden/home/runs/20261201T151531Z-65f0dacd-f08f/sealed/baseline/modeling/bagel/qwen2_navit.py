"""Qwen2-style Mixture-of-Transformer-Experts decoder of r3-mini (upstream `modeling/bagel/qwen2_navit.py`).
Understanding (und) and generation (gen) experts per layer, routed by token type; attention shared over the sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Qwen2Config:
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    qk_norm: bool = True
    layer_module: str = "Qwen2MoTDecoderLayer"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class Qwen2RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class Qwen2MLP(nn.Module):
    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen2RotaryEmbedding(nn.Module):
    """RoPE computed from position ids on the fly (elementwise only, so it can sit inside a CUDA graph)."""

    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # position_ids [B, L] -> cos/sin [B, 1, L, head_dim]
        freqs = position_ids.float()[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return (x * cos.to(x.dtype)) + (_rotate_half(x) * sin.to(x.dtype))


def shared_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Plain softmax attention with GQA; q [B,H,Lq,d], k/v [B,Hkv,Lk,d], mask bool broadcastable to [B,H,Lq,Lk]."""
    b, h, _, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    # GQA by expand+reshape: no index kernels, capturable and deterministic
    k = k[:, :, None].expand(b, hkv, h // hkv, lk, d).reshape(b, h, lk, d)
    v = v[:, :, None].expand(b, hkv, h // hkv, lk, d).reshape(b, h, lk, d)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (d**-0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)


class PackedAttentionMoT(nn.Module):
    """Attention with separate q/k/v/o (and q/k norms) for und and gen tokens, one attention over all of them."""

    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        hd, h, hkv, d = (
            config.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.hidden_size,
        )
        self.num_heads, self.num_key_value_heads, self.head_dim = h, hkv, hd
        self.q_proj = nn.Linear(d, h * hd, bias=True)
        self.k_proj = nn.Linear(d, hkv * hd, bias=True)
        self.v_proj = nn.Linear(d, hkv * hd, bias=True)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.q_proj_moe_gen = nn.Linear(d, h * hd, bias=True)
        self.k_proj_moe_gen = nn.Linear(d, hkv * hd, bias=True)
        self.v_proj_moe_gen = nn.Linear(d, hkv * hd, bias=True)
        self.o_proj_moe_gen = nn.Linear(h * hd, d, bias=False)
        norm = (lambda: Qwen2RMSNorm(hd, config.rms_norm_eps)) if config.qk_norm else nn.Identity
        self.q_norm, self.k_norm = norm(), norm()
        self.q_norm_moe_gen, self.k_norm_moe_gen = norm(), norm()

    def _qkv(self, x: torch.Tensor, gen: bool, rope: tuple[torch.Tensor, torch.Tensor]):
        b, n, _ = x.shape
        if gen:
            q, k, v = self.q_proj_moe_gen(x), self.k_proj_moe_gen(x), self.v_proj_moe_gen(x)
            qn, kn = self.q_norm_moe_gen, self.k_norm_moe_gen
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            qn, kn = self.q_norm, self.k_norm
        q = qn(q.view(b, n, self.num_heads, self.head_dim)).transpose(1, 2)
        k = kn(k.view(b, n, self.num_key_value_heads, self.head_dim)).transpose(1, 2)
        v = v.view(b, n, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        return apply_rotary_pos_emb(q, cos, sin), apply_rotary_pos_emb(k, cos, sin), v

    def forward(self, x_und, x_gen, rope_und, rope_gen, mask, past_kv=None, cache_slot=None):
        """Returns (out_und, out_gen, k_new, v_new). Token layout: [und tokens | gen tokens] per sample.

        past_kv: (k, v) of earlier tokens to attend to; cache_slot: (k_cache, v_cache, slot_mask) for a one-token
        decode step that writes its k/v into a static cache in place and attends over the whole cache.
        """
        parts = []
        if x_und is not None:
            parts.append(self._qkv(x_und, False, rope_und))
        if x_gen is not None:
            parts.append(self._qkv(x_gen, True, rope_gen))
        q = torch.cat([p[0] for p in parts], dim=2) if len(parts) > 1 else parts[0][0]
        k_new = torch.cat([p[1] for p in parts], dim=2) if len(parts) > 1 else parts[0][1]
        v_new = torch.cat([p[2] for p in parts], dim=2) if len(parts) > 1 else parts[0][2]
        if cache_slot is not None:
            k_cache, v_cache, slot_mask = cache_slot
            # write the new token at its slot without index kernels (static shapes for graph capture)
            k_cache.copy_(torch.where(slot_mask, k_new, k_cache))
            v_cache.copy_(torch.where(slot_mask, v_new, v_cache))
            k_all, v_all = k_cache, v_cache
        elif past_kv is not None:
            k_all, v_all = torch.cat((past_kv[0], k_new), dim=2), torch.cat((past_kv[1], v_new), dim=2)
        else:
            k_all, v_all = k_new, v_new
        attn = shared_attention(q, k_all, v_all, mask)
        b, _, lq, _ = attn.shape
        attn = attn.transpose(1, 2).reshape(b, lq, self.num_heads * self.head_dim)
        n_und = x_und.shape[1] if x_und is not None else 0
        out_und = self.o_proj(attn[:, :n_und]) if x_und is not None else None
        out_gen = self.o_proj_moe_gen(attn[:, n_und:]) if x_gen is not None else None
        return out_und, out_gen, k_new, v_new


class Qwen2MoTDecoderLayer(nn.Module):
    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = PackedAttentionMoT(config)
        self.mlp = Qwen2MLP(config)
        self.mlp_moe_gen = Qwen2MLP(config)
        self.input_layernorm = Qwen2RMSNorm(config.hidden_size, eps)
        self.input_layernorm_moe_gen = Qwen2RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = Qwen2RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm_moe_gen = Qwen2RMSNorm(config.hidden_size, eps)

    def forward(self, h_und, h_gen, rope_und, rope_gen, mask, past_kv=None, cache_slot=None):
        a_und, a_gen, k_new, v_new = self.self_attn(
            self.input_layernorm(h_und) if h_und is not None else None,
            self.input_layernorm_moe_gen(h_gen) if h_gen is not None else None,
            rope_und,
            rope_gen,
            mask,
            past_kv=past_kv,
            cache_slot=cache_slot,
        )
        if h_und is not None:
            h_und = h_und + a_und
            h_und = h_und + self.mlp(self.post_attention_layernorm(h_und))
        if h_gen is not None:
            h_gen = h_gen + a_gen
            h_gen = h_gen + self.mlp_moe_gen(self.post_attention_layernorm_moe_gen(h_gen))
        return h_und, h_gen, k_new, v_new


class Qwen2Model(nn.Module):
    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Qwen2MoTDecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = Qwen2RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm_moe_gen = Qwen2RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = Qwen2RotaryEmbedding(config)

    def forward(self, h_und, h_gen, pos_und, pos_gen, mask, past_kvs=None, cache_slots=None):
        """Runs every layer; returns normed (h_und, h_gen) and the per-layer (k, v) of the new tokens."""
        rope_und = self.rotary_emb(pos_und) if h_und is not None else None
        rope_gen = self.rotary_emb(pos_gen) if h_gen is not None else None
        new_kvs = []
        for i, layer in enumerate(self.layers):
            h_und, h_gen, k_new, v_new = layer(
                h_und,
                h_gen,
                rope_und,
                rope_gen,
                mask,
                past_kv=None if past_kvs is None else past_kvs[i],
                cache_slot=None if cache_slots is None else cache_slots[i],
            )
            new_kvs.append((k_new, v_new))
        h_und = self.norm(h_und) if h_und is not None else None
        h_gen = self.norm_moe_gen(h_gen) if h_gen is not None else None
        return h_und, h_gen, new_kvs


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.config = config
        self.model = Qwen2Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)  # untied

    @torch.no_grad()
    def init_moe(self) -> None:
        """Copies every und expert weight into its gen twin (upstream `copy_init_moe`)."""
        for name, param in self.named_parameters():
            if "moe_gen" in name:
                twin = dict(self.named_parameters())[name.replace("_moe_gen", "")]
                param.copy_(twin)
