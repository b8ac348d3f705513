"""The command lines: `orch` (orch.py) and `gpu-run` (gpu_run.py); each parses its options and calls one function
per command. The top room: it may import every other room of orchestrator, and nothing imports it.
"""
