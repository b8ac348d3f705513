"""SDE sampler of the Tree-RL image rollouts (upstream `modeling/diffusion/sde_sampler.py`).
One denoising step is stochastic (a Gaussian whose log-prob is trained); the others follow the ODE."""

from __future__ import annotations

import torch


class GaussianDistribution:
    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean = mean
        self.std = std

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Per-token log-prob up to a constant (mean over the latent channels), as upstream with real=False."""
        return -0.5 * torch.mean((x - self.mean) ** 2 / (self.std**2), dim=-1)

    def kl_divergence(self, other: GaussianDistribution) -> torch.Tensor:
        return torch.mean((self.mean - other.mean) ** 2 / (other.std**2), dim=-1)


class SDESampler:
    def __init__(self, eta_mode: str = "monotonic", constant_eta: float = 0.7) -> None:
        if eta_mode not in ("constant", "monotonic"):
            raise ValueError(f"unknown eta_mode {eta_mode!r}")
        self.eta_mode = eta_mode
        self.constant_eta = constant_eta

    def get_eta(self, t: torch.Tensor) -> torch.Tensor:
        if self.eta_mode == "constant":
            return torch.full_like(t, self.constant_eta)
        return torch.sqrt(t / (1 - torch.where(t >= 0.95, torch.full_like(t, 0.95), t))) * self.constant_eta

    def get_x_t_distribution(
        self, x_t: torch.Tensor, t: torch.Tensor, dt: torch.Tensor, model_output: torch.Tensor
    ) -> GaussianDistribution:
        """x_t [..., C]; t, dt broadcastable to x_t[..., :1]; model_output is the velocity (data -> noise)."""
        pred_x_0 = x_t - t * model_output
        score_estimate = -(x_t - pred_x_0 * (1 - t)) / t**2
        eta = self.get_eta(t)
        log_term = -0.5 * eta**2 * score_estimate
        mean = x_t - (model_output + log_term) * dt
        std = eta * torch.sqrt(dt)
        return GaussianDistribution(mean, std.expand_as(mean))

    def __repr__(self) -> str:
        return f"SDESampler(eta_mode={self.eta_mode}, constant_eta={self.constant_eta})"


def timestep_schedule(num_timesteps: int, shift: float) -> tuple[list[float], list[float]]:
    """Shifted flow-matching timesteps t_0=1 .. t_n=0 and the step sizes dt_i = t_i - t_{i+1}."""
    ts = [1.0 - i / num_timesteps for i in range(num_timesteps + 1)]
    ts = [shift * t / (1 + (shift - 1) * t) for t in ts]
    return ts[:-1], [ts[i] - ts[i + 1] for i in range(num_timesteps)]
