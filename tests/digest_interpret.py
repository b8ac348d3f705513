"""Run under TRITON_INTERPRET=1 (set before Triton is imported): the digest's Triton kernels on CPU tensors through
Triton's interpreter, against the NumPy reference. Prints one JSON line: what was compared and every difference.

The same kernels, grids and launch tables as on a GPU; only the executor differs. It proves the kernels' integer
arithmetic and the launch tables' layout (groups, tails, alignment units, wide chunk arithmetic) for several block
sizes and grids; it says nothing about speed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if os.environ.get("TRITON_INTERPRET") != "1":
    raise SystemExit("set TRITON_INTERPRET=1 before running this check (Triton reads it at import)")

import numpy as np
import torch

import workers.digest_triton as dt
import workers.digest_triton_compare as dc
from workers.tx128 import tx128_reference


def reference(t: torch.Tensor) -> str:
    c = t.contiguous()
    u8 = c.reshape(-1).view(torch.uint8) if c.dim() else c.reshape(1).view(torch.uint8)
    return tx128_reference(u8.numpy(), str(t.dtype), t.shape)


def tensor_set(seed: int) -> list[torch.Tensor]:
    """Lengths around the 16-byte chunk, 0-dim counters, dtypes of a trainer, a transposed view, views at 4- and
    2-byte offsets (an int32 load needs 4: the latter is cloned), an empty tensor, a few larger ones."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    out: list[torch.Tensor] = [torch.tensor(float(seed + 1)), torch.tensor(7, dtype=torch.int64), torch.empty(0)]
    for n in (1, 3, 4, 5, 15, 16, 17, 63, 64, 65):
        out.append(torch.randn(n, generator=g))
    out.append(torch.randint(0, 255, (33,), generator=g, dtype=torch.uint8))
    out.append(torch.randn(9, 7, generator=g).to(torch.bfloat16))
    out.append(torch.randn(11, 3, generator=g, dtype=torch.float64))
    out.append(torch.randn(12, 40, generator=g).t())  # strided: hashed in logical order
    base = torch.randn(4100, generator=g)
    out.append(base[1:])  # 4 bytes past a 16-byte boundary: 4-byte loads
    out.append(base.view(torch.bfloat16)[1:2001])  # 2 bytes past: cloned before the kernel reads it
    for n in rng.integers(100, 3000, size=3):
        out.append(torch.randn(int(n), generator=g))
    return out


def check(label: str, got: list[str], tensors: list[torch.Tensor], want: list[str], bad: list[str]) -> int:
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            t = tensors[i]
            bad.append(f"{label}: tensor {i} ({t.dtype}, {tuple(t.shape)}): {a} != {b}")
    return len(got)


def main() -> int:
    compared = 0
    bad: list[str] = []
    cpu = torch.device("cpu")
    for seed in (0, 1):
        tensors = tensor_set(seed)
        want = [reference(t) for t in tensors]
        configs = ((16, 3), (128, 7), (1024, 2)) if seed == 0 else ((64, 1),)
        for block, programs in configs:
            for first, growth in (((1 << 30, 1 << 62), 1), ((1, 16), 2)):  # one group; many (1, 2, 4, ... tensors)
                b = dt.Tx128Batch(cpu, block=block, programs=programs, capacity=3, first_group=first, growth=growth)
                for t in tensors:
                    b.add(t)
                compared += check(f"table b{block} p{programs} g{first}x{growth}", b.finish(), tensors, want, bad)
        got = dc.tx128_cuda_many_per_tensor(tensors, block=configs[0][0], programs=configs[0][1])
        compared += check("per-tensor", got, tensors, want, bad)
        got = dc.tx128_cuda_many_two_launch(tensors, block=configs[0][0], programs=configs[0][1])
        compared += check("two-launch", got, tensors, want, bad)
        # the wide (int64) chunk arithmetic that only a tensor of 2^29 chunks turns on: forced, same values
        real = dt._group_table

        def wide(*args: Any, real: Any = real) -> Any:
            g = real(*args)
            return None if g is None else dataclasses.replace(g, wide=True)

        dt._group_table = wide  # type: ignore[assignment]
        try:
            b = dt.Tx128Batch(cpu, block=16, programs=3, capacity=len(tensors), first_group=(4, 256), growth=2)
            for t in tensors:
                b.add(t)
            compared += check("table wide", b.finish(), tensors, want, bad)
        finally:
            dt._group_table = real  # type: ignore[assignment]
    print(json.dumps({"compared": compared, "bad": bad}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
