"""Online Tree-RL trainer of r3-mini, stage for stage a miniature of upstream sen-ye/R3 `train/online_rl.py`.
Run: `torchrun --nproc_per_node N train/online_rl.py ARGS` with cwd = examples/r3_mini (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # siblings: modeling/, train/

import time
import warnings
from copy import deepcopy
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from modeling.bagel import Bagel, BagelConfig, Qwen2Config, SiglipVisionConfig
from modeling.bagel.bagel import build_bagel
from modeling.diffusion.sde_sampler import SDESampler
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh

from train.data_utils import DistributedKRepeatSampler, SyntheticPromptDataset
from train.fsdp2_utils import apply_fsdp2, clip_grad_norm_fsdp2, fsdp2_lazy_init_root, gather_frozen_once
from train.reward_func import RewardClient
from train.rollout_controller import Member, MultiRoundRolloutController
from train.train_utils import (
    FusionSwitches,
    RunLogger,
    all_reduce_mean,
    compute_advantages_for_multi_round_rollout,
    parse_args_into_dataclasses,
    set_determinism,
    set_seed,
)


@dataclass
class ModelArguments:
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    llm_qk_norm: bool = True
    layer_module: str = "Qwen2MoTDecoderLayer"
    vit_hidden_size: int = 32
    vit_intermediate_size: int = 64
    vit_num_hidden_layers: int = 1
    vit_num_attention_heads: int = 2
    max_latent_size: int = 4
    latent_patch_dim: int = 64


@dataclass
class DataArguments:
    dataset_name: str = "synthetic_geneval"
    data_seed: int = 42
    policy_group_size: int = 4
    num_train_prompts: int = 64
    num_dev_prompts: int = 16
    prompt_len: int = 6


@dataclass
class TrainingArguments:
    debug: bool = False
    log_dir: str = ""
    global_seed: int = 4396
    resume_from: str | None = None
    total_steps: int = 1000
    warmup_steps: int = 10
    lr_scheduler: str = "constant"
    lr: float = 5e-6
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    ce_weight: float = 1.0
    mse_weight: float = 2.0
    freeze_vit: bool = True
    reshard_after_forward: bool = True
    rounds: int = 2
    group_size: int = 16
    kl_weight_text: float = 0.001
    kl_weight_image: float = 0.001
    grpo_clip_ratio: float = 0.2
    eval_freq: int = 50
    format_reward_weight: float = 1.0
    tune_text_cot: bool = True
    tune_image_cot: bool = True
    enable_sde_gen: bool = True
    enable_sde_edit: bool = True
    max_output_token_n_gen: int = 32
    max_output_token_n_edit: int = 32
    text_temperature: float = 0.9
    top_k: int = 50
    timestep_shift: float = 3.0
    num_timesteps_gen: int = 16
    num_timesteps_edit: int = 21
    eta_mode: str = "monotonic"
    constant_eta_gen: float = 0.7
    constant_eta_edit: float = 1.0
    max_sde_timestep_idx_for_edit: int = 2
    reward_mode: str = "inprocess"
    reward_batch: int = 8
    device: str = "cpu"
    precision: str = "fp32"


def build_model(model_args: ModelArguments, training_args: TrainingArguments, seed: int) -> Bagel:
    """Builds the model under its own seed, so every rank starts from the same weights even without resume_from."""
    if training_args.precision not in ("fp32", "bf16"):
        raise ValueError(f"precision {training_args.precision!r}: only fp32 and bf16 are allowed")
    llm_config = Qwen2Config(
        vocab_size=model_args.vocab_size,
        hidden_size=model_args.hidden_size,
        intermediate_size=model_args.intermediate_size,
        num_hidden_layers=model_args.num_hidden_layers,
        num_attention_heads=model_args.num_attention_heads,
        num_key_value_heads=model_args.num_key_value_heads,
        qk_norm=model_args.llm_qk_norm,
        layer_module=model_args.layer_module,
    )
    vit_config = SiglipVisionConfig(
        patch_dim=model_args.latent_patch_dim,
        hidden_size=model_args.vit_hidden_size,
        intermediate_size=model_args.vit_intermediate_size,
        num_hidden_layers=model_args.vit_num_hidden_layers,
        num_attention_heads=model_args.vit_num_attention_heads,
        num_patches=model_args.max_latent_size**2,
    )
    config = BagelConfig(
        llm_config=llm_config,
        vit_config=vit_config,
        latent_patch_dim=model_args.latent_patch_dim,
        max_latent_size=model_args.max_latent_size,
        timestep_shift=training_args.timestep_shift,
        precision=training_args.precision,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_bagel(config)
        model.language_model.init_moe()
    return model


class RolloutBuffer:
    """Round-1 results of every rank (gathered), from which each policy group draws the image it will edit."""

    def __init__(self) -> None:
        self.perfect_buffer: list = []
        self.bad_buffer: list = []

    def update(self, metadata: dict, reward: float, img: torch.Tensor) -> None:
        (self.perfect_buffer if reward == 1 else self.bad_buffer).append((metadata, reward, img))

    def all_gather(self) -> None:
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (self.perfect_buffer, self.bad_buffer))
        self.perfect_buffer = [x for perfect, _ in gathered for x in perfect]
        self.bad_buffer = [x for _, bad in gathered for x in bad]

    def clear(self) -> None:
        self.perfect_buffer, self.bad_buffer = [], []

    def sample(self, seed: int, device: torch.device, perfect_ratio: float = 0.15):
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        mode = int(torch.bernoulli(torch.tensor([perfect_ratio], device=device), generator=g).item())
        if not self.perfect_buffer:
            mode = 0
        if not self.bad_buffer:
            mode = 1
        pool = self.perfect_buffer if mode == 1 else self.bad_buffer
        return pool[int(torch.randint(0, len(pool), (1,), generator=g, device=device).item())]


def initial_noise_for(index: int, data_seed: int, shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    """Fixed per-prompt noise of the deterministic DEV evaluation."""
    g = torch.Generator(device=device)
    g.manual_seed(data_seed * 100003 + index)
    return torch.randn(shape, generator=g, device=device)


def evaluate_dev_indices(controller, dataset, indices, training_args, data_args, reward_client, device) -> list[float]:
    """Round-1 rollouts of DEV prompts: greedy text, ODE denoising from fixed noise; returns their rewards."""
    if not indices:
        return []
    model = controller.model
    n_img = model.config.num_image_tokens
    items = [dataset[i] for i in indices]
    prompt_ids = torch.tensor([it["prompt_ids"] for it in items], dtype=torch.long, device=device)
    noise = torch.stack(
        [initial_noise_for(i, data_args.data_seed, (n_img, model.patch_latent_dim), device) for i in indices]
    )
    with controller.context():
        results = controller.rollout(
            round_kind="gen",
            prompt_ids=prompt_ids,
            metadatas=[it["metadata"] for it in items],
            members=None,
            initial_noise=noise,
            sde_timestep_idx=None,
            num_timesteps=training_args.num_timesteps_gen,
            max_new_tokens=training_args.max_output_token_n_gen,
            temperature=training_args.text_temperature,
            reward_client=reward_client,
        )
    return [f.result() for f in results["per_sample_rewards"]]


def member_layout(rank: int, world: int, policy_group_size: int, group_size: int) -> tuple[int, list[int], int]:
    """(policy_group_id, logical member ids played by this rank, samples per member); see README."""
    if world >= policy_group_size:
        if world % policy_group_size:
            raise ValueError(f"world size {world} must be divisible by policy_group_size {policy_group_size}")
        return rank // policy_group_size, [rank], max(group_size // policy_group_size, 1)
    if policy_group_size % world:
        raise ValueError(f"policy_group_size {policy_group_size} must be divisible by world size {world}")
    per_rank = policy_group_size // world
    return 0, [rank * per_rank + j for j in range(per_rank)], max(group_size // policy_group_size, 1)


def main() -> None:
    set_determinism()
    # our outputs are fresh linear outputs reshaped (views); nothing modifies them in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    model_args, data_args, training_args = parse_args_into_dataclasses(
        (ModelArguments, DataArguments, TrainingArguments)
    )
    cuda = training_args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=1000))
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    switches = FusionSwitches.from_env().effective(training_args.device)
    logger = RunLogger(training_args.log_dir, rank)
    logger.log(
        "config",
        {
            "model": vars(model_args),
            "data": vars(data_args),
            "training": vars(training_args),
            "switches": switches,
            "world_size": world,
        },
    )

    # ---- policy groups (upstream: ranks // policy_group_size; fewer ranks play several members) ----------------
    policy_group_id, member_ids, samples_per_member = member_layout(
        rank, world, data_args.policy_group_size, training_args.group_size
    )
    current_policy_group = None
    if world > data_args.policy_group_size:
        groups = [
            dist.new_group(list(range(i, i + data_args.policy_group_size)))
            for i in range(0, world, data_args.policy_group_size)
        ]
        current_policy_group = groups[policy_group_id]

    seed = training_args.global_seed * world + rank
    set_seed(seed)

    # ---- model, frozen ViT, loading adapter (before sharding), reference copy, FSDP2 ---------------------------
    model = build_model(model_args, training_args, training_args.global_seed)
    if training_args.freeze_vit:
        model.vit_model.eval()
        for param in model.vit_model.parameters():
            param.requires_grad = False
    if training_args.resume_from:
        missing, unexpected = model.load_state_dict(load_file(training_args.resume_from), strict=False)
        logger.log("load", {"missing": list(missing), "unexpected": list(unexpected)})
    model.to(device)
    mesh = init_device_mesh(device.type, (world,))
    if training_args.kl_weight_text > 0 or training_args.kl_weight_image > 0:
        ref_model = deepcopy(model)
        ref_model.requires_grad_(False)
        ref_model.eval()
        ref_model = apply_fsdp2(ref_model, mesh, training_args.reshard_after_forward)
        fsdp2_lazy_init_root(ref_model)
        if switches["REF_GATHER_ONCE"]:
            gather_frozen_once(ref_model)
    else:
        ref_model = None
    fsdp_model = apply_fsdp2(model, mesh, training_args.reshard_after_forward)
    fsdp2_lazy_init_root(fsdp_model)

    params_to_optimize = [p for p in fsdp_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params_to_optimize,
        lr=training_args.lr,
        betas=(training_args.beta1, training_args.beta2),
        eps=training_args.eps,
        weight_decay=training_args.weight_decay,
    )
    if training_args.lr_scheduler != "constant":
        raise ValueError("only the constant schedule with warm-up of the recipe is implemented")
    warmup = training_args.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: float(s) / float(max(1, warmup)) if s < warmup else 1.0
    )
    train_step = 0

    # ---- data, reward, rollout controller ----------------------------------------------------------------------
    def dataset(split: str) -> SyntheticPromptDataset:
        return SyntheticPromptDataset(
            split,
            data_args.data_seed,
            data_args.num_train_prompts,
            data_args.num_dev_prompts,
            data_args.prompt_len,
            model_args.vocab_size,
        )

    train_dataset, test_dataset = dataset("train"), dataset("dev")
    train_sampler = DistributedKRepeatSampler(len(train_dataset), policy_group_id, data_args.data_seed)
    reward_client = RewardClient(training_args.reward_mode, training_args.reward_batch, data_args.data_seed)
    sde_sampler_gen = SDESampler(training_args.eta_mode, training_args.constant_eta_gen)
    sde_sampler_edit = SDESampler(training_args.eta_mode, training_args.constant_eta_edit)
    rollout_controller = MultiRoundRolloutController(fsdp_model, training_args, switches, device)
    rollout_buffer = RolloutBuffer()
    n_img, latent_dim = model.config.num_image_tokens, model.patch_latent_dim
    fsdp_model.train()

    for curr_step in range(train_step, training_args.total_steps):
        if training_args.debug and curr_step == train_step:
            pass  # debug: skip the initial evaluation, as upstream
        elif curr_step % training_args.eval_freq == 0:
            mine = list(range(rank, len(test_dataset), world))
            rewards = evaluate_dev_indices(
                rollout_controller, test_dataset, mine, training_args, data_args, reward_client, device
            )
            totals = torch.tensor([sum(rewards), len(rewards)], dtype=torch.float64, device=device)
            dist.all_reduce(totals)
            logger.log("eval", {"step": curr_step, "dev_mean_reward": float(totals[0] / totals[1])})

        if cuda:
            torch.cuda.synchronize()
        start_time = time.time()
        group_seed = (policy_group_id + 1) * training_args.total_steps + curr_step
        group_generator = torch.Generator(device=device)
        group_generator.manual_seed(group_seed)
        members = []
        for member_id in member_ids:
            g = torch.Generator(device=device)
            g.manual_seed((member_id + 1) * training_args.total_steps + curr_step)  # gen_seed of that member
            members.append(Member(g, samples_per_member))
        rollout_batch_size = samples_per_member * len(members)
        initial_noise = [torch.randn(n_img, latent_dim, generator=group_generator, device=device) for _ in range(2)]
        is_gen = curr_step % training_args.rounds == 0

        with rollout_controller.context():
            if is_gen:
                rollout_buffer.clear()
                train_sampler.set_epoch(curr_step)
                item = train_dataset[train_sampler.next_index()]
                metadata = {**item["metadata"], "prompt_ids": item["prompt_ids"]}
                sde_idx = None
                if training_args.enable_sde_gen:
                    sde_idx = int(
                        torch.randint(
                            0,
                            training_args.num_timesteps_gen - 1,
                            (1,),
                            device=device,
                            generator=group_generator,
                        ).item()
                    )
                rollout_controller.sde_sampler = sde_sampler_gen
                inference_results = rollout_controller.rollout(
                    round_kind="gen",
                    prompt_ids=torch.tensor([item["prompt_ids"]] * rollout_batch_size, device=device),
                    metadatas=[metadata] * rollout_batch_size,
                    members=members,
                    initial_noise=initial_noise[0].expand(rollout_batch_size, -1, -1).contiguous(),
                    sde_timestep_idx=sde_idx,
                    num_timesteps=training_args.num_timesteps_gen,
                    max_new_tokens=training_args.max_output_token_n_gen,
                    temperature=training_args.text_temperature,
                    reward_client=reward_client,
                )
            else:
                metadata, last_reward, img = rollout_buffer.sample(seed=group_seed, device=device)
                sde_idx = None
                if training_args.enable_sde_edit:
                    sde_idx = int(
                        torch.randint(
                            0,
                            training_args.max_sde_timestep_idx_for_edit,
                            (1,),
                            device=device,
                            generator=group_generator,
                        ).item()
                    )
                rollout_controller.sde_sampler = sde_sampler_edit
                inference_results = rollout_controller.rollout(
                    round_kind="edit",
                    prompt_ids=torch.tensor([metadata["prompt_ids"]] * rollout_batch_size, device=device),
                    metadatas=[metadata] * rollout_batch_size,
                    members=members,
                    initial_noise=initial_noise[1].expand(rollout_batch_size, -1, -1).contiguous(),
                    sde_timestep_idx=sde_idx,
                    num_timesteps=training_args.num_timesteps_edit,
                    max_new_tokens=training_args.max_output_token_n_edit,
                    temperature=training_args.text_temperature,
                    reward_client=reward_client,
                    input_img=img.to(device),
                )

        # ---- rewards: round 1 scores its image; round 2 scores the improvement over the edited image ----------
        per_sample_rewards, per_sample_total_rewards, edit_img_adv_multiplier = [], [], []
        for sample_idx, future in enumerate(inference_results["per_sample_rewards"]):
            reward = future.result()
            format_reward = inference_results["per_sample_format_rewards"][sample_idx]
            if is_gen:
                total_reward = reward * format_reward + training_args.format_reward_weight * format_reward
                rollout_buffer.update(metadata, reward, inference_results["output_imgs"][sample_idx].cpu())
            else:
                improvement = reward - last_reward
                no_edit = inference_results["per_sample_no_edit"][sample_idx]
                if last_reward == 1 and no_edit:
                    improvement = 1
                edit_img_adv_multiplier.append(0 if no_edit else 1)
                total_reward = format_reward * training_args.format_reward_weight + improvement * format_reward
            per_sample_rewards.append([reward])
            per_sample_total_rewards.append([total_reward])
        if is_gen:
            rollout_buffer.all_gather()
        text_advantages, _ = compute_advantages_for_multi_round_rollout(
            per_sample_total_rewards, current_policy_group, device
        )
        image_advantages, additional_stats = compute_advantages_for_multi_round_rollout(
            per_sample_rewards, current_policy_group, device
        )
        for sample_idx, multiplier in enumerate(edit_img_adv_multiplier):
            image_advantages[sample_idx][0] = image_advantages[sample_idx][0] * multiplier

        # ---- loss and one optimizer step -----------------------------------------------------------------------
        loss_dict: dict[str, list[float]] = {
            "text_policy_loss": [],
            "text_kl_loss": [],
            "img_policy_loss": [],
            "img_kl_loss": [],
        }
        fsdp_model.train()
        optimizer.zero_grad(set_to_none=True)
        packed, total_text_grad_tokens, total_image_num = rollout_controller.prepack(inference_results)
        sde_sampler = sde_sampler_gen if is_gen else sde_sampler_edit
        clip = training_args.grpo_clip_ratio
        for packed_input, loss_info in rollout_controller.pack_iterator(
            packed, inference_results, text_advantages, image_advantages
        ):
            ref_out = None
            if ref_model is not None:
                with torch.no_grad():
                    ref_out = ref_model(mode="train", **packed_input)
            output_dict = fsdp_model(mode="train", **packed_input)
            loss = output_dict["logits"].new_zeros(())
            if training_args.tune_text_cot:
                label_ids = loss_info["packed_label_ids"]
                mask = loss_info["loss_mask"]
                per_token_logps = output_dict["logits"].log_softmax(-1).gather(-1, label_ids[..., None]).squeeze(-1)
                behavior_logps = loss_info["inference_probs"].detach().clamp_min(1e-20).log()
                adv = loss_info["text_advantages"][:, None]
                ratio1 = torch.exp(per_token_logps - behavior_logps)
                ratio2 = torch.clamp(ratio1, min=1.0 - clip, max=1.0 + clip)
                per_token_loss = -(torch.minimum(ratio1 * adv, ratio2 * adv) * mask).sum() / (
                    1e-4 + total_text_grad_tokens
                )
                loss_dict["text_policy_loss"].append(per_token_loss.item())
                text_loss = per_token_loss
                if training_args.kl_weight_text > 0:
                    ref_logps = ref_out["logits"].log_softmax(-1).gather(-1, label_ids[..., None]).squeeze(-1)
                    delta = ref_logps - per_token_logps
                    per_token_kl = ((torch.exp(delta) - delta - 1) * mask).sum() / (1e-4 + total_text_grad_tokens)
                    loss_dict["text_kl_loss"].append(per_token_kl.item())
                    if per_token_kl.item() > 10:  # upstream's guard against a runaway KL
                        per_token_kl = per_token_logps.mean() * 0.0
                    text_loss = text_loss + training_args.kl_weight_text * per_token_kl
                loss = loss + text_loss * training_args.ce_weight
            if training_args.tune_image_cot and loss_info["log_probs"] is not None:
                x_t = loss_info["packed_noisy_latent_for_loss"]
                t, dt = loss_info["packed_timesteps_for_loss"], loss_info["dts"]
                x_curr = sde_sampler.get_x_t_distribution(x_t, t, dt, output_dict["packed_mse_preds"])
                log_prob_per_image = x_curr.log_prob(loss_info["packed_prev_latents"]).mean(-1)
                behavior_per_image = loss_info["log_probs"].mean(-1)
                img_adv = loss_info["image_advantages"]
                ratio1 = torch.exp(log_prob_per_image - behavior_per_image.detach())
                ratio2 = torch.clamp(ratio1, min=1.0 - clip, max=1.0 + clip)
                img_loss = -torch.minimum(ratio1 * img_adv, ratio2 * img_adv).sum() / (1e-4 + total_image_num)
                loss_dict["img_policy_loss"].append(img_loss.item())
                loss = loss + img_loss * training_args.mse_weight
                if training_args.kl_weight_image > 0:
                    ref_x_curr = sde_sampler.get_x_t_distribution(x_t, t, dt, ref_out["packed_mse_preds"])
                    kl_img_loss = x_curr.kl_divergence(ref_x_curr).mean()
                    loss_dict["img_kl_loss"].append(kl_img_loss.item())
                    loss = loss + kl_img_loss * training_args.kl_weight_image
            loss.backward()
        total_norm = clip_grad_norm_fsdp2(
            [p for p in fsdp_model.parameters() if p.requires_grad], training_args.max_grad_norm
        )
        optimizer.step()
        scheduler.step()
        logged = {}
        for key, values in loss_dict.items():
            if values:
                logged[key] = float(all_reduce_mean(torch.tensor(sum(values) / len(values), device=device)).item())

        if cuda:
            torch.cuda.synchronize()
        logger.log(
            "train",
            {
                "step": curr_step,
                "step_time": time.time() - start_time,
                "lr": optimizer.param_groups[0]["lr"],
                "total_norm": float(total_norm.item()),
                "mean_reward": additional_stats["mean_reward"],
                "mean_cot_length": inference_results["mean_cot_length"],
                **logged,
            },
        )

    reward_client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
