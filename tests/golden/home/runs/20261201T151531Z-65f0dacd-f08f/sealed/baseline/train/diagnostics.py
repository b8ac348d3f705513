"""GPU diagnostic of the fused Triton top-k filter: fresh random inputs each run, exact comparison with the torch
reference; prints one result line, exits 1 on any mismatch (with the largest difference in ulps)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse

import torch


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """float32 -> int64 keys whose differences count ulps (monotone in the float order)."""
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def max_ulp_difference(a: torch.Tensor, b: torch.Tensor) -> int:
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not torch.equal(torch.isinf(a), torch.isinf(b)) or not torch.equal(a[~finite], b[~finite]):
        return 2**31  # -inf placement differs: a different top-k set
    if not finite.any():
        return 0
    return int((_ordered(a[finite]) - _ordered(b[finite])).abs().max().item())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    from train.fused_ops import topk_filter_reference, topk_filter_triton, triton

    if triton is None or (args.device == "cpu" and not interpret):
        print("r3mini-diag triton_topk_filter: SKIP (needs CUDA and Triton, or TRITON_INTERPRET=1 on CPU)")
        return 0
    seed = int.from_bytes(os.urandom(8), "little")  # fresh inputs every run
    g = torch.Generator(device="cpu").manual_seed(seed)
    worst, checked = 0, 0
    for trial in range(args.trials):
        rows = int(torch.randint(1, 64, (1,), generator=g))
        vocab = int(torch.randint(2, 4096 if not interpret else 600, (1,), generator=g))
        x = torch.randn(rows, vocab, generator=g) * float(torch.rand(1, generator=g) * 20 + 0.01)
        if trial % 3 == 1:  # many ties
            x = torch.round(x * 4) / 4
        if trial % 5 == 2:  # signed zeros
            x[:, : vocab // 3] = 0.0
            x[:, vocab // 3 : vocab // 2] = -0.0
        temperature = torch.tensor(float(torch.rand(1, generator=g) * 1.5 + 0.05), dtype=torch.float32)
        top_k = int(torch.randint(1, vocab + 1, (1,), generator=g))
        x, temperature = x.to(args.device), temperature.to(args.device)
        ref = topk_filter_reference(x, temperature, top_k)
        out = topk_filter_triton(x, temperature, top_k)
        worst = max(worst, max_ulp_difference(ref, out))
        checked += 1
    ok = worst == 0
    print(f"r3mini-diag triton_topk_filter: {'PASS' if ok else 'FAIL'} trials={checked} max_ulp={worst} seed={seed}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
