"""The probe: runs an unmodified trainer inside a torchrun rank and records each optimizer step from outside.

Usage: python -m workers.probe --out DIR --steps 16 --digest-steps 0-13 --watch-steps 0-9 --ckpt-dir DIR -- SCRIPT ARGS
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.abc
import importlib.util
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from protocol.clock import CLOCK_FUNCTIONS
from protocol.hashing import sha256_file
from protocol.process import die_with_parent
from protocol.results import ObservedRecipe, ProbeSummary
from workers.common import RANK_FAILED
from workers.digest import combined_digest, digest_many
from workers.model_shape import layer_counts
from workers.scalars import TrainerNumbers
from workers.tx128 import local_tensor
from workers.watch import WatchLog, inspect_compiled_graphs, make_watch

# bound when the probe is imported, before any trainer code runs: a trainer that patches `time` cannot reach these
_perf_counter = time.perf_counter
_BOUND_CLOCKS = {name: getattr(time, name) for name in CLOCK_FUNCTIONS if hasattr(time, name)}

# the trainer's own cleanup after the stop may take this long before the rank exits anyway
STOP_GRACE_S = float(os.environ.get("ORCH_PROBE_STOP_GRACE_S", "20"))


_IMPLEMENTATION_FLAGS = ("params", "lr", "initial_lr", "foreach", "fused", "capturable", "differentiable")


def _param_group(group: dict[str, Any]) -> dict[str, Any]:
    """An optimizer group as the recipe fixes it: tensor count, elements, hyperparameters (repr, base lr)."""
    import torch

    def shown(v: Any) -> str | None:
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            return repr(float(v))
        if isinstance(v, (bool, int, float, str)) or v is None:
            return repr(v)
        if isinstance(v, (tuple, list)) and all(isinstance(x, (int, float)) for x in v):
            return repr(tuple(float(x) for x in v))
        return None

    hyper = {k: r for k, v in sorted(group.items()) if k not in _IMPLEMENTATION_FLAGS and (r := shown(v)) is not None}
    hyper["lr"] = repr(float(group.get("initial_lr", group["lr"])))
    return {"tensors": len(group["params"]), "numel": int(sum(p.numel() for p in group["params"])), "hyper": hyper}


class ProbeStop(SystemExit):
    """Raised from the optimizer hook after the last step; only the probe's own wrapper catches it."""


