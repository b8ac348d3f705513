"""Trainer of r3-mini, laid out like upstream sen-ye/R3 `train/`.
Entry point: `torchrun --nproc_per_node N train/online_rl.py ARGS` with cwd = examples/r3_mini."""
