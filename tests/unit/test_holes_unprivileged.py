"""Issue 49's hole tests as an unprivileged user. The suite runs as root on CI's machine, where a read-only folder is
no defence (root writes through it): what holds there is detection. As user nobody, a read-only folder refuses the
write. Both must hold, so the tests of each hole (a candidate shipping orch's `workers`, a planted link where orch
moves or chmods, every entry planted in the sealed compile cache, a FIFO at a step file, a checkpoint or a cache copy)
run again here as nobody, in namespace and in scan mode, with the same interpreter version and this environment's
packages. The socket tests run ns_init as nobody themselves (test_isolation_sockets.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
HOLES = [
    "tests/unit/test_trust_boundary.py",
    "tests/unit/test_blinding.py",
    "tests/unit/test_compile_cache.py::test_every_entry_planted_in_the_sealed_cache_is_named",
    "tests/unit/test_compile_cache.py::test_a_prime_that_leaves_a_link_or_a_fifo_fails_naming_it",
    "tests/unit/test_compile_cache.py::test_a_copy_written_after_orch_made_it_is_refused_before_the_package",
    "tests/unit/test_compile_cache.py::test_reading_a_package_copy_never_waits_on_a_fifo_or_follows_a_link",
]


def _as_nobody(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    setpriv = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
    return subprocess.run([*setpriv, "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _interpreter() -> str | None:
    """An interpreter of this one's version that nobody may run (this one may lie under a private home)."""
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for folder in ("/usr/bin", "/usr/local/bin", os.path.dirname(sys.executable)):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.stat(path).st_mode & 0o001:
            return path
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="the suite itself runs unprivileged here")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv")
def test_every_hole_test_passes_as_an_unprivileged_user() -> None:
    python = _interpreter()
    if python is None:
        pytest.skip(f"no python{sys.version_info.major}.{sys.version_info.minor} that user nobody may run")
    base = Path(tempfile.mkdtemp(prefix="orch-nobody-"))  # pytest's tmp_path may lie where nobody cannot write
    try:
        os.chown(base, NOBODY, NOBODY)
        site = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        env = {"HOME": str(base), "TMPDIR": str(base), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": os.pathsep.join([str(REPO), *site])}
        probe = _as_nobody([python, "-c", "import orchestrator.isolation.blinding, pydantic, pytest"], env, 120)
        if probe.returncode != 0:
            pytest.skip(f"user nobody cannot import orch and its packages here: {probe.stderr.strip()[-300:]}")
        done = _as_nobody([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-rs",
                           "--basetemp", str(base / "pt"), "--rootdir", str(REPO), *HOLES], env, 600)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    tail = done.stdout[-3000:] + done.stderr[-1000:]
    assert done.returncode == 0, tail
    passed = re.search(r"(\d+) passed", done.stdout)
    # 20 tests; the namespace-mode one skips where the kernel gives nobody no user namespace
    assert passed is not None and int(passed.group(1)) >= 19, tail
