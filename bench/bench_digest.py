"""Digest throughput: the probe's digest path (workers.rank.digest.digest_many) against torch.sum over the same bytes on
a 7B shard set and on r3-mini's, the former batched path and the kernel alone beside it, the single-tensor kernel,
and the CPU digest against hashlib SHA256. Prints tables, writes JSON (--out). CUDA figures need a GPU.
--host-only (no GPU): the probe path's host work alone, the former code beside the current (BENCH_DIGEST_ARGS=...)."""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from workers.rank.digest import combined_digest, digest_cpu, digest_many
from workers.rank.tx128 import tensor_header, tx128_lanes_reference, tx128_reference

REPO = Path(__file__).resolve().parents[1]
# Qwen2-7B (the language model of BAGEL-7B): hidden, intermediate, layers, kv width, vocabulary
QWEN2_7B = {"hidden": 3584, "intermediate": 18944, "layers": 28, "kv": 512, "vocab": 152064}


def cpu_figures(mib: int, reps: int) -> dict[str, float]:
    """Bytes per second of digest_cpu and of bare hashlib.sha256 over the same buffer, one core."""
    torch.set_num_threads(1)
    t = torch.randint(0, 2**31 - 1, (mib * 2**20 // 4,), dtype=torch.int32)
    buf = memoryview(t.numpy()).cast("B")
    nbytes = t.numel() * 4

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return nbytes / statistics.median(times)

    hl = best(lambda: hashlib.sha256(buf).digest())
    ours = best(lambda: digest_cpu(t))
    small = np.frombuffer(buf[: 16 * 2**20], dtype=np.uint8)
    t0 = time.perf_counter()
    tx128_lanes_reference(small)
    ref = small.size / (time.perf_counter() - t0)
    return {"bytes": nbytes, "hashlib_sha256_Bps": hl, "digest_cpu_Bps": ours, "ratio": ours / hl,
            "numpy_tx128_reference_Bps": ref}  # fmt: skip


def time_cuda(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of fn between two CUDA events (after one warm-up call): host time the device waits on counts."""
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    fn()  # warm-up (compilation, cached launch tables)
    torch.cuda.synchronize()
    for s, e in zip(start, end, strict=True):
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) / 1e3 for s, e in zip(start, end, strict=True))


def single_tensor_figures(gib: float, reps: int) -> dict[str, object]:
    """The single-tensor kernel (tx128_partials, not the probe's path) over one large tensor: a configuration sweep."""
    from workers.rank.digest_triton_compare import tx128_partials

    n = int(gib * 2**30) // 4
    x = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    nbytes = n * 4
    sum_s = time_cuda(lambda: x.sum(), reps)
    words = x.view(torch.int32)
    configs = []
    for block in (512, 1024, 2048):
        for pps in (4, 8, 16):
            s = time_cuda(lambda b=block, p=pps: tx128_partials(words, block=b, programs_per_sm=p), reps)  # type: ignore[misc]
            configs.append({"block": block, "programs_per_sm": pps, "num_warps": 8, "Bps": nbytes / s})
    best = max(configs, key=lambda c: float(c["Bps"]))
    default = next(c for c in configs if c["block"] == 1024 and c["programs_per_sm"] == 8)
    return {"kernel": "tx128_partials (single tensor)", "bytes": nbytes, "torch_sum_Bps": nbytes / sum_s,
            "default": default, "default_fraction_of_sum": float(default["Bps"]) * sum_s / nbytes,
            "best": best, "best_fraction_of_sum": float(best["Bps"]) * sum_s / nbytes, "configs": configs}  # fmt: skip


def shard_7b(ranks: int, counters: int, dims: dict[str, int], device: str = "cuda", fill: bool = True
             ) -> dict[str, torch.Tensor]:  # fmt: skip
    """One rank's parameters and AdamW states of a Qwen2-7B-shaped model under FSDP2 (dim-0 shards of `ranks`),
    float32, named as the probe names them; `counters` 0-dim step counters on the device (fused/capturable Adam).
    fill=False leaves the memory untouched (the host-only figures read no bytes)."""
    h, inter, kv, vocab = dims["hidden"], dims["intermediate"], dims["kv"], dims["vocab"]
    layer = [("self_attn.q_proj.weight", (h, h)), ("self_attn.q_proj.bias", (h,)), ("self_attn.k_proj.weight", (kv, h)),
             ("self_attn.k_proj.bias", (kv,)), ("self_attn.v_proj.weight", (kv, h)), ("self_attn.v_proj.bias", (kv,)),
             ("self_attn.o_proj.weight", (h, h)), ("mlp.gate_proj.weight", (inter, h)),
             ("mlp.up_proj.weight", (inter, h)), ("mlp.down_proj.weight", (h, inter)),
             ("input_layernorm.weight", (h,)), ("post_attention_layernorm.weight", (h,))]  # fmt: skip
    shapes = [("model.embed_tokens.weight", (vocab, h))]
    shapes += [(f"model.layers.{i}.{n}", s) for i in range(dims["layers"]) for n, s in layer]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    g = torch.Generator(device=device).manual_seed(0)
    params: dict[str, torch.Tensor] = {}
    optim: dict[str, torch.Tensor] = {}
    for name, shape in shapes:
        local = (math.ceil(shape[0] / ranks), *shape[1:])  # rank 0's shard
        params[f"param/{name}"] = torch.empty(local, device=device)
        for key in ("exp_avg", "exp_avg_sq"):
            optim[f"optim/{name}/{key}"] = torch.empty(local, device=device)
        if fill:
            for t in (params[f"param/{name}"], optim[f"optim/{name}/exp_avg"], optim[f"optim/{name}/exp_avg_sq"]):
                t.uniform_(generator=g)
    for i, (name, _) in enumerate(shapes[:counters]):
        optim[f"optim/{name}/step"] = torch.tensor(float(i + 1), device=device)
    return {**params, **optim}


def shard_r3mini(device: str = "cuda") -> dict[str, torch.Tensor]:
    """r3-mini on one GPU as its trainer builds it (frozen ViT), after one real AdamW step: what the probe digests."""
    sys.path.insert(0, str(REPO / "examples" / "r3_mini"))
    from train.online_rl import ModelArguments, TrainingArguments, build_model

    targs = TrainingArguments()
    model = build_model(ModelArguments(), targs, 0)
    if targs.freeze_vit:
        for p in model.vit_model.parameters():
            p.requires_grad = False
    model.to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=targs.lr, betas=(targs.beta1, targs.beta2))
    sum(p.float().square().sum() for p in trainable).backward()  # type: ignore[union-attr]
    opt.step()
    names = {id(p): n for n, p in model.named_parameters()}
    out = {f"param/{n}": p for n, p in model.named_parameters()}
    for p in trainable:
        for key, value in opt.state[p].items():
            if isinstance(value, torch.Tensor):
                out[f"optim/{names[id(p)]}/{key}"] = value
    return out


def progress(what: str) -> None:
    print(f"[bench-digest {time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def shard_figures(label: str, named: dict[str, torch.Tensor], reps: int, sweep: bool) -> dict[str, Any]:
    """The probe's call (digest_many) against torch.sum over the same device bytes concatenated, in one process."""
    from workers.rank.digest_triton import Tx128Batch, tx128_cuda_many
    from workers.rank.digest_triton_compare import tx128_cuda_many_per_tensor
    from workers.rank.digest_triton_compare import tx128_cuda_many_two_launch as two_launch

    dev = [t for t in named.values() if t.is_cuda]
    nbytes = sum(t.nbytes for t in dev)
    flat = torch.cat([t.detach().reshape(-1).view(torch.uint8) for t in dev])
    flat = flat[: flat.numel() // 4 * 4].view(torch.float32)  # the same bytes, read as float32 by torch.sum
    digests = digest_many(named)
    per_tensor = tx128_cuda_many_per_tensor(dev)
    names = [k for k, t in named.items() if t.is_cuda]
    bad = [k for k, d in zip(names, per_tensor, strict=True) if digests[k] != d]
    old = two_launch(dev)
    if bad or old != per_tensor:
        shown = ", ".join(f"{k} ({named[k].nbytes} B, address mod 16 = {named[k].data_ptr() % 16})" for k in bad[:5])
        raise SystemExit(f"{label}: {len(bad)} probe-path digest(s) differ from the per-tensor path ({shown}); the "
                         f"two-launch path differs at {sum(a != b for a, b in zip(old, per_tensor, strict=True))}: "
                         "not timing")  # fmt: skip
    small = [(k, t) for k, t in named.items() if t.nbytes <= 1 << 22][:64]
    for k, t in small:  # the NumPy reference over the small ones (it reads 0.2 GB/s)
        c = t.detach().cpu().contiguous()
        if t.is_cuda and digests[k] != tx128_reference(c.view(torch.uint8).numpy(), str(t.dtype), t.shape):
            raise SystemExit(f"{label}: {k} differs from the NumPy reference: not timing")

    def kernel_only(block: int | None = None, programs: int | None = None, maxnreg: int | None = -1) -> list[str]:
        b = Tx128Batch(dev[0].device, block=block, programs=programs, capacity=len(dev), first_group=(1 << 30, 1 << 62),
                       maxnreg=maxnreg)  # fmt: skip
        for t in dev:
            b.add(t)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(5_000_000)  # the device waits (~2.5 ms) while the host enqueues: no host time in s..e
        s.record()
        b.launch()  # one launch over every tensor: the kernel's own time
        e.record()
        out = b.finish()
        kernel_times.append(s.elapsed_time(e) / 1e3)
        return out

    def kernel_s(**kw: Any) -> float:
        kernel_times.clear()
        if kernel_only(**kw) != per_tensor:
            raise SystemExit(f"{label}: the table kernel at {kw} differs from the per-tensor digests")
        for _ in range(reps):
            kernel_only(**kw)
        return statistics.median(kernel_times[1:])

    kernel_times: list[float] = []
    progress(f"{label}: {len(dev)} device tensors, {nbytes / 2**30:.2f} GiB: digests checked, timing")
    sum_s = time_cuda(lambda: flat.sum(), reps)
    probe_s = time_cuda(lambda: digest_many(named), reps)
    many_s = time_cuda(lambda: tx128_cuda_many(dev), reps)
    old_s = time_cuda(lambda: two_launch(dev), reps)
    kern_s = kernel_s()
    doc: dict[str, Any] = {
        "set": label, "tensors": len(named), "device_tensors": len(dev), "bytes": nbytes,
        "torch_sum_s": sum_s, "torch_sum_Bps": nbytes / sum_s,
        "probe_path": "workers.rank.digest.digest_many (Tx128Batch: table kernel per launch group, one host copy)",
        "probe_path_s": probe_s, "probe_path_Bps": nbytes / probe_s, "probe_path_fraction_of_sum": sum_s / probe_s,
        "tx128_cuda_many_s": many_s, "tx128_cuda_many_fraction_of_sum": sum_s / many_s,
        "two_launch_s": old_s, "two_launch_fraction_of_sum": sum_s / old_s,
        "kernel_only_s": kern_s, "kernel_only_fraction_of_sum": sum_s / kern_s,
        "host_s": probe_s - kern_s,  # what the probe's path spends beyond its kernels' device time
        "speedup_over_two_launch": old_s / probe_s,
    }  # fmt: skip
    if sweep:
        configs = []
        for block, pps, maxnreg in ((1024, 8, -1), (1024, 8, None), (1024, 4, -1), (1024, 16, -1), (512, 8, None),
                                    (512, 16, None), (2048, 4, None), (2048, 8, None)):  # fmt: skip
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            s = kernel_s(block=block, programs=sms * pps, maxnreg=maxnreg)
            configs.append({"block": block, "programs_per_sm": pps, "maxnreg": "default" if maxnreg == -1 else maxnreg,
                            "kernel_only_s": s, "fraction_of_sum": sum_s / s})  # fmt: skip
        doc["kernel_configs"] = configs
        groups = []  # the launch-group schedule of the host path (tx128_cuda_many, host work included)
        for first, growth in (((32, 64 << 20), 2), ((32, 64 << 20), 4), ((8, 16 << 20), 2), ((1 << 30, 1 << 62), 1)):
            s = time_cuda(lambda f=first, g=growth: tx128_cuda_many(dev, first_group=f, growth=g), reps)  # type: ignore[misc]
            groups.append({"first_group": list(first), "growth": growth, "s": s, "fraction_of_sum": sum_s / s})
        doc["group_schedules"] = groups
    return doc


def record_figures(named: dict[str, torch.Tensor], reps: int) -> dict[str, float]:
    """The probe's other work at a boundary for this set: RNG fingerprints, memory peaks, a digest step's record."""
    digests = digest_many(named)

    def rng() -> None:
        hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()
        h = hashlib.sha256()
        for state in torch.cuda.get_rng_state_all():
            h.update(state.numpy().tobytes())
        _ = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()

    def record() -> None:
        json.dumps({"digests": digests, "combined": combined_digest(digests), "step": 0}, sort_keys=True)

    def median(fn: Callable[[], None]) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return {"rng_and_peaks_s": median(rng), "digest_record_s": median(record)}


def projection(doc: dict[str, Any], params: float, ranks: int) -> dict[str, Any]:
    """A 7B shard's probe cost per step from the measured figures: the digest at the probe path's measured bandwidth
    over the shard's bytes (fp32 parameters and two AdamW states), and the steps long enough for the goals."""
    big = doc["sets"]["7b"]
    rec = doc["record_7b"]
    shard_bytes = params * 12 / ranks
    digest_s = shard_bytes / big["probe_path_Bps"]
    with_digests = digest_s + rec["digest_record_s"] + rec["rng_and_peaks_s"]
    without = rec["rng_and_peaks_s"]
    return {"params": params, "ranks": ranks, "shard_bytes": shard_bytes, "probe_path_Bps": big["probe_path_Bps"],
            "digest_s": digest_s, "probe_s_with_digests": with_digests, "probe_s_without_digests": without,
            "min_step_s_for_3pct_with_digests": with_digests / 0.03,
            "min_step_s_for_1pct_without_digests": without / 0.01}  # fmt: skip


def print_tables(doc: dict[str, Any]) -> None:
    cpu = doc["cpu"]
    print(f"{'CPU (one core)':52} {'GB/s':>10}")
    print(f"{'hashlib.sha256':52} {cpu['hashlib_sha256_Bps'] / 1e9:10.3f}")
    print(f"{'digest_cpu (sha256 of raw bytes)':52} {cpu['digest_cpu_Bps'] / 1e9:10.3f}")
    print(f"{'NumPy tx128 reference':52} {cpu['numpy_tx128_reference_Bps'] / 1e9:10.3f}")
    if "sets" not in doc:
        return
    print(f"\nGPU {doc['gpu']}: median of {doc['reps']}, CUDA events; fraction = torch.sum time / path time")
    head = f"{'set':8} {'tensors':>7} {'GiB':>7} {'path':34} {'ms':>9} {'GB/s':>8} {'x sum':>7}"
    print(head)
    print("-" * len(head))
    for label, s in doc["sets"].items():
        rows = [("torch.sum (same bytes, concatenated)", s["torch_sum_s"]),
                ("probe path: digest_many", s["probe_path_s"]), ("tx128_cuda_many", s["tx128_cuda_many_s"]),
                ("before: two-launch batched path", s["two_launch_s"]), ("table kernel alone (one launch)",
                                                                          s["kernel_only_s"])]  # fmt: skip
        for i, (name, sec) in enumerate(rows):
            lead = f"{label:8} {s['tensors']:7d} {s['bytes'] / 2**30:7.3f}" if i == 0 else " " * 24
            print(f"{lead} {name:34} {sec * 1e3:9.3f} {s['bytes'] / sec / 1e9:8.1f} {s['torch_sum_s'] / sec:7.3f}")
    for c in doc["sets"]["7b"].get("kernel_configs", []):
        print(f"  7b kernel alone: block {c['block']:5d}, {c['programs_per_sm']:2d} programs/SM, maxnreg "
              f"{c['maxnreg']!s:7}: {c['kernel_only_s'] * 1e3:8.3f} ms = {c['fraction_of_sum']:.3f} x sum")
    for c in doc["sets"]["7b"].get("group_schedules", []):
        sched = ("one launch after the walk" if c["growth"] == 1 else f"first group {c['first_group'][0]} tensors / "
                 f"{c['first_group'][1] >> 20} MiB, growth {c['growth']}")  # fmt: skip
        print(f"  7b tx128_cuda_many, {sched}: {c['s'] * 1e3:8.3f} ms = {c['fraction_of_sum']:.3f} x sum")
    st = doc["single_tensor"]
    print(f"single-tensor kernel tx128_partials (not the probe's path), {st['bytes'] / 2**30:.1f} GiB: default "
          f"{st['default_fraction_of_sum']:.3f} x sum, best {st['best_fraction_of_sum']:.3f} x sum "
          f"(block {st['best']['block']}, {st['best']['programs_per_sm']} programs/SM)")
    p = doc["projection_7b"]
    print(f"projection, {p['params'] / 1e9:.1f}B params on {p['ranks']} ranks ({p['shard_bytes'] / 2**30:.2f} GiB "
          f"per rank): digest {p['digest_s'] * 1e3:.2f} ms, probe with digests {p['probe_s_with_digests'] * 1e3:.2f} "
          f"ms (<= 3% of steps >= {p['min_step_s_for_3pct_with_digests']:.3f} s), without "
          f"{p['probe_s_without_digests'] * 1e3:.3f} ms (<= 1% of steps >= "
          f"{p['min_step_s_for_1pct_without_digests']:.3f} s)")


# -- --host-only: the probe path's host work (walk, header prep, finalisation) on CPU tensors, no kernel --


_BEFORE_HEADERS: dict[tuple[Any, ...], Any] = {}  # the former module-level (dtype, shape) -> header state


class _BeforeBatch:
    """Tx128Batch's host side as it was before the plan cache (commit 5c7a0ae), the kernel launch left out: the
    before figure of --host-only. Its walk, launch tables and finalisation are the former code line for line."""

    def __init__(self, device: torch.device, capacity: int) -> None:
        from workers.rank.digest_triton import _ANCHORS, _FIRST_GROUP, _GROUP_GROWTH, _SMS, _max_programs

        self.device, self.block = device, 1024
        if device not in _SMS:
            _SMS[device] = _max_programs(device, 8)
        self.programs = _SMS[device]
        if device not in _ANCHORS:
            a = torch.zeros(4, dtype=torch.int32, device=device)  # the process-wide anchor: launch tables cached
            _ANCHORS[device] = (a, a.view(torch.uint8))
        self.anchor, self.anchor8 = _ANCHORS[device]
        self.acc = torch.zeros((max(capacity, 1), 2), dtype=torch.int64, device=device)
        self.tensors: list[Any] = []
        self.keep: list[Any] = []
        self.pending: list[int] = []
        self.pending_bytes = 0
        self.group_start = 0
        self.limit = _FIRST_GROUP
        self.growth = _GROUP_GROWTH

    def add(self, t: Any) -> int:
        row = len(self.tensors)
        self.tensors.append(t)
        if not t.is_contiguous():
            t = t.contiguous()
            self.keep.append(t)
        p, n = t.data_ptr(), t.nbytes
        if p & 3 and n >= 16:
            t = t.clone()
            self.keep.append(t)
            p = t.data_ptr()
        self.pending += (p, n)
        self.pending_bytes += n
        if len(self.pending) >= 2 * self.limit[0] or self.pending_bytes >= self.limit[1]:
            self.launch()
        return row

    def launch(self) -> None:
        from workers.rank.digest_triton import _group_table

        if not self.pending:
            return
        key = (self.group_start, *self.pending)
        self.group_start = len(self.tensors)
        self.pending = []
        self.pending_bytes = 0
        self.limit = (self.limit[0] * self.growth, self.limit[1] * self.growth)
        _group_table(key, self.anchor.data_ptr(), self.block, self.programs, self.device)  # the kernel: left out

    def finish(self) -> list[str]:
        self.launch()
        states = []
        for t in self.tensors:
            key = (t.dtype, t.shape)
            h = _BEFORE_HEADERS.get(key)
            if h is None:
                header = tensor_header("tx128", str(t.dtype), tuple(t.shape), t.nbytes)
                h = _BEFORE_HEADERS[key] = hashlib.sha256(header)
            states.append(h.copy())
        self.copied = time.perf_counter()
        n = len(self.tensors)
        body = self.acc[:n].cpu().numpy().view(np.uint64).astype("<u8", copy=False).tobytes()
        self.keep = []
        view = memoryview(body)
        for i, h in enumerate(states):
            h.update(view[16 * i : 16 * i + 16])
        return ["tx128:" + h.hexdigest()[:32] for h in states]


def _before_digest_many(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, str], float, float]:
    """The former digest_many's walk over tensors taken as device tensors (CPU ones here), then _BeforeBatch."""
    out: dict[str, str] = {}
    batches: dict[int, Any] = {}
    rows: list[tuple[str, Any, int]] = []
    for name, t in tensors.items():
        to_local = getattr(t, "to_local", None)
        lt = to_local() if to_local is not None else t
        if True:  # was lt.is_cuda: every tensor here stands for a device tensor
            dev = lt.get_device()
            batch = batches.get(dev)
            if batch is None:
                batch = batches[dev] = _BeforeBatch(lt.device, capacity=len(tensors))
            rows.append((name, dev, batch.add(lt)))
    walked = time.perf_counter()
    done = {dev: batch.finish() for dev, batch in batches.items()}
    copied = next(iter(batches.values())).copied
    for name, dev, row in rows:
        out[name] = done[dev][row]
    return {k: out[k] for k in tensors}, walked, copied


def _after_digest_many(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, str], float, float]:
    """workers.rank.digest.digest_many's walk as it is now, over tensors taken as device tensors, into the real
    Tx128Batch with its kernel launch left out; finish() in its real parts (header states, host copy, finalize)."""
    from workers.rank.digest_triton import Tx128Batch, finalize_rows, header_states

    class HostOnly(Tx128Batch):
        def _launch(self, g: Any) -> None:
            pass  # no kernel: the lanes stay zero, the host's work is all that is timed

    batches: dict[int, tuple[Any, list[str]]] = {}
    for name, t in tensors.items():
        to_local = getattr(t, "to_local", None)
        if to_local is not None:
            t = to_local()
        if True:  # is t.is_cuda in digest_many
            dev = t.get_device()
            entry = batches.get(dev)
            if entry is None:
                entry = batches[dev] = (HostOnly(t.device, capacity=len(tensors)), [])
            entry[0].add(t)
            entry[1].append(name)
    walked = time.perf_counter()
    batch, names = next(iter(batches.values()))
    batch.launch()  # finish() in its parts
    states = header_states(batch.tensors)
    copied = time.perf_counter()
    return dict(zip(names, finalize_rows(states, batch.lanes()), strict=True)), walked, copied


def host_figures(ranks: int, counters: int, dims: dict[str, int], reps: int) -> dict[str, Any]:
    """Host seconds of the probe path's walk, prep (last launch, header states) and what follows the host copy,
    before and after, alternating in one process on the 7B shard set as unfilled CPU tensors; medians of reps."""
    named = shard_7b(ranks, counters, dims, device="cpu", fill=False)
    if _before_digest_many(named)[0] != _after_digest_many(named)[0]:
        raise SystemExit("host-only: the before and after paths give different digests: not timing")
    phases: dict[str, dict[str, list[float]]] = {k: {"walk": [], "prep": [], "after_copy": [], "total": []}
                                                 for k in ("before", "after")}  # fmt: skip
    gc.collect()
    gc.disable()  # a collection's pause is not the path's cost; preemption on a loaded host is (medians)
    for _ in range(reps):
        for label, fn in (("before", _before_digest_many), ("after", _after_digest_many)):
            t0 = time.perf_counter()
            _, walked, copied = fn(named)
            t1 = time.perf_counter()
            for k, v in (("walk", walked - t0), ("prep", copied - walked), ("after_copy", t1 - copied),
                         ("total", t1 - t0)):  # fmt: skip
                phases[label][k].append(v)
    gc.enable()
    doc: dict[str, Any] = {"tensors": len(named), "bytes": sum(t.nbytes for t in named.values()), "reps": reps}
    for label, ph in phases.items():
        doc[label] = {k: statistics.median(v) for k, v in ph.items()}
        doc[label + "_min"] = {k: min(v) for k, v in ph.items()}  # a loaded host preempts: the floor beside it
    return doc


def print_host(doc: dict[str, Any]) -> None:
    print(f"host-only: the probe path's host work on {doc['tensors']} tensors (7B shard set on CPU, no kernel), "
          f"median (and min) of {doc['reps']}, before and after alternating, ms")  # fmt: skip
    print(f"{'':12} {'walk':>9} {'prep':>9} {'after copy':>11} {'total':>9}")
    for label in ("before", "after", "before_min", "after_min"):
        d = doc[label]
        print(f"{label:12} {d['walk'] * 1e3:9.3f} {d['prep'] * 1e3:9.3f} {d['after_copy'] * 1e3:11.3f} "
              f"{d['total'] * 1e3:9.3f}")  # fmt: skip
    print("walk: digest_many's loop and Tx128Batch.add (launch tables included); prep: the last launch and the header "
          "states (the device still reads); after copy: the host copy and the finalisation")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".orch/bench/digest.json")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cpu-mib", type=int, default=64)
    ap.add_argument("--gib", type=float, default=4.5, help="the single-tensor kernel's tensor (>= 4 GiB)")
    ap.add_argument("--ranks", type=int, default=8, help="FSDP2 ranks of the 7B shard set")
    ap.add_argument("--layers", type=int, default=QWEN2_7B["layers"], help="decoder layers of the 7B shard set")
    ap.add_argument("--counters", type=int, default=4, help="0-dim step counters on the device in the 7B set")
    ap.add_argument("--project-params", type=float, default=7e9, help="parameters of the projected model")
    ap.add_argument("--host-only", action="store_true", help="only the host work of the probe path (no GPU needed)")
    args = ap.parse_args()
    if args.host_only:
        dims = {**QWEN2_7B, "layers": args.layers}
        host = host_figures(args.ranks, args.counters, dims, max(args.reps, 20))
        print_host(host)
        out = Path(args.out).with_name(Path(args.out).stem + "_host.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"schema": "orch.bench.digest_host/1", "python": platform.python_version(),
                                   "torch": torch.__version__, **host}, indent=1, sort_keys=True) + "\n")  # fmt: skip
        print(f"figures written to {out}")
        return 0
    doc: dict[str, Any] = {"schema": "orch.bench.digest/2", "python": platform.python_version(),
                           "torch": torch.__version__, "reps": args.reps,
                           "cpu": cpu_figures(args.cpu_mib, max(3, args.reps))}  # fmt: skip
    if torch.cuda.is_available():
        import triton

        t0 = time.perf_counter()
        doc["triton"] = triton.__version__
        doc["gpu"] = torch.cuda.get_device_name(0)
        doc["sets"] = {}
        progress("7b shard set")
        named = shard_7b(args.ranks, args.counters, {**QWEN2_7B, "layers": args.layers})
        doc["sets"]["7b"] = shard_figures("7b", named, args.reps, sweep=True)
        doc["record_7b"] = record_figures(named, args.reps)
        del named
        torch.cuda.empty_cache()
        progress("r3-mini shard set")
        try:
            mini = shard_r3mini()
        except ImportError as e:  # the trainer's imports (safetensors) are missing on this machine
            print(f"r3-mini set skipped: {e}")
        else:
            doc["sets"]["r3-mini"] = shard_figures("r3-mini", mini, args.reps, sweep=False)
            del mini
        progress("single-tensor kernel sweep")
        doc["single_tensor"] = single_tensor_figures(args.gib, args.reps)
        doc["projection_7b"] = projection(doc, args.project_params, args.ranks)
        doc["cuda_wall_s"] = time.perf_counter() - t0
    print_tables(doc)
    if "sets" not in doc:
        print("no CUDA device: CPU figures only")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"figures written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
