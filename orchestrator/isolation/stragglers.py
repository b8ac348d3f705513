"""Ending what a package left running outside its process group (a daemon that started its own session).

Every process a package starts inherits `ORCH_PACKAGE_TOKEN`; after the package, any process that still carries
it is ended. Seen on upstream R3: wandb's service (`wandb-core`, `gpu_stats`) and a DataLoader worker
(`pt_data_worker`) outlived an interrupted train package, out of reach of the package's process group.
"""

from __future__ import annotations

import os
import secrets

import psutil

TOKEN_VAR = "ORCH_PACKAGE_TOKEN"


def new_token() -> str:
    return secrets.token_hex(16)


def _carries(proc: psutil.Process, token: str) -> bool:
    try:
        return proc.environ().get(TOKEN_VAR) == token
    except (psutil.Error, OSError):  # gone, or another user's process: never ours
        return False


def carries_token(pid: int, token: str) -> bool:
    """Whether process `pid` carries the package's token (False if it is gone or its environment cannot be read)."""
    try:
        return _carries(psutil.Process(pid), token)
    except psutil.Error:
        return False


def find_stragglers(token: str) -> list[psutil.Process]:
    me = os.getpid()
    return [p for p in psutil.process_iter() if p.pid != me and _carries(p, token)]


def end_stragglers(token: str, grace_s: float = 5.0) -> list[str]:
    """SIGTERM, then SIGKILL after `grace_s`, every process still carrying the token; returns their names."""
    procs = find_stragglers(token)
    names = []
    for p in procs:
        try:
            names.append(p.name())
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return sorted(names)
