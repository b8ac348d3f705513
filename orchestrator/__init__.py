"""The orch command line and the launch pipeline: parses, then hands a config to a fixed pipeline.

Nothing imports this package; it imports protocol, manifests and ledger, and runs workers as subprocesses.
"""
