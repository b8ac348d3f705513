"""Sealed worker entry points, one `python -m workers.KIND` module each (checks, train, prime, replay, reload, score,
node, arg_fields, and the rank's own entry, probe) beside what they share (common, torchrun, clock, quiet_host,
rank_failure, trainer_path). rank/ is what runs inside every trainer rank; rehearsal/ the rehearsal's helpers.

Workers import torch; the CPU side (orch) runs them only as subprocesses, never imports them. The entry points import
rank/; rank/ and rehearsal/ import nothing else of workers.
"""
