"""`orch launch` as a pipeline (load -> verify -> fingerprint -> lock -> seal -> run packages -> ledger), its
sequential stop, calibrate and rehearse, and the host watched through a run. Imports isolation, lock, slurm and
init; never cli.
"""
