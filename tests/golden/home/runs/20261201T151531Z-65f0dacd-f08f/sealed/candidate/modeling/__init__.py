"""Model code of r3-mini, laid out like upstream sen-ye/R3 `modeling/`.
A miniature BAGEL: MoT Qwen2 decoder, frozen ViT, latent-patch adapters and the SDE sampler."""
