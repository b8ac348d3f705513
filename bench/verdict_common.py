"""What bench_verdict.py and verdict_real.py both use, so that neither imports the other: the published form of a
command-line argument.
"""

from __future__ import annotations

import os


def no_paths(arg: str) -> str:
    """An argument as published: an absolute path (this machine's) shortened to its file name."""
    return os.path.basename(arg) if os.path.isabs(arg) else arg
