"""ledger/cost/salt.py: one random salt per ledger folder (mode 0600, created once) keys the host hash."""

from __future__ import annotations

import hashlib
import hmac
import re
import socket
import stat
from pathlib import Path

from ledger.cost.salt import SALT_FILE, host_hash, ledger_salt


def test_the_salt_is_created_once_private_and_then_read(tmp_path: Path) -> None:
    salt = ledger_salt(tmp_path / "ledger")
    path = tmp_path / "ledger" / SALT_FILE
    assert re.fullmatch(r"[0-9a-f]{64}", salt) and path.read_text() == salt + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ledger_salt(tmp_path / "ledger") == salt
    assert ledger_salt(tmp_path / "other") != salt


def test_a_salt_already_there_is_used_as_it_is(tmp_path: Path) -> None:
    (tmp_path / SALT_FILE).write_text("  my salt \n")
    assert ledger_salt(tmp_path) == "my salt"


def test_the_host_hash_is_the_hmac_of_the_host_name_keyed_by_the_salt(tmp_path: Path) -> None:
    name = socket.gethostname().encode()
    assert host_hash("k") == hmac.new(b"k", name, hashlib.sha256).hexdigest()
    (tmp_path / SALT_FILE).write_text("k\n")
    assert host_hash(tmp_path) == host_hash("k") != host_hash("k2")
    assert socket.gethostname() not in host_hash(tmp_path)
