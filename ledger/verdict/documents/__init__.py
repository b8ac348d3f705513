"""The documents that print a run's decision: the audit document (orch.audit/2) and its blocks, the terminal report,
audit.md and the step-time plot, and `orch audit` itself, which writes and records them.
Imports ledger.verdict.decide, ledger.cost, ledger.probe_cost, ledger.render and protocol.
"""
