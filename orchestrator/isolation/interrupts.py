"""SIGINT and SIGTERM to `orch launch` as Ctrl-C, without losing one.

The handler raises KeyboardInterrupt where the main thread happens to be. Raised inside an at-fork hook (logging
registers `_releaseLock` to run in the parent after every fork), the interrupt is printed as "Exception ignored" and
lost, and the launch would wait for its package to end on its own. So the handler also records the interrupt, and
the package's wait loop raises a recorded one (`check`); while a package's processes are being forked
(`deferred`), the handler only records it, for the wait loop to raise where it ends the package's group.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_state = {"pending": False, "deferred": 0}


def handler(signum: int, frame: FrameType | None) -> None:
    _state["pending"] = True
    if not _state["deferred"]:
        raise KeyboardInterrupt


def reset() -> None:
    """A new launch starts with no interrupt recorded."""
    _state["pending"] = False


def pending() -> bool:
    return bool(_state["pending"])


def check() -> None:
    """Raise KeyboardInterrupt if SIGINT or SIGTERM came and its KeyboardInterrupt was deferred or lost."""
    if _state["pending"]:
        raise KeyboardInterrupt


@contextmanager
def deferred() -> Iterator[None]:
    """Within it an interrupt is only recorded: for forking a package's processes (the caller then checks)."""
    _state["deferred"] += 1
    try:
        yield
    finally:
        _state["deferred"] -= 1
