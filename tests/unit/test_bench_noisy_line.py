"""bench/verdict_real.py's noisier candidate (issue 34's real decisions): the line it inserts into r3-mini's trainer
sleeps the same on every rank of a step, so that the ranks, which meet in every step's collectives, are not paced
by the longest of independent draws (which made that candidate slower, not only noisier)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from benchutil import bench_module


@pytest.fixture(scope="module")
def noisy_line() -> str:
    return str(bench_module("verdict_real").NOISY_LINE)


def _sleeps(line: str, env: dict[str, str], steps: range, log_dir: str = "/h/runs/r/train-C/trainer") -> list[float]:
    """The seconds the inserted line asks to sleep at each step, run as the trainer runs it (inside its loop, its
    --log_dir naming the launch's package folder)."""
    slept: list[float] = []

    class _Time:
        @staticmethod
        def sleep(seconds: float) -> None:
            slept.append(seconds)

    class _Os:
        environ = env

    class _Args:
        pass

    args = _Args()
    args.log_dir = log_dir  # type: ignore[attr-defined]
    code = compile("for curr_step in steps:\n    if True:\n" + line, "online_rl.py", "exec")
    exec(code, {"time": _Time, "os": _Os, "steps": steps, "training_args": args})
    return slept


def test_every_rank_of_a_step_sleeps_the_same_and_a_launch_draws_anew(noisy_line: str) -> None:
    env = {"R3_BENCH_SLEEP_S": "0.1", "R3_BENCH_SLEEP_SPREAD": "1", "ORCH_RUN_ID": "20261205T000000Z-ab-0001"}
    rank0, rank1 = _sleeps(noisy_line, dict(env), range(16)), _sleeps(noisy_line, dict(env), range(16))
    assert rank0 == rank1 and len(set(rank0)) == 16
    other = _sleeps(noisy_line, {**env, "ORCH_RUN_ID": "20261205T000000Z-ab-0002"}, range(16))
    assert other != rank0
    # A and B of one run draw apart (a drawing baseline, the steadier kind, is noisy in its A/B contrast too)
    a = _sleeps(noisy_line, dict(env), range(16), "/h/runs/r/train-A/trainer")
    b = _sleeps(noisy_line, dict(env), range(16), "/h/runs/r/train-B/trainer")
    assert a != b and a != rank0


def test_the_candidates_sleep_is_uniform_around_the_baselines_constant(noisy_line: str) -> None:
    base = {"R3_BENCH_SLEEP_S": "0.1", "R3_BENCH_SLEEP_SPREAD": "0", "ORCH_RUN_ID": "r"}
    assert set(_sleeps(noisy_line, base, range(50))) == {0.1}
    draws = _sleeps(noisy_line, {**base, "R3_BENCH_SLEEP_SPREAD": "1"}, range(4000))
    assert 0.0 <= min(draws) and max(draws) <= 0.2
    assert statistics.median(draws) == pytest.approx(0.1, abs=0.01)
    assert statistics.fmean(draws) == pytest.approx(0.1, abs=0.005)


def test_a_slowdowns_calibration_has_the_slowdowns_baseline_workload(tmp_path: Path) -> None:
    """The K = 1 slowdown stream calibrates a protocol whose baseline is the slowdown's (git HEAD under the published
    commitment): the slowdown's audit finds that calibration by its baseline workload; the plain null's (a baseline
    from the working tree) is another workload and is never used for it."""
    null = bench_module("bench_null")
    null_protocol, project, slowdown_protocol = null.null_protocol, null.project, null.slowdown_protocol
    git_baseline = bench_module("verdict_real").git_baseline
    from protocol.schema import baseline_workload_id, load_protocol

    proj = project(tmp_path / "slow")
    null = null_protocol(proj, "cpu", 1, True)
    calibrated = git_baseline(null)
    slow = slowdown_protocol(proj, null, 1, 0.05)
    ids = {name: baseline_workload_id(load_protocol(path).protocol)
           for name, path in (("null", null), ("calibrated", calibrated), ("slow", slow))}
    assert ids["calibrated"] == ids["slow"] != ids["null"]
    cal = load_protocol(calibrated).protocol
    assert cal.arms.baseline == cal.arms.candidate  # an A/A protocol: both arms the baseline


def test_the_order_line_slows_the_baseline_second_launch_only() -> None:
    """Issue 52's order effect: the inserted line sleeps only in the package whose folder is train-B, and only when
    the switch is set (the baseline arm's switches name it; the candidate's do not)."""
    line = str(bench_module("verdict_real").ORDER_LINE)

    def slept(log_dir: str, env: dict[str, str]) -> list[float]:
        seen: list[float] = []

        class _Time:
            @staticmethod
            def sleep(seconds: float) -> None:
                seen.append(seconds)

        class _Args:
            pass

        args = _Args()
        args.log_dir = log_dir  # type: ignore[attr-defined]

        class _Os:
            environ = env
            sep = "/"

        code = compile("for curr_step in range(3):\n    if True:\n" + line, "online_rl.py", "exec")
        exec(code, {"time": _Time, "os": _Os, "training_args": args})
        return seen

    on = {"R3_BENCH_B_SLEEP_S": "0.25"}
    assert slept("/h/runs/r/train-B/trainer", on) == [0.25] * 3
    assert slept("/h/runs/r/train-A/trainer", on) == [0.0] * 3
    assert slept("/h/runs/r/train-C/trainer", on) == [0.0] * 3
    assert slept("/h/runs/r/train-B/trainer", {}) == [0.0] * 3
