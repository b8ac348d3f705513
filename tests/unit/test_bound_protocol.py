"""The GPU-bound r3-mini protocols (issue 50): the frozen recipe unchanged, one baseline workload shared by the
candidate and its null (one calibration serves both), and every command that builds the model built at the same size
(the initial state, the static graph digest and the scorer must match what the trainer loads)."""

from __future__ import annotations

from pathlib import Path

from protocol.schema import baseline_workload_id, load_protocol

REPO = Path(__file__).resolve().parents[2]
BOUND, NULL, SMALL = ("r3_mini_cuda1_bound.yaml", "r3_mini_cuda1_bound_null.yaml", "r3_mini_cuda1.yaml")
MODEL_FLAGS = ("--hidden_size", "--intermediate_size", "--num_hidden_layers", "--num_attention_heads",
               "--num_key_value_heads", "--vit_hidden_size", "--vit_intermediate_size", "--vit_num_hidden_layers",
               "--vit_num_attention_heads", "--max_latent_size")  # fmt: skip


def _flags(argv: list[str], names: tuple[str, ...]) -> dict[str, str]:
    return {a: argv[i + 1] for i, a in enumerate(argv) if a in names}


def test_the_bound_protocols_keep_the_recipe_and_share_one_baseline_workload() -> None:
    bound, null, small = (load_protocol(REPO / "protocol" / n) for n in (BOUND, NULL, SMALL))
    assert bound.protocol.recipe == small.protocol.recipe and bound.recipe == small.recipe  # the frozen values
    assert baseline_workload_id(bound.protocol) == baseline_workload_id(null.protocol)
    assert baseline_workload_id(bound.protocol) != baseline_workload_id(small.protocol)  # another size: its own
    base, cand = bound.protocol.arms.baseline, bound.protocol.arms.candidate
    assert set(base.switches.values()) == {"0"} and set(cand.switches.values()) == {"1"}
    assert null.protocol.arms.candidate.switches == base.switches


def test_every_command_that_builds_the_model_builds_it_at_the_trainers_size() -> None:
    p = load_protocol(REPO / "protocol" / BOUND).protocol
    size = _flags(list(p.launcher.args), MODEL_FLAGS)
    assert set(size) == set(MODEL_FLAGS) and int(size["--hidden_size"]) >= 2048
    assert p.checks.static_graph is not None
    for argv in (p.checks.prepare[0].command, p.checks.static_graph.command, p.scorer.command):
        assert _flags(list(argv), MODEL_FLAGS) == size, argv
    text = (REPO / "protocol" / BOUND).read_text()
    assert "launch-bound" in text and "GPU-bound" in text, "the header says which r3-mini protocol serves what"
