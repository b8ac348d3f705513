"""The trainer's own import path, kept apart from orch's: package workers start with orch's root and what orch runs
with; the protocol's PYTHONPATH entries reach the trainer only, added by the probe after its own modules are in.
"""

from __future__ import annotations

TRAINER_PATH_VAR = "ORCH_TRAINER_PYTHONPATH"  # the PYTHONPATH the trainer and the commands orch runs for it see
SAFE_PATH_VAR = "PYTHONSAFEPATH"  # set for orch's interpreters (as -P): no cwd or script folder first on sys.path