def parse_steps(text: str) -> set[int]:
    """'0-13' or '0-9,12' or '' / 'none' -> the set of step numbers."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part or part == "none":
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _is_module(obj: Any, module_type: type) -> bool:
    """By the object's real type: isinstance() reads `__class__`, which lazy proxies (weakref.proxy, openai's
    module client) compute, and computing it can raise or load a client."""
    return issubclass(type(obj), module_type)


class Probe:
    def __init__(
        self, out: Path, steps: int, digest_steps: set[int], watch_steps: set[int], ckpt_dir: Path | None,
        host_controls: frozenset[str] = frozenset(),
    ) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.out = out
        self.steps = steps
        self.digest_steps = digest_steps
        self.watch_steps = watch_steps
        self.ckpt_dir = ckpt_dir
        self.step = 0
        self.t_end = _perf_counter()  # step 0 is timed from here: it includes the trainer's init (warm-up)
        self.prev_boundary_s: float | None = None  # the whole last boundary, recorded with the next step
        self.optimizer: Any = None
        self.other_optimizer_steps = 0
        self.max_norm: float | None = None
        self.root: Any = None
        self.param_names: dict[int, str] = {}
        self.recipe: dict[str, Any] | None = None
        self.lr0: list[float] = []
        self.peaks: list[tuple[int | None, int | None]] = []
        self.log = WatchLog()  # what the watch saw in the current step
        self.watch_note: str | None = None  # why compiled graphs cannot be inspected, when they cannot
        self.watch: Any = None
        self.watching = False
        self.final_digests: dict[str, str] | None = None
        self.installed = False
        self.host_controls = host_controls
        self.applied_controls: dict[str, str] = {}
        self.numbers = TrainerNumbers(os.getcwd())  # the trainer's sources are the cwd (the sealed copy)
        self.clock_replaced: dict[str, int] = {}  # time.<name> the trainer replaced -> first step it was seen
        self.clock_sock: Any = None  # the train worker's step-clock socket
        out.mkdir(parents=True, exist_ok=True)
        self.steps_path = out / f"steps.rank{self.rank}.jsonl"
        self.steps_file = self.steps_path.open("w")

    # -- installation (right after the trainer imports torch) --
    def install(self) -> None:
        import functools

        import torch
        import torch.nn.utils
        import torch.nn.utils.clip_grad
        from torch.optim.optimizer import register_optimizer_step_post_hook

        if self.installed:
            return
        self.installed = True
        if "gc_at_boundaries" in self.host_controls:
            gc.disable()  # cyclic collection only at step boundaries, inside the probe's excluded time
            self.applied_controls["gc"] = "disabled within steps; full collection at each step boundary"
        register_optimizer_step_post_hook(self._on_step)
        original = torch.nn.utils.clip_grad_norm_

        @functools.wraps(original)
        def clip_grad_norm_(parameters: Any, max_norm: Any, *args: Any, **kwargs: Any) -> Any:
            self.max_norm = float(max_norm)  # observed only; the call is unchanged
            total = original(parameters, max_norm, *args, **kwargs)
            self.numbers.on_grad_norm(total)  # a reference: read at the boundary, no sync in the step
            return total

        torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
        torch.nn.utils.clip_grad.clip_grad_norm_ = clip_grad_norm_
        self.numbers.install_torch()
        self.numbers.install_logging()
        if self.watch_steps:
            self.watch = make_watch(self.log, lambda: self.watching)
            self.watch_note = inspect_compiled_graphs(self.log, lambda: self.watching)
            if 0 in self.watch_steps:
                self._watch_on()

    def _watch_on(self) -> None:
        if not self.watching:
            self.watch.__enter__()
            self.watching = True

    def _watch_off(self) -> None:
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if self.watching and _get_current_dispatch_mode() is self.watch:
            self.watch.__exit__(None, None, None)
        self.watching = False  # not on top (the trainer's own mode is): left in place but passive

    def _sync(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the step's queued device work belongs to the step

    def _clock(self) -> float:
        self._sync()
        return _perf_counter()

    def _start_clock(self) -> float:
        """A step starts: the probe's clock, then the kernel-stamped line (stamped before it wakes any reader)."""
        t = self._clock()
        self._tick(self.step, "start")
        return t

    def open_clock(self, name: str) -> None:
        """The train worker's step-clock socket (abstract name); a line goes to it at every step boundary."""
        import socket

        self.clock_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.clock_sock.connect("\0" + name)
        self.t_end = self._start_clock()

    def _tick(self, step: int, event: str) -> None:
        if self.clock_sock is not None:
            self.clock_sock.send(f"{self.rank} {step} {event}".encode())

    def _check_clocks(self, step: int) -> None:
        for name, bound in _BOUND_CLOCKS.items():
            if getattr(time, name, None) is not bound and name not in self.clock_replaced:
                self.clock_replaced[name] = step

    # -- discovery at the first boundary --
    def _discover(self, optimizer: Any) -> None:
        import torch

        opt_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance on deprecated torch objects warns
            modules = [o for o in gc.get_objects() if _is_module(o, torch.nn.Module)]
        inner: set[int] = set()
        for m in modules:
            inner.update(id(s) for s in m.modules() if s is not m)
        top = [m for m in modules if id(m) not in inner]

        def covered(m: Any) -> int:
            return sum(1 for p in m.parameters() if id(p) in opt_ids)

        roots = sorted((m for m in top if covered(m)), key=lambda m: (-covered(m), type(m).__name__))
        self.root = roots[0] if roots else None
        if self.root is not None:
            self.param_names = {id(p): n for n, p in self.root.named_parameters()}
        root_ids = set(self.param_names)
        frozen: list[str] = self._collapse(self.root, "") if self.root is not None else []
        frozen_n = sum(p.numel() for p in self.root.parameters() if not p.requires_grad) if self.root else 0
        trainable_n = sum(p.numel() for p in self.root.parameters() if p.requires_grad) if self.root else 0
        others = [m for m in top if m is not self.root and any(not p.requires_grad for p in m.parameters())]
        others.sort(key=lambda m: (type(m).__name__, -sum(p.numel() for p in m.parameters())))
        seen: dict[str, int] = {}
        for m in others:
            own = [p for p in m.parameters() if id(p) not in root_ids and not p.requires_grad]
            if not own:
                continue
            cls = type(m).__name__
            label = f"{cls}#{seen.get(cls, 0)}"
            seen[cls] = seen.get(cls, 0) + 1
            frozen.extend(label + ("" if n == "<all>" else f":{n}") for n in self._collapse(m, ""))
            frozen_n += sum(p.numel() for p in own)
        g0 = optimizer.param_groups[0]
        trainable: list[str] = self._collapse(self.root, "", frozen=False) if self.root is not None else []
        self.recipe = {
            "optimizer": type(optimizer).__name__,
            "lr": float(g0.get("initial_lr", g0["lr"])),
            "betas": [float(b) for b in g0.get("betas", (0.0, 0.0))],
            "eps": float(g0.get("eps", 0.0)),
            "weight_decay": float(g0.get("weight_decay", 0.0)),
            "max_grad_norm": self.max_norm,
            "frozen": frozen,
            "trainable_params": int(trainable_n),
            "frozen_params": int(frozen_n),
            "layers": layer_counts(self.param_names.values()),
            "trainable": trainable,
            "optimizer_params": int(sum(p.numel() for g in optimizer.param_groups for p in g["params"])),
            "param_groups": [_param_group(g) for g in optimizer.param_groups],
        }

    def _collapse(self, module: Any, prefix: str, frozen: bool = True) -> list[str]:
        """Names of frozen (or trainable) parameters, a module wholly so named once by its path ('<all>': all)."""
        params = list(module.parameters())
        # the trained module itself is never collapsed into '<all>' for trainable names: its parts are named
        if params and all(p.requires_grad != frozen for p in params) and (frozen or prefix):
            return [prefix.rstrip(".") or "<all>"]
        out = [prefix + n for n, p in module.named_parameters(recurse=False) if p.requires_grad != frozen]
        for name, child in module.named_children():
            out.extend(self._collapse(child, f"{prefix}{name}.", frozen))
        return out

    # -- what one boundary records --
    def named_tensors(self) -> dict[str, Any]:
        """param/<fqn> for every parameter of the trained module, optim/<fqn>/<key> for every state tensor."""
        import torch

        out: dict[str, Any] = {}
        if self.root is not None:
            for name, p in self.root.named_parameters():
                out[f"param/{name}"] = p
        for gi, group in enumerate(self.optimizer.param_groups):
            for pi, p in enumerate(group["params"]):
                fqn = self.param_names.get(id(p), f"<group{gi}.{pi}>")
                if fqn.startswith("<"):
                    out[f"param/{fqn}"] = p
                for key, value in self.optimizer.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor):
                        out[f"optim/{fqn}/{key}"] = value
        return out

    def _rng(self) -> dict[str, str | None]:
        import torch

        cpu = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()
        cuda = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            h = hashlib.sha256()
            for state in torch.cuda.get_rng_state_all():  # generator state lives on the host: no draw, no sync
                h.update(state.numpy().tobytes())
            cuda = h.hexdigest()
        return {"cpu": cpu, "cuda": cuda}

    def _peaks(self) -> tuple[int | None, int | None]:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())
        return None, None

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.optimizer is None:
            self.optimizer = optimizer
        elif optimizer is not self.optimizer:
            self.other_optimizer_steps += 1  # one training step = one step() of the first optimizer
            return
        t_boundary = self._clock()
        duration = t_boundary - self.t_end
        k = self.step
        self._tick(k, "end")
        self._check_clocks(k)
        from torch.utils._python_dispatch import _disable_current_modes

        last = k == self.steps - 1
        with _disable_current_modes():  # the probe's own ops are not the trainer's
            self._record(optimizer, k, duration, t_boundary, last)
        if last:
            if self.watching:
                self._watch_off()
            self._stop()
        if self.watch is not None:
            if (k + 1) in self.watch_steps:
                self._watch_on()
            else:
                self._watch_off()
        if "gc_at_boundaries" in self.host_controls:
            gc.collect()
            gc.freeze()  # survivors leave the collector's view: the next boundary scans only new objects
        self.step += 1
        self.t_end = self._start_clock()
        self.prev_boundary_s = self.t_end - t_boundary  # goes into the next step's record

    def _record(self, optimizer: Any, k: int, duration: float, t_boundary: float, last: bool) -> None:
        import torch

        if self.recipe is None:
            self._discover(optimizer)
        lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.lr0.append(lrs[0])
        rng = self._rng()
        peak_alloc, peak_res = self._peaks()
        self.peaks.append((peak_alloc, peak_res))
        digests = None
        digest_s = None
        if k in self.digest_steps or last:
            t_digest = _perf_counter()  # the host copy at its end syncs: device work is inside
            with torch.no_grad():
                digests = digest_many(self.named_tensors())
            digest_s = _perf_counter() - t_digest
            if last:
                self.final_digests = digests
            if k not in self.digest_steps:
                digests = None
        watched = self.watching
        seen, hops, uninspected = self.log.take()
        if watched and self.watch_note:
            uninspected.append(self.watch_note)
        forbidden = [{"op": op, "dtype": dt, "step": k} for op, dt in seen]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
        scalars = self.numbers.take()
        record = {
            "schema": "orch.step/2",
            "rank": self.rank,
            "world_size": self.world_size,
            "step": k,
            "duration_s": duration,
            "probe_s": self._clock() - t_boundary,
            "digest_s": digest_s,
            "prev_boundary_s": self.prev_boundary_s,
            "lr": lrs,
            "rng": rng,
            "peak_allocated": peak_alloc,
            "peak_reserved": peak_res,
            "digests": digests,
            "combined": combined_digest(digests) if digests is not None else None,
            "forbidden": forbidden,
            "watched": watched,
            "hops": hops,
            "uninspected": uninspected,
            "scalars": scalars,
        }
        self.steps_file.write(json.dumps(record, sort_keys=True) + "\n")
        self.steps_file.flush()

    # -- the stop after the last step --
    def _checkpoint(self) -> tuple[str | None, str | None]:
        import torch

        if self.ckpt_dir is None:
            return None, None
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        params: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        optim: dict[str, dict[str, Any]] = {}
        devices: dict[str, str] = {}
        for name, t in self.named_tensors().items():
            local = local_tensor(t)
            devices[name] = local.device.type
            kind, _, rest = name.partition("/")
            if kind == "param":
                params[rest] = local.to("cpu", copy=True)
                placements = getattr(t, "placements", None)
                placement = "replicate"
                if placements is not None:
                    placement = "shard0" if "Shard(dim=0)" in str(placements) else str(placements)
                meta[rest] = {"global_shape": list(t.shape), "placement": placement}
            else:
                fqn, _, key = rest.rpartition("/")
                optim.setdefault(fqn, {})[key] = local.to("cpu", copy=True)
        doc = {
            "schema": "orch.ckpt/1",
            "rank": self.rank,
            "world_size": self.world_size,
            "params": params,
            "param_meta": meta,
            "optim": optim,
            "devices": devices,
        }
        path = self.ckpt_dir / f"rank{self.rank}.pt"
        tmp = path.with_suffix(".pt.tmp")
        torch.save(doc, tmp)
        os.replace(tmp, path)
        return path.name, sha256_file(path)

    def observed_recipe(self) -> dict[str, Any] | None:
        if self.recipe is None:
            return None
        base = self.recipe["lr"]
        warm = next((i for i, lr in enumerate(self.lr0) if lr == base), None)
        return {**self.recipe, "warmup_steps": warm}

    def write_summary(self, complete: bool) -> None:
        compat = sys.modules.get("orch_torch_compat")  # the rehearsal's torch shim, when its folder is on the path
        if compat is not None and getattr(compat, "applied", None):
            self.applied_controls["torch_compat"] = "; ".join(f"{k}: {v}" for k, v in sorted(compat.applied.items()))
        ckpt_file, ckpt_sha = self._checkpoint() if complete else (None, None)
        self.steps_file.close()
        allocs = [a for a, _ in self.peaks if a is not None]
        reserved = [r for _, r in self.peaks if r is not None]
        recipe = self.observed_recipe()
        summary = ProbeSummary(
            rank=self.rank,
            world_size=self.world_size,
            complete=complete,
            steps=self.step + (1 if complete else 0),
            steps_file=self.steps_path.name,
            steps_sha256=sha256_file(self.steps_path),
            final_digests=self.final_digests or {},
            final_combined=combined_digest(self.final_digests) if self.final_digests else None,
            observed_recipe=None if recipe is None else ObservedRecipe.model_validate(recipe),
            peak_allocated=max(allocs) if allocs else None,
            peak_reserved=max(reserved) if reserved else None,
            checkpoint_file=ckpt_file,
            checkpoint_sha256=ckpt_sha,
            other_optimizer_steps=self.other_optimizer_steps,
            host_controls=self.applied_controls,
            watched_steps=sorted(s for s in self.watch_steps if s < self.steps),
            logged_calls=self.numbers.logged_calls,
            clock_replaced=dict(sorted(self.clock_replaced.items())),
        )
        path = self.out / f"probe.rank{self.rank}.json"
        doc = summary.model_dump(mode="json", by_alias=True)
        path.with_suffix(".tmp").write_text(json.dumps(doc, indent=1, sort_keys=True))
        os.replace(path.with_suffix(".tmp"), path)

    def _stop(self) -> None:
        self.write_summary(complete=True)
        _arm_watchdog()
        raise ProbeStop(0)


