"""bench/bench_trl_gc.py's sizing figures (issue 33): the command it runs per device, the size it parses, and the
table's numbers (the spread between fresh runs, the generation share, the ratio on/off)."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

import pytest
from benchutil import bench_module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return bench_module("bench_trl_gc")


def _opts(device: str, determinism: str = "full") -> argparse.Namespace:
    return argparse.Namespace(device=device, nproc=1 if device == "cuda" else 2, num_generations=8,
                              completion_length=16, determinism=determinism)


def test_a_size_is_layers_hidden_and_completions(bench: ModuleType) -> None:
    size = bench.Size.parse("16x1536x256")
    assert (size.layers, size.hidden, size.batch) == (16, 1536, 256) and str(size) == "16x1536x256"
    with pytest.raises(argparse.ArgumentTypeError, match="write LAYERSxHIDDENxBATCH"):
        bench.Size.parse("16x1536")


def test_the_cuda_command_freezes_what_the_gpu_protocol_does_and_never_fp16(bench: ModuleType) -> None:
    size = bench.Size(24, 2048, 512)
    cuda = bench.command(Path("w.py"), Path("out"), False, size, _opts("cuda"))
    flags = dict(zip(cuda[6::2], cuda[7::2], strict=False))
    assert cuda[3:6] == ["--nproc_per_node", "1", "w.py"]  # one rank
    assert flags["--bf16"] == "True" and flags["--full_determinism"] == "True" and "--use_cpu" not in flags
    assert "--fp16" not in cuda
    assert (flags["--layers"], flags["--hidden_size"], flags["--per_device_train_batch_size"]) == ("24", "2048", "512")
    assert flags["--gradient_checkpointing"] == "False"
    # deterministic kernels without transformers' full determinism (which sets CUDA_LAUNCH_BLOCKING=1): the flag off,
    # the timing wrapper sets torch's deterministic algorithms when BENCH_DETERMINISM says so
    algorithms = bench.command(Path("w.py"), Path("out"), False, size, _opts("cuda", "algorithms"))
    assert dict(zip(algorithms[6::2], algorithms[7::2], strict=False))["--full_determinism"] == "False"
    assert 'os.environ.get("BENCH_DETERMINISM") == "algorithms"' in bench.TIMED
    assert "torch.use_deterministic_algorithms(True)" in bench.TIMED
    cpu = bench.command(Path("w.py"), Path("out"), True, size, _opts("cpu"))
    cpu_flags = dict(zip(cpu[6::2], cpu[7::2], strict=False))
    assert cpu[4] == "2" and cpu_flags["--use_cpu"] == "True" and cpu_flags["--bf16"] == "False"


def test_the_summary_gives_the_spread_between_runs_and_the_ratio(bench: ModuleType) -> None:
    run = bench.Run
    on = [run(1.0, 0.5), run(1.2, 0.6), run(1.1, 0.55)]
    off = [run(0.8, 0.5), run(0.9, 0.54), run(0.85, 0.51)]
    row = bench.summary(bench.Size(16, 1536, 256), {"on": on, "off": off})
    assert row["on"]["median"] == pytest.approx(1.1) and row["off"]["median"] == pytest.approx(0.85)
    assert row["on"]["cv"] == pytest.approx(0.1 / 1.1)  # sample SD 0.1 over the mean 1.1
    assert row["on"]["generation_share"] == pytest.approx(0.5)
    assert row["ratio_on_off"] == pytest.approx(1.1 / 0.85)
    assert row["every_off_faster"] is True
    row = bench.summary(bench.Size(16, 1536, 256), {"on": on, "off": [*off[:2], run(1.05, 0.5)]})
    assert row["every_off_faster"] is False
    assert bench.cv([2.0]) == 0.0


def test_the_profiled_steps_summary_is_an_aggregate_of_real_profiler_events(bench: ModuleType) -> None:
    """The wrapper's profile_summary (run inside the rank) on a real torch.profiler capture: totals, the top
    operators by self CPU time, and no device rows on CPU; profile_lines prints it in a few lines."""
    import torch

    source = bench.TIMED[bench.TIMED.index("def profile_summary"):bench.TIMED.index("class StepTimer")]
    scope: dict = {"PROFILED": 8}  # type: ignore[type-arg]
    exec(source, scope)
    x = torch.ones(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            x = torch.mm(x, x) / 64
    got = scope["profile_summary"](prof, top=3)
    assert got["step"] == 8 and got["self_cpu_ms_total"] > 0 and got["self_device_ms_total"] == 0
    assert len(got["by_cpu"]) <= 3 and got["by_device"] == []
    assert any(e["name"] == "aten::mm" and e["count"] == 3 for e in got["by_cpu"]), got["by_cpu"]
    cpu = [e["self_cpu_ms"] for e in got["by_cpu"]]
    assert cpu == sorted(cpu, reverse=True) and sum(cpu) <= got["self_cpu_ms_total"] + 1e-9
    lines = bench.profile_lines({**got, "step_s": 0.5}, top=2)
    assert lines[0].startswith("profiled step 8: 0.5000 s; self CPU ") and len(lines) == 1 + 2
    assert bench.profile_lines(None) == []
    # a run's profile travels into its arm's row
    row = bench.summary(bench.Size(2, 64, 8), {"on": [bench.Run(1.0, 0.5, None, got)], "off": [bench.Run(0.9, 0.5)]})
    assert row["on"]["profiles"] == [got] and row["off"]["profiles"] == []
