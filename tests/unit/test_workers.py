"""The worker entry points as the package runner calls them: a spec file in, result.json out, strictly valid.

train -> reload on the tiny FSDP2 trainer (2 ranks, gloo), checks and score on small commands (r3-mini under the probe:
tests/e2e/test_launch.py reads the shared complete run's train-A and reload-A).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from workerutil import run_worker, train_and_reload, write_spec

from orchestrator.isolation.packages import PackageOutcome, run_package
from protocol.package import ChecksSpec, parse_spec
from protocol.results import ChecksResult, ScoreResult, StepRecord

REPO = Path(__file__).resolve().parents[2]


def test_train_then_reload_digests_equal(tmp_path: Path) -> None:
    t, r = train_and_reload(tmp_path)
    assert t.stopped_cleanly and t.world_size == 2 and t.steps == 16 and t.digest_steps == list(range(14))
    assert t.observed_recipe.warmup_steps == 3 and t.observed_recipe.max_grad_norm == 1.0
    assert [x.final_combined for x in t.ranks] == [x.combined for x in r.ranks]
    assert [x.final_digests for x in t.ranks] == [x.digests for x in r.ranks]
    assert [x.checkpoint_sha256 for x in t.ranks] == [x.checkpoint_sha256 for x in r.ranks]
    assert t.ranks[0].final_combined != t.ranks[1].final_combined  # each rank digests its own shard
    for rank in (0, 1):
        lines = (tmp_path / "train-A" / f"steps.rank{rank}.jsonl").read_text().splitlines()
        recs = [StepRecord.model_validate_json(x) for x in lines]
        assert [x.digests is not None for x in recs] == [s <= 13 for s in range(16)]
    assert psutil.Process().children(recursive=True) == []
    assert (tmp_path / "scratch" / "train-A.trainer.log").exists()


def test_train_fails_with_a_reason(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "train-A", "train", args=["--total-steps", "3"])
    proc = run_worker("train", spec, REPO / "tests" / "fixtures")
    assert proc.returncode == 1 and "train: torchrun exited" in proc.stderr
    assert not (tmp_path / "train-A" / "result.json").exists()


def _run_train_package(tmp: Path, extra_env: dict[str, str], on_tick: object = None) -> PackageOutcome:
    spec = parse_spec(write_spec(tmp, "train-A", "train").read_bytes())  # an orch.package/1 spec, read as /2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
           **extra_env}
    return run_package(spec, env, 240, on_tick=on_tick)  # type: ignore[arg-type]


def test_failed_rank_names_its_own_error_line_in_the_note(tmp_path: Path) -> None:
    outcome = _run_train_package(tmp_path, {"TINY_RAISE": "3:1"})
    assert outcome.status == "failed" and outcome.note is not None
    # rank 1 raised; rank 0 then failed on the broken collective: the note names rank 1's error, not torchrun's
    assert outcome.note == "exit 1: train: torchrun exited with 1: rank 1: ValueError: tiny fault at step 3 on rank 1"


def test_killed_rank_is_named_with_its_signal_in_the_note(tmp_path: Path) -> None:
    killed: list[int] = []

    def kill_rank_1(elapsed: float) -> None:
        if killed or not (tmp_path / "train-A" / "steps.rank1.jsonl").exists():
            return
        for p in psutil.Process().children(recursive=True):  # only processes this test started
            try:
                if p.environ().get("RANK") == "1" and "workers.probe" in p.cmdline():
                    p.send_signal(signal.SIGKILL)
                    killed.append(p.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue

    outcome = _run_train_package(tmp_path, {"TINY_SLOW": "0.3"}, kill_rank_1)
    assert len(killed) == 1 and outcome.status == "failed"
    assert outcome.note == "exit 1: train: torchrun exited with 1: rank 1 was killed by signal 9 (SIGKILL)"


def _summary(rank: int, exitcode: int) -> str:
    return (f"Root Cause (first observed failure):\n[0]:\n  time      : 2026-01-01_00:00:00\n  host      : h\n"
            f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {exitcode} (pid: 7)\n  error_file: <N/A>\n"
            "============================================================")


def test_failure_cause_is_the_first_rank_to_fail_whatever_torchrun_observed_first() -> None:
    from workers.common import RANK_FAILED
    from workers.rank_failure import failure_cause

    first = RANK_FAILED.format(rank=1, time=100.25, cause="ValueError: boom")
    later = RANK_FAILED.format(rank=0, time=100.75, cause="RuntimeError: Connection closed by peer")
    # torchrun may list the rank that failed second (on the broken collective) as its root cause
    assert failure_cause(f"{later}\n{first}\n{_summary(0, 1)}") == "rank 1: ValueError: boom"
    # a rank killed by a signal torchrun does not send is the cause, even when a survivor raised after it
    assert failure_cause(f"{later}\n{_summary(1, -9)}") == "rank 1 was killed by signal 9 (SIGKILL)"
    # no probe line (the rank failed before the probe ran): the first traceback that is not torchrun's own
    log = "Traceback (most recent call last):\n  File x\nImportError: no module y\n" + _summary(0, 1)
    assert failure_cause(log) == "rank 0 exited with 1: ImportError: no module y"


def test_reload_refuses_a_wrong_spec_kind(tmp_path: Path) -> None:
    proc = run_worker("reload", write_spec(tmp_path, "train-A", "train"), tmp_path)
    assert proc.returncode == 1 and "this worker runs 'reload'" in proc.stderr


def test_checks(tmp_path: Path) -> None:
    py = sys.executable
    expect = "b5bb9d8014a0f9b1d61e21e796d78dccdf1352f23cd32812f4850b878ae4944c"  # sha256 of b"foo\n"
    spec = write_spec(
        tmp_path, "checks", "checks",
        prepare=[{"name": "init", "argv": [py, "-c", "open('made', 'w').write('x')"]}],
        diagnostics=[{"name": "ok", "argv": [py, "-c", "print(1)"]}],
        static_graph={"name": "graph", "argv": [py, "-c", "print('foo')"], "expect_sha256": expect},
        sealed_dir=str(tmp_path),
    )  # fmt: skip
    proc = run_worker("checks", spec, tmp_path)
    assert proc.returncode == 0, proc.stderr
    res = ChecksResult.model_validate_json((tmp_path / "checks" / "result.json").read_text())
    assert res.precision_ok and [d.ok for d in [*res.prepare, *res.diagnostics]] == [True, True, True]
    assert (tmp_path / "made").exists() and res.versions["torch"] and "triton" in res.versions
    took = [d.wall_s for d in [*res.prepare, *res.diagnostics]]  # each command's wall time, printed in the line
    assert all(t is not None and 0 < t < 120 for t in took), took
    assert "(init " in proc.stdout and ", graph " in proc.stdout
    bad = write_spec(
        tmp_path, "checks", "checks", precision="fp16", sealed_dir=str(tmp_path),
        static_graph={"name": "graph", "argv": [py, "-c", "print('bar')"], "expect_sha256": expect},
    )  # fmt: skip
    proc = run_worker("checks", bad, tmp_path)
    assert proc.returncode == 1 and f"checks: failed: graph; see {tmp_path / 'checks' / 'result.json'}\n" in proc.stderr
    res = ChecksResult.model_validate_json((tmp_path / "checks" / "result.json").read_text())
    assert not res.precision_ok and not res.diagnostics[0].ok


def test_checks_leave_the_diagnostics_to_an_earlier_launch_only_under_the_same_versions(tmp_path: Path) -> None:
    """The owner's rule: rerun the GPU diagnostics after upgrades. Under the versions the named launch passed them
    under they are not run again (the prepare commands always run); any difference runs them."""
    py = sys.executable
    common = {"prepare": [{"name": "init", "argv": [py, "-c", "print(0)"]}],
              "diagnostics": [{"name": "diag", "argv": [py, "-c", "print(1)"]}],
              "static_graph": {"name": "graph", "argv": [py, "-c", "print(2)"]}, "sealed_dir": str(tmp_path)}

    def checks(diagnosed: dict[str, Any] | None) -> tuple[ChecksResult, str]:
        spec = ChecksSpec.model_validate({
            "run_id": "test", "name": "checks", "package_dir": str(tmp_path / "checks"),
            "scratch_dir": str(tmp_path / "scratch"), "result_path": str(tmp_path / "checks" / "result.json"),
            "device": "cpu", "precision": "fp32", **common, "diagnosed": diagnosed})  # orch.package/2, as orch writes
        path = tmp_path / "checks.json"
        path.write_text(spec.model_dump_json(by_alias=True))
        proc = run_worker("checks", path, tmp_path)
        assert proc.returncode == 0, proc.stderr
        return ChecksResult.model_validate_json((tmp_path / "checks" / "result.json").read_text()), proc.stdout

    first, _ = checks(None)
    assert [d.name for d in first.diagnostics] == ["diag", "graph"] and first.diagnosed_by is None
    same, said = checks({"run_id": "run-1", "versions": first.versions})
    assert [d.name for d in same.prepare] == ["init"] and same.diagnostics == [] and same.diagnosed_by == "run-1"
    assert "; the diagnostics not run again: run run-1 passed them under the same versions" in said
    for key in ("torch", "driver"):
        upgraded, _ = checks({"run_id": "run-1", "versions": {**first.versions, key: "0.0"}})
        assert [d.name for d in upgraded.diagnostics] == ["diag", "graph"] and upgraded.diagnosed_by is None


def test_checks_versions_without_a_gpu_grant_are_torchs_own_and_import_no_torch() -> None:
    """A CPU slot (CUDA_VISIBLE_DEVICES empty) reads torch's version file; the figures equal torch's own."""
    code = ("import json, sys; from workers.checks import versions; v = versions(); "
            "print(json.dumps([v, 'torch' in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    seen = {}
    for grant in ("", None):
        run_env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
        if grant is not None:
            run_env["CUDA_VISIBLE_DEVICES"] = grant
        out = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, check=True)
        seen[grant] = json.loads(out.stdout)
    (cpu, cpu_imported), (full, full_imported) = seen[""], seen[None]
    assert cpu_imported is False and full_imported is True
    import torch

    assert cpu["torch"] == full["torch"] == torch.__version__ and cpu["cuda"] == str(torch.version.cuda or "none")
    assert (cpu["gpu_count"], cpu["gpu_model"]) == ("0", "none")
    if full["gpu_count"] == "0":  # no GPU here: the two ways give the same record
        assert cpu == full


def test_score_seals_metrics_and_prints_none(tmp_path: Path) -> None:
    scorer = (
        "import json,sys; print('geneval 0.8125');"
        "json.dump({'geneval': 0.8125, 'ckpt': sys.argv[1]}, open(sys.argv[2], 'w'))"
    )
    targets = [
        {"arm_label": label, "sealed_dir": str(tmp_path), "ckpt_dir": f"ck-{label}",
         "argv": [sys.executable, "-c", scorer, "{ckpt}", "{out}"]}
        for label in ("A", "C")
    ]  # fmt: skip
    sealed = tmp_path / "score.sealed.json"
    spec = write_spec(tmp_path, "score", "score", score_targets=targets, sealed_metrics_path=str(sealed))
    proc = run_worker("score", spec, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "0.8125" not in proc.stdout + proc.stderr  # the scorer printed it; the worker lets nothing through
    res = ScoreResult.model_validate_json((tmp_path / "score" / "result.json").read_text())
    assert stat.S_IMODE(sealed.stat().st_mode) == 0o400
    assert res.sealed_sha256 == hashlib.sha256(sealed.read_bytes()).hexdigest()
    doc = json.loads(sealed.read_text())
    assert [t["metrics"]["ckpt"] for t in doc["targets"]] == ["ck-A", "ck-C"]
    assert run_worker("score", spec, tmp_path).returncode == 1  # sealed once, never overwritten


@pytest.mark.cuda
def test_train_reload_on_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL ranks, tx128 digests on the device, memory peaks, CUDA RNG, an fp16 matmul seen on the GPU."""
    import torch

    monkeypatch.setenv("TINY_DEVICE", "cuda")
    monkeypatch.setenv("TINY_FP16_STEP", "1")
    nproc = min(2, torch.cuda.device_count())
    t, r = train_and_reload(tmp_path, device="cuda", backend="nccl", nproc=nproc)
    assert [x.final_digests for x in t.ranks] == [x.digests for x in r.ranks]
    assert any(v.startswith("tx128:") for v in t.ranks[0].final_digests.values())
    assert t.ranks[0].peak_allocated is not None and t.ranks[0].peak_reserved is not None
    lines = (tmp_path / "train-A" / "steps.rank0.jsonl").read_text().splitlines()
    recs = [StepRecord.model_validate_json(x) for x in lines]
    assert all(x.rng.cuda is not None for x in recs)
    seen = {(f.step, f.op, f.dtype) for x in recs for f in x.forbidden}
    assert (1, "aten.mm.default", "float16") in seen and {s for s, _, _ in seen} == {1}
