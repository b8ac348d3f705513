"""Issue 49, hole 1: the candidate's code never runs as orch. A sealed copy that ships orch's own package names, or a
third-party module orch's workers import, is refused at launch or never imported by orch's workers and probe; the
trainer still gets its own folders, its PYTHONPATH and its sitecustomize, as `python SCRIPT` would give them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.isolation.package_isolation import namespaces_work
from orchestrator.isolation.packages import ORCH_ROOT, package_env, run_package
from orchestrator.isolation.sealing import orch_packages, shadowing
from protocol.package import ChecksSpec

MARK = "import os, sys\nopen(os.environ['ORCH_TEST_MARK'], 'a').write(__name__ + ' ' + ' '.join(sys.argv) + '\\n')\n"


def _plant(root: Path) -> None:
    """What a candidate plants: orch's package name with the worker it would replace, and pydantic/psutil, which
    orch's workers and probe import."""
    for rel in ("workers/__init__.py", "workers/checks.py", "workers/probe.py", "pydantic/__init__.py",
                "psutil/__init__.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(MARK)


def _checks_spec(base: Path, sealed: Path, argv: list[str]) -> ChecksSpec:
    run_dir = base / "home" / "runs" / "r1"
    pkg_dir = run_dir / "packages" / "checks"
    pkg_dir.mkdir(parents=True)
    scratch = base / "home" / "scratch" / "r1"
    scratch.mkdir(parents=True)
    return ChecksSpec.model_validate({
        "run_id": "r1", "name": "checks", "kind": "checks", "arm": None, "package_dir": str(pkg_dir),
        "sealed_dir": str(sealed), "scratch_dir": str(scratch), "result_path": str(pkg_dir / "result.json"),
        "device": "cpu", "precision": "fp32", "prepare": [{"name": "trainer", "argv": argv}],
    })


@pytest.mark.parametrize("mode", [
    pytest.param("namespace", marks=pytest.mark.skipif(not namespaces_work(), reason="no namespaces here")),
    "scan"])
def test_a_worker_never_imports_what_the_sealed_copy_ships(tmp_path: Path, mode: str) -> None:
    """Before the fix `python -m workers.checks` ran with the sealed copy first on sys.path: the planted workers
    package ran instead of orch's (and a protocol's PYTHONPATH '.' put the planted pydantic before the real one)."""
    sealed = tmp_path / "sealed"
    sealed.mkdir()
    _plant(sealed)
    (sealed / "mylib.py").write_text("VALUE = 7\n")
    seen = tmp_path / "home" / "scratch" / "r1" / "seen.json"
    # the protocol's own command (a trainer's prepare step) still imports from its root, as it did before
    code = ("import json, os, sys, mylib; json.dump({'mylib': mylib.VALUE, 'path': os.environ['PYTHONPATH'], "
            "'safe': os.environ.get('PYTHONSAFEPATH')}, open(sys.argv[1], 'w'))")
    spec = _checks_spec(tmp_path, sealed, [sys.executable, "-c", code, str(seen)])
    mark = tmp_path / "home" / "scratch" / "r1" / "mark.txt"
    env = {**package_env(os.environ, {}, {"PYTHONPATH": "."}, {}, "r1"), "ORCH_TEST_MARK": str(mark)}
    (tmp_path / "shared").mkdir()  # scan mode lists a private folder: no other process on the host can touch it
    outcome = run_package(spec, env, 120, isolation=mode, shared=[str(tmp_path / "shared")])
    assert outcome.status == "ok", outcome.note
    assert not mark.exists(), mark.read_text()  # nothing the sealed copy shipped ran as orch
    found = json.loads(seen.read_text())
    assert found["mylib"] == 7 and found["safe"] is None
    assert found["path"].split(os.pathsep)[:2] == [str(ORCH_ROOT), "."]  # the trainer's PYTHONPATH, as declared


def test_a_rank_imports_orchs_probe_then_gives_the_trainer_its_own_path(tmp_path: Path) -> None:
    """A rank as workers/torchrun.py starts it: the planted workers and psutil are never imported; the trainer
    (python -m MODULE) sees its cwd first, then the protocol's PYTHONPATH, and the protocol's sitecustomize ran."""
    sealed = tmp_path / "sealed"
    (sealed / "lib").mkdir(parents=True)
    _plant(sealed)
    (sealed / "lib" / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = '1'\n")
    (sealed / "lib" / "helper.py").write_text("X = 3\n")
    (sealed / "trainer_mod.py").write_text(
        "import json, os, sys, helper, psutil, workers\n"
        "json.dump({'psutil': psutil.__file__, 'workers': workers.__file__, 'first': sys.path[0], "
        "'helper': helper.X, 'site': os.environ.get('SITE_RAN'), 'pythonpath': os.environ['PYTHONPATH'], "
        "'safe': os.environ.get('PYTHONSAFEPATH')}, open(os.environ['ORCH_TEST_OUT'], 'w'))\n")
    mark, out = tmp_path / "mark.txt", tmp_path / "out.json"
    env = {**package_env(os.environ, {}, {"PYTHONPATH": "lib"}, {}, "r1"), "ORCH_TEST_MARK": str(mark),
           "ORCH_TEST_OUT": str(out)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m", "workers.probe",
           "--out", str(tmp_path / "pkg"), "--steps", "1", "--digest-steps", "none", "--watch-steps", "none", "--",
           "-m", "trainer_mod"]
    (tmp_path / "pkg").mkdir()
    done = subprocess.run(cmd, cwd=sealed, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert out.is_file(), done.stderr[-3000:]
    assert not mark.exists(), mark.read_text()
    found = json.loads(out.read_text())
    assert Path(found["workers"]).is_relative_to(ORCH_ROOT) and "site-packages" in found["psutil"]
    assert found["first"] == str(sealed) and found["helper"] == 3 and found["site"] == "1"
    assert found["pythonpath"].split(os.pathsep)[:2] == [str(ORCH_ROOT), "lib"] and found["safe"] is None


def test_shadowing_names_orchs_packages_at_the_root_and_on_the_declared_path(tmp_path: Path) -> None:
    assert set(orch_packages()) == {"ledger", "manifests", "orchestrator", "protocol", "workers"}
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "__init__.py").write_text("")
    (tmp_path / "manifests").mkdir()  # a folder of JSON files, no package: Python still imports orch's
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "protocol.py").write_text("")
    (tmp_path / "src" / "protocols.py").write_text("")  # another name: allowed
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ledger").mkdir()  # not importable from the trainer's path: allowed
    assert shadowing(tmp_path, "src") == ["workers/", "src/protocol.py"]
    assert shadowing(tmp_path, "") == ["workers/"]


def test_workers_hash_package_files_without_following_or_waiting(tmp_path: Path) -> None:
    """Issue 49: the probe hashed its steps file, and the train, reload and score workers their checkpoints, by path;
    a FIFO the trainer left there blocked the rank until the package's timeout and a link was followed. They now hash
    through regular_sha256: same digest as sha256_file for a regular file, refused at once for the others."""
    import threading

    from protocol.fileio import NotRegularError, regular_sha256
    from protocol.hashing import sha256_file

    plain = tmp_path / "rank0.pt"
    plain.write_bytes(os.urandom(3 << 20))
    assert regular_sha256(plain) == sha256_file(plain)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(plain)
    seen: dict[str, str] = {}

    def attempt(name: str) -> None:
        try:
            regular_sha256(tmp_path / name)
        except NotRegularError as err:
            seen[name] = err.strerror

    for name in ("fifo", "link"):
        worker = threading.Thread(target=attempt, args=(name,), daemon=True)
        worker.start()
        worker.join(20)
    assert seen == {"fifo": "a FIFO, not a regular file", "link": "a link, not a regular file"}


def test_the_train_worker_never_waits_on_a_fifo_at_a_step_file(tmp_path: Path) -> None:
    """Issue 49: the trainer's process can replace its step file with a FIFO or its summary with a link to /dev/zero;
    the train worker (orch's code in the package) read them and hung until the package's timeout. Its reads of both
    now go through read_regular: the rank fails at once, naming the file (the summary is read first)."""
    import threading

    from protocol.package import TrainSpec
    from workers.common import WorkerFailed
    from workers.train import _read_rank

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    os.mkfifo(pkg / "steps.rank0.jsonl")
    (pkg / "probe.rank0.json").symlink_to("/dev/zero")
    spec = TrainSpec.model_construct(package_dir=str(pkg), steps=2)
    seen: list[str] = []

    def read() -> None:
        try:
            _read_rank(spec, 0)
        except WorkerFailed as err:
            seen.append(str(err))

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(20)
    assert seen == ["rank 0: probe.rank0.json: a link, not a regular file"]
