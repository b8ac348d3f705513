"""The probe inside one rank: hooks the optimizer's step, times each step from outside the trainer, and records
per step its digests, RNG, memory, learning rates, forbidden dtypes and the trainer's own numbers; the summary.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from protocol.fileio import regular_sha256
from protocol.host.clock import CLOCK_FUNCTIONS
from protocol.results import ObservedRecipe, ProbeSummary
from workers.rank.digest import combined_digest, digest_many
from workers.rank.probe_model import discover, named_tensors, save_checkpoint, warmup_steps
from workers.rank.rank_end import arm_watchdog
from workers.rank.scalars import TrainerNumbers
from workers.rank.watch import WatchLog, inspect_compiled_graphs, make_watch

# bound when the probe is imported, before any trainer code runs: a trainer that patches `time` cannot reach these
_perf_counter = time.perf_counter
_BOUND_CLOCKS = {name: getattr(time, name) for name in CLOCK_FUNCTIONS if hasattr(time, name)}


class ProbeStop(SystemExit):
    """Raised from the optimizer hook after the last step; only the probe's own wrapper catches it."""


class Probe:
    """One rank's probe: installed when the trainer imports torch, called by the optimizer's step post-hook."""

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
        # Unix times of this rank's start-up (process, probe, torch, installed, step0_end): run.json's `startup`
        self.startup: dict[str, float] = {}
        self.until_compiled: Any = None  # the prime (workers/rank/prime_stop.CacheGrowth): stops when compiling stops
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
        self.startup["torch"] = time.time()  # the trainer's import of torch has just ended
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
        # the two-part public form (accelerate clips with get_total_norm + clip_grads_with_norm_); clip_grad_norm_
        # calls the private _clip_grads_with_norm_, so one clipping is observed once
        two_part = getattr(torch.nn.utils, "clip_grads_with_norm_", None)
        if two_part is not None:

            @functools.wraps(two_part)
            def clip_grads_with_norm_(parameters: Any, max_norm: Any, total_norm: Any, *args: Any, **kw: Any) -> Any:
                self.max_norm = float(max_norm)  # observed only; the call is unchanged
                self.numbers.on_grad_norm(total_norm)
                return two_part(parameters, max_norm, total_norm, *args, **kw)

            torch.nn.utils.clip_grads_with_norm_ = clip_grads_with_norm_
        self.numbers.install_torch()
        self.numbers.install_logging()
        if self.watch_steps:
            self.watch = make_watch(self.log, lambda: self.watching)
            self.watch_note = inspect_compiled_graphs(self.log, lambda: self.watching, self._note_watch)
            if 0 in self.watch_steps:
                self._watch_on()
        self.startup["installed"] = time.time()

    def _note_watch(self, why: str) -> None:
        self.watch_note = why  # Dynamo was imported later and its compiled graphs cannot be inspected

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

    def _now(self) -> float:
        return _perf_counter()

    def _clock(self) -> float:
        self._sync()
        return self._now()

    def _stamped_clock(self, step: int, event: str) -> float:
        """The probe's clock read between two kernel-stamped lines (protocol.host.clock: the kernel's bracket of it);
        the device's queue drained before them, so the bracket holds the read alone."""
        self._sync()
        self._tick(step, f"pre_{event}")
        t = self._now()
        self._tick(step, event)
        return t

    def _start_clock(self) -> float:
        """A step starts: the probe's clock, bracketed by the kernel-stamped lines of the step's start."""
        return self._stamped_clock(self.step, "start")

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
        found = discover(optimizer, self.max_norm)
        self.root, self.param_names, self.recipe = found.root, found.param_names, found.recipe

    # -- what one boundary records --
    def named_tensors(self) -> dict[str, Any]:
        """param/<fqn> for every parameter of the trained module, optim/<fqn>/<key> for every state tensor."""
        return named_tensors(self.root, self.param_names, self.optimizer)

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
        k = self.step
        t_boundary = self._stamped_clock(k, "end")
        if k == 0:
            self.startup["step0_end"] = time.time()
        duration = t_boundary - self.t_end
        self._check_clocks(k)
        from torch.utils._python_dispatch import _disable_current_modes

        last = k == self.steps - 1
        with _disable_current_modes():  # the probe's own ops are not the trainer's
            self._record(optimizer, k, duration, t_boundary, last)
            # after the record: what its digests compiled belongs to this step; a prime's final digests are not taken
            # (its numbers are never compared)
            if self.until_compiled is not None and not self.until_compiled.grew(k) and k >= 1:
                self.applied_controls["prime_stop"] = (f"stopped after step {k}: it added nothing to the compile "
                                                       f"cache; steps that added: {self.until_compiled.steps_grown}")
                last = True
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
        if self.ckpt_dir is None:
            return None, None
        return save_checkpoint(self.named_tensors(), self.ckpt_dir, self.rank, self.world_size)

    def observed_recipe(self) -> dict[str, Any] | None:
        if self.recipe is None:
            return None
        return {**self.recipe, "warmup_steps": warmup_steps(self.lr0, self.recipe["lr"])}

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
            steps_sha256=regular_sha256(self.steps_path),
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
            startup=self.startup,
        )
        path = self.out / f"probe.rank{self.rank}.json"
        doc = summary.model_dump(mode="json", by_alias=True)
        path.with_suffix(".tmp").write_text(json.dumps(doc, indent=1, sort_keys=True))
        os.replace(path.with_suffix(".tmp"), path)

    def _stop(self) -> None:
        self.write_summary(complete=True)
        arm_watchdog()
        raise ProbeStop(0)
