"""Sealed worker entry points (checks, train, reload, score) and the probe injected into each trainer rank.

Workers import torch; the CPU side (orch) runs them only as subprocesses, never imports them.
"""
