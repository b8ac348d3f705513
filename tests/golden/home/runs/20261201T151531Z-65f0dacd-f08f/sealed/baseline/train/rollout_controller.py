"""Multi-round rollouts of the Tree-RL recipe (upstream `train/rollout_controller.py`): think text, then image
latents by denoising with one SDE step; the reflect-and-edit round; prepack/pack_iterator build the training input."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from modeling.bagel import SequencePlan
from modeling.diffusion.sde_sampler import SDESampler, timestep_schedule

from train.data_utils import (
    END,
    NO_EDIT,
    REFLECT,
    START_EDIT,
    START_THINK,
    loss_mask_until_end,
    think_format_reward,
)
from train.fsdp2_utils import fsdp2_rollout_context
from train.fused_ops import topk_filter


@dataclass
class Member:
    """One logical policy-group member played by this rank: its generation generator and its sample count."""

    generator: torch.Generator
    num_samples: int


class GraphedStep:
    """Runs `fn` (static inputs -> static outputs) eagerly, or as a CUDA graph: the first call runs eagerly (a real
    step, also the warm-up), the second captures (capture executes nothing) and replays; later calls replay. No extra
    forward, no RNG inside; `release()` frees the graph and its pool at the end of the rollout call."""

    def __init__(self, fn, enabled: bool) -> None:
        self.fn, self.enabled = fn, enabled
        self.calls, self.graph, self.out = 0, None, None

    def __call__(self):
        self.calls += 1
        if not self.enabled:
            return self.fn()
        current = torch.cuda.current_stream()
        if self.calls == 1:
            side = torch.cuda.Stream()
            side.wait_stream(current)
            with torch.cuda.stream(side):
                out = self.fn()
            current.wait_stream(side)
            return out
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(current)
            with torch.cuda.stream(side):
                self.graph.capture_begin(capture_error_mode="thread_local")
                try:
                    self.out = self.fn()
                finally:
                    self.graph.capture_end()
            current.wait_stream(side)
        self.graph.replay()
        return self.out

    def release(self) -> None:
        if self.graph is not None:
            self.graph.reset()
        self.graph, self.out = None, None


class MultiRoundRolloutController:
    def __init__(self, model, args, switches: dict[str, bool], device: torch.device) -> None:
        self.model = model
        self.args = args
        self.switches = switches
        self.device = device
        self.sde_sampler: SDESampler | None = None

    @contextmanager
    def context(self):
        """Rollout context: params gathered once (switch ROLLOUT_UNSHARD) or FSDP's per-forward all-gathers."""
        if self.switches["ROLLOUT_UNSHARD"]:
            with fsdp2_rollout_context(self.model):
                yield
            return
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.model.train(was_training)

    # ---- model stages (upstream Bagel.prepare_* / forward_cache_update_* / generate_*) ------------------------
    def vit_features(self, image: torch.Tensor, batch: int) -> torch.Tensor:
        """Frozen ViT features of one input image, computed once and shared by every sample (switch VIT_CACHE)."""
        return self.model(mode="vit", images=image[None]).expand(batch, -1, -1).contiguous()

    def forward_cache_update(self, plan: SequencePlan, segment_inputs: list, max_new_tokens: int):
        out = self.model(mode="prefill", plan=plan, segment_inputs=segment_inputs)
        ctx_len = plan.und_len + plan.gen_len
        caches = []
        for k, v in out["kvs"]:
            b, h, _, d = k.shape
            kc = k.new_zeros((b, h, ctx_len + max_new_tokens, d))
            vc = v.new_zeros((b, h, ctx_len + max_new_tokens, d))
            kc[:, :, :ctx_len].copy_(k)
            vc[:, :, :ctx_len].copy_(v)
            caches.append((kc, vc))
        return out["logits"], caches, ctx_len

    def _sample(self, probs: torch.Tensor, members: list[Member] | None) -> torch.Tensor:
        if members is None:  # greedy (evaluation)
            return probs.argmax(dim=-1)
        tokens, start = [], 0
        for m in members:
            rows = probs[start : start + m.num_samples]
            tokens.append(torch.multinomial(rows, 1, generator=m.generator).squeeze(1))
            start += m.num_samples
        return torch.cat(tokens)

    def generate_text(self, first_logits, caches, ctx_len, first_group, max_new_tokens, members, temperature):
        """Samples max_new_tokens tokens (temperature + top-k), one decode forward per token on a static KV cache."""
        batch = first_logits.shape[0]
        temp = torch.tensor(temperature, dtype=torch.float32, device=self.device)
        use_triton = self.switches["TRITON_TOPK"]

        def process(logits):
            if members is None:
                return logits
            return torch.softmax(topk_filter(logits, temp, self.args.top_k, use_triton), dim=-1)

        token_buf = torch.zeros(batch, dtype=torch.long, device=self.device)
        rope_pos = torch.tensor(first_group, dtype=torch.long, device=self.device)
        slot = torch.tensor(ctx_len, dtype=torch.long, device=self.device)
        slot_range = torch.arange(ctx_len + max_new_tokens, device=self.device)

        def decode_fn():
            return process(
                self.model(
                    mode="decode",
                    token_ids=token_buf,
                    rope_pos=rope_pos,
                    slot=slot,
                    slot_range=slot_range,
                    caches=caches,
                )
            )

        step = GraphedStep(decode_fn, self.switches["CUDA_GRAPH"])
        probs = process(first_logits)
        tokens, behavior = [], []
        try:
            for _ in range(max_new_tokens):
                tok = self._sample(probs, members)
                tokens.append(tok)
                if members is not None:
                    behavior.append(probs.gather(1, tok[:, None]).squeeze(1))
                token_buf.copy_(tok)
                probs = step()  # writes token i into the cache; logits for token i + 1
                rope_pos.add_(1)
                slot.add_(1)
        finally:
            step.release()
        out_tokens = torch.stack(tokens, dim=1)
        out_probs = torch.stack(behavior, dim=1) if behavior else None
        return out_tokens, out_probs

    def generate_image_sde(self, caches, prefix_len, img_group, initial_noise, num_timesteps, sde_idx, members):
        """Denoises from initial_noise [B, N, C]; step sde_idx samples from the SDE Gaussian (log-prob recorded)."""
        batch = initial_noise.shape[0]
        x_buf = initial_noise.clone()
        t_buf = torch.zeros(batch, dtype=torch.float32, device=self.device)

        def denoise_fn():
            return self.model(
                mode="denoise", x_t=x_buf, t=t_buf, img_group=img_group, prefix_len=prefix_len, caches=caches
            )

        step = GraphedStep(denoise_fn, self.switches["CUDA_GRAPH"])
        ts, dts = timestep_schedule(num_timesteps, self.args.timestep_shift)
        record = None
        try:
            for i, (t, dt) in enumerate(zip(ts, dts, strict=True)):
                t_buf.fill_(t)
                v = step()
                if sde_idx is not None and i == sde_idx:
                    t_ = torch.tensor(t, dtype=torch.float32, device=self.device)
                    dt_ = torch.tensor(dt, dtype=torch.float32, device=self.device)
                    dist_ = self.sde_sampler.get_x_t_distribution(x_buf, t_, dt_, v)
                    noise = torch.cat(
                        [
                            torch.randn((m.num_samples, *x_buf.shape[1:]), generator=m.generator, device=self.device)
                            for m in members
                        ]
                    )
                    x_prev = dist_.mean + dist_.std * noise
                    record = {
                        "x_t": x_buf.clone(),
                        "t": t,
                        "dt": dt,
                        "x_prev": x_prev,
                        "log_probs": dist_.log_prob(x_prev),
                    }
                    x_buf.copy_(x_prev)
                else:
                    x_buf.copy_(x_buf - v * dt)
        finally:
            step.release()
        return x_buf.clone(), record

    # ---- one rollout call -------------------------------------------------------------------------------------
    def rollout(
        self,
        *,
        round_kind: str,
        prompt_ids: torch.Tensor,
        metadatas: list[dict],
        members: list[Member] | None,
        initial_noise: torch.Tensor,
        sde_timestep_idx: int | None,
        num_timesteps: int,
        max_new_tokens: int,
        temperature: float,
        reward_client,
        input_img: torch.Tensor | None = None,
    ) -> dict:
        """round_kind "gen": [prompt, START_THINK] -> think -> image. "edit": [REFLECT, prompt, ViT(img), VAE(img),
        START_EDIT] -> edit instruction -> edited image. Returns everything prepack needs, rewards as futures."""
        batch = prompt_ids.shape[0]
        dev = self.device
        if round_kind == "gen":
            head = torch.cat([prompt_ids, torch.full((batch, 1), START_THINK, device=dev)], dim=1)
            segments = [("text", head.shape[1])]
            inputs: list = [head]
        else:
            head = torch.cat([torch.full((batch, 1), REFLECT, device=dev), prompt_ids], dim=1)
            images = input_img[None].expand(batch, -1, -1).contiguous()
            if self.switches["VIT_CACHE"]:
                vit_in = {"features": self.vit_features(input_img, batch)}
            else:
                vit_in = {"images": images}
            n_img = images.shape[1]
            segments = [("text", head.shape[1]), ("vit", n_img), ("vae", n_img), ("text", 1)]
            zeros_t = torch.zeros(batch, dtype=torch.float32, device=dev)
            inputs = [
                head,
                vit_in,
                {"latents": images, "t": zeros_t},
                torch.full((batch, 1), START_EDIT, device=dev),
            ]
        plan = SequencePlan(tuple(segments))
        first_logits, caches, ctx_len = self.forward_cache_update(plan, inputs, max_new_tokens)
        tokens, behavior_probs = self.generate_text(
            first_logits, caches, ctx_len, plan.next_group, max_new_tokens, members, temperature
        )
        img_group = plan.next_group + max_new_tokens
        images_out, record = self.generate_image_sde(
            caches,
            ctx_len + max_new_tokens,
            img_group,
            initial_noise,
            num_timesteps,
            sde_timestep_idx,
            members,
        )
        del caches
        futures = reward_client.submit(images_out.float().cpu().numpy(), metadatas)
        token_lists = tokens.cpu().tolist()
        return {
            "round_kind": round_kind,
            "segments": segments,
            "segment_inputs": inputs,
            "tokens": tokens,
            "behavior_probs": behavior_probs,
            "loss_mask": torch.tensor([loss_mask_until_end(t) for t in token_lists], device=dev),
            "sde": record,
            "output_imgs": images_out,
            "per_sample_rewards": futures,
            "per_sample_format_rewards": [think_format_reward(t) for t in token_lists],
            "per_sample_no_edit": [NO_EDIT in t[: t.index(END)] if END in t else NO_EDIT in t for t in token_lists],
            "mean_cot_length": float(sum(sum(loss_mask_until_end(t)) for t in token_lists) / max(1, batch)),
        }

    # ---- training input (upstream prepack / pack_iterator) -----------------------------------------------------
    def prepack(self, results: dict) -> tuple[dict, int, int]:
        """One packed batch: the rollout's segments with the sampled text appended and the SDE-step latent last."""
        rec = results["sde"]
        batch, n_new = results["tokens"].shape
        segments = list(results["segments"])
        inputs = list(results["segment_inputs"])
        # the last context segment is text ([.., START]); the sampled tokens extend it
        last_kind, last_len = segments[-1]
        segments[-1] = (last_kind, last_len + n_new)
        inputs[-1] = torch.cat([inputs[-1], results["tokens"]], dim=1)
        n_img = rec["x_t"].shape[1]
        segments.append(("noisy", n_img))
        t_vec = torch.full((batch,), rec["t"], dtype=torch.float32, device=self.device)
        inputs.append({"latents": rec["x_t"], "t": t_vec})
        packed = {"plan": SequencePlan(tuple(segments)), "segment_inputs": inputs, "label_len": n_new}
        total_text_grad_tokens = int(results["loss_mask"].sum().item())
        return packed, total_text_grad_tokens, batch

    def pack_iterator(self, packed: dict, results: dict, text_advantages, image_advantages):
        """Yields (packed_input, loss_info) once: the whole rank batch fits one forward in the miniature."""
        rec = results["sde"]
        batch = rec["x_t"].shape[0]
        loss_info = {
            "packed_label_ids": results["tokens"],
            "loss_mask": results["loss_mask"],
            "inference_probs": results["behavior_probs"],
            "text_advantages": torch.tensor([a[0] for a in text_advantages], device=self.device),
            "image_advantages": torch.tensor([a[0] for a in image_advantages], device=self.device),
            "packed_noisy_latent_for_loss": rec["x_t"],
            "packed_timesteps_for_loss": torch.full((batch, 1, 1), rec["t"], device=self.device),
            "dts": torch.full((batch, 1, 1), rec["dt"], device=self.device),
            "packed_prev_latents": rec["x_prev"],
            "log_probs": rec["log_probs"],
        }
        yield packed, loss_info
