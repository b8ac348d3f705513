"""Host fingerprint: read without torch, the host only as a hash, and a changed host is named key by key."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from orchestrator.run.fingerprint import fingerprint_changes, host_fingerprint, last_run_fingerprint


def test_fingerprint_has_versions_and_no_clear_host_name(repo: Path) -> None:
    fp = host_fingerprint("ab" * 32)
    assert set(fp) >= {"gpu_model", "gpu_count", "driver", "cuda", "torch", "triton", "python", "host_hash"}
    assert socket.gethostname() not in json.dumps(fp)
    code = "import sys; from orchestrator.run.fingerprint import host_fingerprint; host_fingerprint('x'); " \
           "assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=repo, check=True)


def test_changed_host_is_named_key_by_key(tmp_path: Path) -> None:
    old = host_fingerprint("aa" * 32)
    for i, (started, gpu) in enumerate([("2026-01-01T00:00:00Z", "A100"), ("2026-02-01T00:00:00Z", "H100")]):
        run = tmp_path / f"r{i}"
        run.mkdir()
        (run / "run.json").write_text(json.dumps({"run_id": f"r{i}", "started": started,
                                                  "host": {**old, "gpu_model": gpu}}))
    previous = last_run_fingerprint(tmp_path)
    assert previous is not None and previous[0] == "r1"
    changes = fingerprint_changes(previous[1], {**old, "gpu_model": "H200", "host_hash": "bb" * 32})
    assert changes == ["gpu_model: H100 -> H200", f"host_hash: {'aa' * 32} -> {'bb' * 32}"]
    assert fingerprint_changes(old, dict(old)) == []
