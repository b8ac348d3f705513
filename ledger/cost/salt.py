"""The host salt of a ledger directory and the salted host hash: this host's name never leaves in clear.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import socket
from pathlib import Path

from protocol.home import resolve_home

SALT_FILE = "host.salt"


def ledger_salt(ledger_dir: Path) -> str:
    """The random salt of this ledger directory, created once with mode 0600."""
    path = Path(ledger_dir) / SALT_FILE
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()  # another process created it first
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return path.read_text().strip()


def host_hash(salt: str | Path | None = None) -> str:
    """HMAC-SHA256 of this host's name keyed by a salt (a string, or a ledger directory holding one).

    Without an argument the salt of the default home's ledger directory is used; the name never leaves clear.
    """
    if salt is None:
        salt = ledger_salt(resolve_home().ledger_dir)
    elif isinstance(salt, Path):
        salt = ledger_salt(salt)
    return hmac.new(salt.encode(), socket.gethostname().encode(), hashlib.sha256).hexdigest()
