"""Where orch keeps its state: `--home`, else $ORCH_HOME, else ./.orch, with runs/, ledger/ and scratch/.

Shared by the launcher, the ledger and the audit so that every command finds the same files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

LEDGER_FILE = "ledger.arrows"


@dataclass(frozen=True)
class Home:
    root: Path

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def ledger_dir(self) -> Path:
        return self.root / "ledger"

    @property
    def ledger_path(self) -> Path:
        return self.ledger_dir / LEDGER_FILE

    @property
    def scratch(self) -> Path:
        return self.root / "scratch"

    def run_dir(self, run_id: str) -> Path:
        return self.runs / run_id


def resolve_home(home: Path | None = None) -> Home:
    """`home` if given, else $ORCH_HOME, else ./.orch (made absolute, not created)."""
    if home is None:
        env = os.environ.get("ORCH_HOME")
        home = Path(env) if env else Path(".orch")
    return Home(home.expanduser().resolve())
