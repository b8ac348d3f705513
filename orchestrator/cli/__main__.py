"""`python -m orchestrator.cli`: the `orch` command line, as the console script `orch` runs it."""

from __future__ import annotations

from orchestrator.cli.orch import main

main()
