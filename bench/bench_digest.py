"""Digest throughput: tx128 (Triton) against the HBM read bandwidth of torch.sum on the same GPU, a probe step's
300 tensors batched vs per-tensor, and the CPU digest against hashlib SHA256. Prints a table, writes JSON (--out)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from workers.digest import digest_cpu
from workers.tx128 import tx128_lanes_reference


def cpu_figures(mib: int, reps: int) -> dict[str, float]:
    """Bytes per second of digest_cpu and of bare hashlib.sha256 over the same buffer, one core."""
    torch.set_num_threads(1)
    t = torch.randint(0, 2**31 - 1, (mib * 2**20 // 4,), dtype=torch.int32)
    buf = memoryview(t.numpy()).cast("B")
    nbytes = t.numel() * 4

    def best(fn: object) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            times.append(time.perf_counter() - t0)
        return nbytes / statistics.median(times)

    hl = best(lambda: hashlib.sha256(buf).digest())
    ours = best(lambda: digest_cpu(t))
    small = np.frombuffer(buf[: 64 * 2**20], dtype=np.uint8)
    t0 = time.perf_counter()
    tx128_lanes_reference(small)
    ref = small.size / (time.perf_counter() - t0)
    return {"bytes": nbytes, "hashlib_sha256_Bps": hl, "digest_cpu_Bps": ours, "ratio": ours / hl,
            "numpy_tx128_reference_Bps": ref}  # fmt: skip


def _time_cuda(fn: object, reps: int) -> float:
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    fn()  # type: ignore[operator]  # warm-up (compilation, caches)
    torch.cuda.synchronize()
    for s, e in zip(start, end, strict=True):
        s.record()
        fn()  # type: ignore[operator]
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) / 1e3 for s, e in zip(start, end, strict=True))


def cuda_figures(gib: float, reps: int) -> dict[str, object]:
    from workers.digest_triton import tx128_cuda_many, tx128_partials

    n = int(gib * 2**30) // 4
    x = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    nbytes = n * 4
    sum_s = _time_cuda(lambda: x.sum(), reps)
    words = x.view(torch.int32)
    configs = []
    for block in (512, 1024, 2048, 4096):
        for pps in (2, 4, 8, 16):
            for warps in (4, 8):
                s = _time_cuda(lambda b=block, p=pps, w=warps: tx128_partials(  # type: ignore[misc]
                    words, block=b, programs_per_sm=p, num_warps=w), reps)  # fmt: skip
                configs.append({"block": block, "programs_per_sm": pps, "num_warps": warps, "Bps": nbytes / s})
    best = max(configs, key=lambda c: float(c["Bps"]))  # type: ignore[arg-type]
    os.environ["ORCH_TX128_BLOCK"] = str(best["block"])
    e2e = _time_cuda(lambda: tx128_cuda_many([x]), reps)  # includes the host copy of partials and finalisation
    return {
        "gpu": torch.cuda.get_device_name(0), "bytes": nbytes, "hbm_read_sum_Bps": nbytes / sum_s,
        "tx128_best": best, "tx128_best_fraction_of_sum": float(best["Bps"]) / (nbytes / sum_s),  # type: ignore[arg-type]
        "tx128_end_to_end_Bps": nbytes / e2e, "configs": configs,
    }  # fmt: skip


def many_tensor_figures(n: int, reps: int) -> dict[str, object]:
    """One probe digest step's shape on r3-mini: n tensors (matrices 64 KiB..4 MiB, small vectors, 0-dim steps),
    the per-tensor launches against the batched path, end to end (host copy and finalisation included)."""
    from workers.digest_triton import tx128_cuda_many, tx128_cuda_many_per_tensor

    g = torch.Generator().manual_seed(0)
    n_vec, n_step = n // 5, n // 10
    sizes = [int(2 ** (16 + 6 * float(u))) // 4 for u in torch.rand(n - n_vec - n_step, generator=g)]  # log-uniform
    sizes += [int(v) for v in torch.randint(64, 4096, (n_vec,), generator=g)] + [1] * n_step
    tensors = [torch.empty(k, dtype=torch.float32, device="cuda").uniform_() for k in sizes]
    tensors[n - n_step :] = [t.reshape(()) for t in tensors[n - n_step :]]  # Adam's 0-dim step counters
    if tx128_cuda_many(tensors) != tx128_cuda_many_per_tensor(tensors):
        raise SystemExit("batched and per-tensor tx128 differ: not timing a wrong result")
    per_tensor_s = _time_cuda(lambda: tx128_cuda_many_per_tensor(tensors), reps)
    batched_s = _time_cuda(lambda: tx128_cuda_many(tensors), reps)
    nbytes = sum(t.numel() * 4 for t in tensors)
    return {"tensors": n, "bytes": nbytes, "per_tensor_median_s": per_tensor_s, "batched_median_s": batched_s,
            "speedup": per_tensor_s / batched_s, "batched_Bps": nbytes / batched_s}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".orch/bench/digest.json")
    ap.add_argument("--gib", type=float, default=4.5, help="GPU tensor size (>= 4 GiB for the HBM reference)")
    ap.add_argument("--cpu-mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--many", type=int, default=300, help="tensors in the many-tensor case (a probe digest step)")
    args = ap.parse_args()
    doc: dict[str, object] = {
        "schema": "orch.bench.digest/1", "python": platform.python_version(), "torch": torch.__version__,
        "cpu": cpu_figures(args.cpu_mib, max(3, args.reps // 2)),
    }  # fmt: skip
    cpu = doc["cpu"]
    assert isinstance(cpu, dict)
    print(f"{'measure':44} {'GB/s':>10}")
    print(f"{'CPU hashlib.sha256 (1 core)':44} {cpu['hashlib_sha256_Bps'] / 1e9:10.3f}")
    print(f"{'CPU digest_cpu (sha256 of raw bytes)':44} {cpu['digest_cpu_Bps'] / 1e9:10.3f}")
    print(f"{'CPU ratio digest_cpu / hashlib':44} {cpu['ratio']:10.3f}")
    print(f"{'CPU NumPy tx128 reference':44} {cpu['numpy_tx128_reference_Bps'] / 1e9:10.3f}")
    if torch.cuda.is_available():
        import triton

        doc["triton"] = triton.__version__
        gpu = cuda_figures(args.gib, args.reps)
        doc["cuda"] = gpu
        best = gpu["tx128_best"]
        assert isinstance(best, dict)
        print(f"{'GPU HBM read (torch.sum, ' + str(gpu['gpu']) + ')':44} {float(gpu['hbm_read_sum_Bps']) / 1e9:10.1f}")  # type: ignore[arg-type]
        label = f"GPU tx128 block={best['block']} pps={best['programs_per_sm']} warps={best['num_warps']}"
        print(f"{label:44} {float(best['Bps']) / 1e9:10.1f}")
        print(f"{'GPU tx128 / HBM read':44} {float(gpu['tx128_best_fraction_of_sum']):10.3f}")  # type: ignore[arg-type]
        print(f"{'GPU tx128 end to end (one tensor)':44} {float(gpu['tx128_end_to_end_Bps']) / 1e9:10.1f}")  # type: ignore[arg-type]
        many = many_tensor_figures(args.many, max(args.reps, 20))
        doc["cuda_many"] = many
        print(f"{'GPU many tensors: ' + str(many['tensors']) + ' tensors, MiB':44} {int(many['bytes']) / 2**20:10.1f}")  # type: ignore[call-overload]
        print(f"{'GPU many: per-tensor launches, median ms':44} {float(many['per_tensor_median_s']) * 1e3:10.3f}")  # type: ignore[arg-type]
        print(f"{'GPU many: batched (2 launches), median ms':44} {float(many['batched_median_s']) * 1e3:10.3f}")  # type: ignore[arg-type]
        print(f"{'GPU many: speedup per-tensor / batched':44} {float(many['speedup']):10.2f}")  # type: ignore[arg-type]
    else:
        print("no CUDA device: CPU figures only")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"figures written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
