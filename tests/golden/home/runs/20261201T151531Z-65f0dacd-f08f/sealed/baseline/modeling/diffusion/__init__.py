"""Flow-matching samplers of r3-mini (upstream `modeling/diffusion`).
Only the SDE sampler used by the Tree-RL rollouts lives here."""
