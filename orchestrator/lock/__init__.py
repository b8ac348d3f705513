"""The shared-host GPU lock: one flock(2) file per GPU or CPU slot, the GPUs it sees, and who holds each one.
Imports no other room of orchestrator (the `gpu-run` command line lives in orchestrator/cli).
"""
