"""The decision of a run: its evidence loaded and checked (evidence, integrity, the host watch, GPU busy), exactness,
the owner's windows, their statistics and noise, the calibration, the sequential stop and the verdict rule (decision).
Imports ledger.cost, protocol and itself; nothing of ledger.verdict.documents.
"""
