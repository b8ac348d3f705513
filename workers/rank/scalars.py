"""The trainer's own numbers, captured by the probe from outside: scalar losses at backward(), clip_grad_norm_
results, and what the trainer logs through wandb.log, Python logging or a Hugging Face Trainer's log(); recorded bit
for bit per step window.

Only library entry points are hooked (torch.autograd.backward, torch.nn.utils.clip_grad_norm_, wandb's Run.log,
logging.Logger, transformers' CallbackHandler.on_log), so nothing depends on one trainer's names and a Trainer script
needs no callback of its own, whatever its report_to. Values are read at the step boundary (probe time).
"""

from __future__ import annotations

import logging
import os
import re
import struct
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

# numbers that differ between two launches of the same computation, or that are evaluation values (blinded)
_VOLATILE = re.compile(
    r"time|sec\b|secs|/s\b|per_s|speed|throughput|elapsed|duration|took|eta\b|\bms\b|mem|alloc|reserved|cache|"
    r"\bpid\b|port|date|clock|it/s",
    re.IGNORECASE,
)
_EVALUATION = re.compile(r"(^|[^a-z])(eval|evaluation|val|valid|validation|dev|test)([^a-z]|$)", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\d.])|\b(?:nan|inf)\b")
_LOG_METHODS = ("debug", "info", "warning", "error", "critical", "exception", "log")
_TEMPLATE_CHARS = 120


def number_code(value: Any) -> str | None:
    """A Python number as 'dtype:hex of its raw bytes' (float64 for floats), None for anything else."""
    if isinstance(value, bool):
        return f"bool:{int(value)}"
    if isinstance(value, int):
        return f"int:{value}"
    if isinstance(value, float):
        return "float64:" + struct.pack("<d", value).hex()
    return None


def text_numbers(message: str) -> tuple[str, list[str]]:
    """(template, codes): the message with every number replaced by '#', and the numbers it keeps, in order.

    A number whose label (the text since the previous number) names a time, a rate or memory is left out; the
    decimal text is kept as the trainer printed it ('text:' codes), which is what its log shows.
    """
    template_parts: list[str] = []
    codes: list[str] = []
    last = 0
    for m in _NUMBER.finditer(message):
        label = message[last : m.start()]
        template_parts.append(label)
        template_parts.append("#")
        if not _VOLATILE.search(label):
            codes.append("text:" + m.group(0))
        else:
            codes.append("")
        last = m.end()
    template_parts.append(message[last:])
    return "".join(template_parts)[:_TEMPLATE_CHARS], codes


