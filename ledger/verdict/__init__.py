"""The verdict of a run: its evidence loaded and checked, the owner's windows and their statistics, exactness,
the audit document and its renderings. Named in the docs: exit_code (a verdict's exit code), interval_doc,
replication_doc (the audit's interval and replication sections).
"""

from __future__ import annotations

from ledger.verdict.decision import exit_code, replication_doc
from ledger.verdict.interval_doc import interval_doc

__all__ = ["exit_code", "interval_doc", "replication_doc"]
