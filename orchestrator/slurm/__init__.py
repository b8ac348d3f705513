"""orch on a Slurm cluster: the allocation a run is in, the srun commands of its packages, and what sacct charged.
Imports no other room of orchestrator.
"""
