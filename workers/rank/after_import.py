"""A hook that runs right after a module is imported, by whoever imports it, never earlier: the probe installs itself
when the trainer imports torch, its wandb hook when the trainer imports wandb, and the watch's inspection of compiled
graphs when torch.compile first imports Dynamo (importing Dynamo at start-up would cost every rank about a second)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then(module)` right after the trainer imports `name` (torch: the probe; wandb: its log hook), so a
    module is imported when the trainer says, never earlier."""

    def __init__(self, name: str, then: Any) -> None:
        self.name = name
        self.then = then
        self.busy = False

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        # every spec asked for is wrapped: a library's availability check (transformers calls
        # importlib.util.find_spec("torch")) gets one that is never executed; the import that runs ends the finder
        if name != self.name or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module
        then = self.then

        def exec_module(module: Any) -> None:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            original(module)
            then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