def flatten(prefix: str, value: Any, out: dict[str, Any], depth: int = 0) -> None:
    """Numbers (and scalar tensors) of a logged mapping, by dotted key; volatile and evaluation keys left out."""
    if depth > 4:
        return
    if isinstance(value, Mapping):
        for key in sorted(value, key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            if _VOLATILE.search(str(key)) or _EVALUATION.search(str(key)):
                continue
            flatten(name, value[key], out, depth + 1)
        return
    if number_code(value) is not None or _is_scalar_tensor(value):
        out[prefix] = value


def _is_scalar_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1


class TrainerNumbers:
    """What one rank's trainer computes and logs in the current step window; `take()` empties it at a boundary."""

    def __init__(self, source_root: str) -> None:
        self.source_root = os.path.realpath(source_root) + os.sep
        self._items: list[tuple[str, Any]] = []
        self._counts: dict[str, int] = {}
        self._busy = threading.local()  # a log call made while capturing (wandb logs through logging) counts once
        self.logged_calls = 0  # logger / wandb calls with at least one number, over the whole run
        # logged numbers count from the first backward() on: the set-up's log lines (arguments, configuration,
        # paths) differ with an arm's switches and external configuration, and are not training numbers
        self.training = False
        self._ours: dict[str, bool] = {}  # call-site file -> under the trainer's sources (resolved once)

    def _index(self, kind: str) -> int:
        n = self._counts.get(kind, 0)
        self._counts[kind] = n + 1
        return n

    def add_tensor(self, kind: str, tensor: Any) -> None:
        """A scalar tensor the trainer computed (kept by reference: nothing runs on the device until the boundary)."""
        if _is_scalar_tensor(tensor):
            self.training = True
            self._items.append((f"{kind}[{self._index(kind)}]", tensor.detach()))

    def add_mapping(self, kind: str, data: Any) -> None:
        if not self.training:
            return
        flat: dict[str, Any] = {}
        flatten("", data, flat)
        if not flat:
            return
        i = self._index(kind)
        self.logged_calls += 1
        for key, value in flat.items():
            self._items.append((f"{kind}[{i}].{key}", value))

    def add_message(self, message: str) -> None:
        if not self.training or _EVALUATION.search(message):
            return
        template, codes = text_numbers(message)
        kept = [(j, c) for j, c in enumerate(codes) if c]
        if not kept:
            return
        kind = f"log {template}"
        i = self._index(kind)
        self.logged_calls += 1
        for j, code in kept:
            self._items.append((f"log[{i}] {template}#{j}", code))

    def take(self) -> dict[str, str]:
        """name -> 'dtype:hex' of every value of the window, read now (the probe's time), then a new window."""
        out: dict[str, str] = {}
        for name, value in self._items:
            out[name] = value if isinstance(value, str) else encode(value)
        self._items = []
        self._counts = {}
        return out

    # -- hooks --
    def install_torch(self) -> None:
        import functools

        import torch
        import torch.autograd

        original = torch.autograd.backward
        if getattr(original, "_orch_probe", False):
            return

        @functools.wraps(original)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(tensors, torch.Tensor):
                self.add_tensor("backward", tensors)
            elif isinstance(tensors, (list, tuple)) and len(tensors) == 1 and isinstance(tensors[0], torch.Tensor):
                self.add_tensor("backward", tensors[0])
            return original(tensors, *args, **kwargs)

        backward._orch_probe = True  # type: ignore[attr-defined]
        torch.autograd.backward = backward  # Tensor.backward() looks it up here at call time

    def on_grad_norm(self, total: Any) -> None:
        self.add_tensor("grad_norm", total)

    def install_logging(self) -> None:
        """Every Logger method records the trainer's own calls (call site under the sources), before level checks."""
        for method in _LOG_METHODS:
            original = getattr(logging.Logger, method)
            if getattr(original, "_orch_probe", False):
                continue
            setattr(logging.Logger, method, self._logged(original, method == "log"))

    def _logged(self, original: Callable[..., Any], with_level: bool) -> Callable[..., Any]:
        import functools

        numbers = self

        @functools.wraps(original)
        def method(logger: logging.Logger, *args: Any, **kwargs: Any) -> Any:
            if not getattr(numbers._busy, "on", False):
                numbers._busy.on = True
                try:
                    caller = sys._getframe(1).f_code.co_filename
                    ours = numbers._ours.get(caller)
                    if ours is None:
                        ours = numbers._ours[caller] = os.path.realpath(caller).startswith(numbers.source_root)
                    if ours:
                        numbers.record_log_call(args[1:] if with_level else args)
                except Exception:  # the trainer's log call must never fail because of the probe
                    pass
                finally:
                    numbers._busy.on = False
            return original(logger, *args, **kwargs)

        method._orch_probe = True  # type: ignore[attr-defined]
        return method

    def record_log_call(self, args: tuple[Any, ...]) -> None:
        if not args:
            return
        msg, rest = args[0], args[1:]
        mappings = [a for a in rest if isinstance(a, Mapping)]
        if isinstance(msg, Mapping):
            mappings.insert(0, msg)
        if mappings:
            words = re.sub(r"%[-#0 +]*\d*(?:\.\d+)?[a-zA-Z]", "", str(msg) if not isinstance(msg, Mapping) else "")
            label = ".".join(str(a) for a in rest if isinstance(a, str)) or words.strip(" :=,") or "dict"
            if _EVALUATION.search(label):  # an evaluation record: blinded, and not a training number
                return
            for mapping in mappings:
                self.add_mapping(f"log.{label}", mapping)
            return
        text = str(msg)
        if rest:
            try:
                text = text % rest
            except (TypeError, ValueError):
                text = " ".join([text, *map(str, rest)])
        self.add_message(text)

    def install_wandb(self, wandb: Any) -> None:
        """wandb.log and the Run.log it forwards to (wandb re-binds wandb.log at init): one capture per call."""
        import functools

        numbers = self

        def wrap(original: Callable[..., Any], bound: bool) -> Callable[..., Any]:
            @functools.wraps(original)
            def log(*args: Any, **kwargs: Any) -> Any:
                if getattr(numbers._busy, "on", False):  # wandb.log forwarding to Run.log: already counted
                    return original(*args, **kwargs)
                numbers._busy.on = True
                try:
                    positional = args[1:] if bound else args
                    data = kwargs.get("data", positional[0] if positional else None)
                    try:
                        if isinstance(data, Mapping):
                            numbers.add_mapping("wandb", data)
                    except Exception:  # the trainer's log call must never fail because of the probe
                        pass
                    return original(*args, **kwargs)
                finally:
                    numbers._busy.on = False

            log._orch_probe = True  # type: ignore[attr-defined]
            return log

        run_cls = getattr(getattr(getattr(wandb, "sdk", None), "wandb_run", None), "Run", None)
        if run_cls is not None and not getattr(run_cls.log, "_orch_probe", False):
            run_cls.log = wrap(run_cls.log, bound=True)
        if callable(getattr(wandb, "log", None)) and not getattr(wandb.log, "_orch_probe", False):
            wandb.log = wrap(wandb.log, bound=False)


    def install_transformers(self, callbacks: Any) -> None:
        """transformers.trainer_callback: every Trainer's log() (TRL's trainers included) hands its numbers to
        CallbackHandler.on_log, with or without reporting integrations; they are recorded as `log.trainer`."""
        import functools

        handler = getattr(callbacks, "CallbackHandler", None)
        if handler is None or getattr(handler.on_log, "_orch_probe", False):
            return
        original = handler.on_log
        numbers = self

        @functools.wraps(original)
        def on_log(*args: Any, **kwargs: Any) -> Any:
            logs = kwargs.get("logs", args[4] if len(args) > 4 else None)
            try:
                if isinstance(logs, Mapping):
                    numbers.add_mapping("log.trainer", logs)
            except Exception:  # the trainer's log call must never fail because of the probe
                pass
            return original(*args, **kwargs)

        on_log._orch_probe = True  # type: ignore[attr-defined]
        handler.on_log = on_log


def encode(value: Any) -> str:
    """Raw bytes of a scalar as 'dtype:hex' (a tensor's own dtype and bytes; never a cast)."""
    code = number_code(value)
    if code is not None:
        return code
    import torch

    from workers.rank.tx128 import local_tensor

    t = local_tensor(value).detach().reshape(-1)[:1].cpu().contiguous()
    raw = t.view(torch.uint8).numpy().tobytes()
    return f"{str(t.dtype).removeprefix('torch.')}:{raw.hex()}"
