"""Progress of a launch: a rich live table on a terminal, one plain line per event elsewhere.

Shows per package its status, step k/N (from the probe's rank-0 lines), elapsed seconds and GPU-seconds.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table


class Progress:
    def __init__(self, live: bool | None, say: Callable[[str], None]) -> None:
        self.console = Console(stderr=True)
        self.live_mode = self.console.is_terminal if live is None else live
        self.say = say
        self.rows: dict[str, dict[str, object]] = {}
        self._live: Live | None = None
        self._current: str | None = None

    def __enter__(self) -> Progress:
        if self.live_mode:
            self._live = Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(et, ev, tb)
            self._live = None

    def _table(self) -> Table:
        t = Table(title="orch launch", expand=False)
        for col in ("package", "status", "step", "elapsed s", "GPU-s"):
            t.add_column(col)
        for name, r in self.rows.items():
            t.add_row(name, str(r["status"]), str(r.get("step", "")), f"{float(r['elapsed']):.1f}",  # type: ignore[arg-type]
                      f"{float(r['gpu_s']):.1f}")  # type: ignore[arg-type]
        return t

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())

    def start(self, name: str, kind: str, steps: int | None) -> None:
        self._current = name
        self.rows[name] = {"status": "running", "elapsed": 0.0, "gpu_s": 0.0, "steps": steps,
                           "step": f"0/{steps}" if steps else ""}
        if self._live is None:
            self.say(f"{name}: started")
        self._refresh()

    def tick(self, elapsed: float, step: int, gpus: int) -> None:
        if self._current is None:
            return
        r = self.rows[self._current]
        steps = r.get("steps")
        before = r.get("step")
        r.update(elapsed=elapsed, gpu_s=elapsed * gpus)
        if steps:
            r["step"] = f"{step}/{steps}"
        if self._live is None and steps and r["step"] != before:
            self.say(f"{self._current}: step {r['step']} ({elapsed:.1f} s)")
        self._refresh()

    def finish(self, name: str, status: str, wall_s: float, gpu_s: float, note: str | None) -> None:
        r = self.rows[name]
        r.update(status=status, elapsed=wall_s, gpu_s=gpu_s)
        if r.get("steps") and status == "ok":
            r["step"] = f"{r['steps']}/{r['steps']}"
        if self._live is None:
            self.say(f"{name}: {status} in {wall_s:.1f} s" + (f" ({note})" if note else ""))
        elif note:
            self.console.print(f"{name}: {status} ({note})")
        self._refresh()
        self._current = None


def plain_say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