def _arm_watchdog() -> None:
    """If the trainer's cleanup (finally blocks, atexit, threads) hangs, the rank still ends."""

    def fire() -> None:
        time.sleep(STOP_GRACE_S)
        sys.stderr.write("probe: trainer cleanup exceeded the grace period; exiting\n")
        sys.stderr.flush()
        _end_children()
        os._exit(0)

    threading.Thread(target=fire, name="probe-watchdog", daemon=True).start()


def _end_children() -> None:
    """Terminate this rank's own descendants (e.g. a local reward server), nothing else."""
    import psutil

    kids = psutil.Process().children(recursive=True)
    for p in kids:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(kids, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then(module)` right after the trainer imports `name` (torch: the probe; wandb: its log hook), so a
    module is imported when the trainer says, never earlier."""

    def __init__(self, name: str, then: Any) -> None:
        self.name = name
        self.then = then

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module
        then = self.then

        def exec_module(module: Any) -> None:
            original(module)
            then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _destroy_process_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # a broken group must not keep the rank alive
        sys.stderr.write(f"probe: destroy_process_group failed: {exc}\n")


def _die_with_launcher() -> None:
    """torchrun starts each rank in its own session: without this a rank outlives a SIGKILLed launcher."""
    try:
        arm = die_with_parent(signal.SIGKILL, parent=os.getppid())
    except (OSError, AttributeError):  # no prctl: not Linux
        return
    arm()


def pin_cpus() -> str:
    """Pin this rank to its own block of the cores it may use (by LOCAL_RANK), so ranks never share a core."""
    cpus = sorted(os.sched_getaffinity(0))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    block = max(1, len(cpus) // max(1, local_world))
    mine = cpus[(local_rank * block) % len(cpus) :][:block]
    os.sched_setaffinity(0, mine)
    return ",".join(map(str, mine))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _die_with_launcher()
    if "--" not in argv:
        sys.stderr.write("probe: usage: python -m workers.probe [options] -- SCRIPT ARGS | -m MODULE ARGS\n")
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m workers.probe")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--digest-steps", default="0-13")
    ap.add_argument("--watch-steps", default="0-9")
    ap.add_argument("--ckpt-dir", type=Path, default=None)
    ap.add_argument("--host-controls", default="none", help="comma list: pin_cpus, gc_at_boundaries; or none")
    ap.add_argument("--clock-socket", default=None, help="abstract name of the train worker's step-clock socket")
    opts = ap.parse_args(argv[:cut])
    controls = frozenset() if opts.host_controls == "none" else frozenset(opts.host_controls.split(","))
    unknown = controls - {"pin_cpus", "gc_at_boundaries"}
    if unknown:
        sys.stderr.write(f"probe: unknown host controls {sorted(unknown)}\n")
        return 2
    target = argv[cut + 1 :]
    module = None
    if target[:1] == ["-m"]:
        module, target = target[1], target[2:]
    elif not target:
        sys.stderr.write("probe: no trainer given after --\n")
        return 2
    probe = Probe(
        opts.out, opts.steps, parse_steps(opts.digest_steps), parse_steps(opts.watch_steps), opts.ckpt_dir, controls
    )
    if "pin_cpus" in controls:
        probe.applied_controls["cpus"] = pin_cpus()  # before the trainer starts its threads
    if opts.clock_socket is not None:
        probe.open_clock(opts.clock_socket)
    if "torch" in sys.modules:
        probe.install()
    else:
        sys.meta_path.insert(0, _AfterImport("torch", lambda _module: probe.install()))
    if "wandb" in sys.modules:
        probe.numbers.install_wandb(sys.modules["wandb"])
    else:
        sys.meta_path.insert(0, _AfterImport("wandb", probe.numbers.install_wandb))
    code = 0
    try:
        if module is not None:
            sys.argv = [module, *target]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            script = target[0]
            sys.argv = [script, *target[1:]]
            sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` would
            runpy.run_path(script, run_name="__main__")
        code = 1
    except ProbeStop:
        code = 0
    except SystemExit as exc:
        code = 1 if exc.code in (0, None) else exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # the trainer failed: report it, still end this rank's children
        failed_at = time.time()
        traceback.print_exc()
        # the cause in one line, named by rank: what the package's failure note shows (workers.train)
        cause = traceback.format_exception_only(exc)[-1].strip().replace("\n", " ")
        sys.stderr.write(RANK_FAILED.format(rank=probe.rank, time=failed_at, cause=cause) + "\n")
        code = 1
    if code != 0 and probe.step < probe.steps:
        sys.stderr.write(f"probe: rank {probe.rank}: the trainer ended after {probe.step} of {probe.steps} steps\n")
        if not probe.steps_file.closed:
            probe.write_summary(complete=False)
    _arm_watchdog()
    _destroy_process_group()
    _end_children()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the trainer's atexit handlers and threads do not get to run after the stop


if __name__ == "__main__":
    sys.exit(main())
