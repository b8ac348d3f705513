"""The verdict of a run: its evidence loaded and checked, the owner's windows and their statistics, exactness,
the audit document and its renderings. Import the parts from their modules (a verdict's exit code:
ledger.verdict.decision.exit_code); this face imports nothing, so no module of the package runs through it.
"""
