"""Which packages the audit expects of a recorded run (ledger/verdict/decide/evidence.py): a sequential run's
numbered labels, whether it was primed, whether it is an A/A launch, whether that launch kept its trailing reload, and
an orch.protocol/2 run's recipe copy. The ledger and run.json are read together: a package either one names must be
whole in both, or the run is refused with that package named."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_audit import RunSpec, make_run

from ledger.verdict.decide.evidence import IncompleteRunError, collect_evidence
from protocol.home import resolve_home
from protocol.recipe import RUN_COPY

REPO = Path(__file__).resolve().parents[2]
R3_RECIPE = (REPO / "recipes" / "r3_tree_rl_bagel7b.yaml").read_bytes()
SEQUENTIAL_2 = ("checks", "train-A1", "reload-A1", "train-C1", "reload-C1", "train-B1", "reload-B1", "train-B2",
                "reload-B2", "train-C2", "reload-C2", "train-A2", "reload-A2", "watch-C", "score")


def _refused(tmp_path: Path, spec: RunSpec) -> list[str]:
    make_run(tmp_path, "run1", spec)
    with pytest.raises(IncompleteRunError) as err:
        collect_evidence(resolve_home(tmp_path), "run1")
    return list(err.value.problems)


@pytest.mark.parametrize("asked", ["protocol", "--until-decided"])
def test_a_sequential_run_is_read_with_its_numbered_labels_and_the_triplets_its_ledger_reaches(
    tmp_path: Path, asked: str
) -> None:
    """repeats: auto, or a fixed one-triplet protocol launched with --until-decided (run.json's rule only)."""
    make_run(tmp_path, "run1", RunSpec(sequential=asked, repeats=2))
    ev = collect_evidence(resolve_home(tmp_path), "run1")
    assert (ev.names, ev.triplets, ev.sequential) == (SEQUENTIAL_2, 2, True)
    assert set(ev.trains) == set(ev.reloads) == {"A1", "C1", "B1", "B2", "C2", "A2"}
    assert ev.watch is not None and ev.watch.arm == "C1" and set(ev.steps["A2"]) == {0, 1}


def test_a_one_triplet_sequential_run_still_numbers_its_labels(tmp_path: Path) -> None:
    make_run(tmp_path, "run1", RunSpec(sequential="protocol"))
    ev = collect_evidence(resolve_home(tmp_path), "run1")
    assert (ev.names[1:4], ev.triplets, ev.sequential) == (("train-A1", "reload-A1", "train-C1"), 1, True)


def test_a_sequential_runs_replay_must_name_the_first_candidate_launch(tmp_path: Path) -> None:
    assert _refused(tmp_path, RunSpec(sequential="protocol", watch_arm="C")) == [
        "packages/watch-C/result.json: arm 'C', expected 'C1'"]


def test_a_prime_named_by_either_record_must_be_whole_in_both(tmp_path: Path) -> None:
    assert _refused(tmp_path, RunSpec(primed=True, ledger_omits=("prime",))) == ["package prime: no ledger record"]
    assert _refused(tmp_path / "b", RunSpec(primed=True, run_json_omits=("prime",))) == [
        "package prime: ok in the ledger but absent from run.json"]


def test_a_run_without_a_prime_in_either_record_is_read_as_recorded_before_the_prime(tmp_path: Path) -> None:
    make_run(tmp_path, "run1", RunSpec())
    assert "prime" not in collect_evidence(resolve_home(tmp_path), "run1").names
    make_run(tmp_path, "run2", RunSpec(primed=True))
    assert collect_evidence(resolve_home(tmp_path), "run2").names[:2] == ("checks", "prime")


def test_an_aa_launch_whose_run_json_lists_the_replay_is_not_read_as_one_that_ends_after_its_triplet(
    tmp_path: Path
) -> None:
    """run.json names the calibration, but lists the watched replay and the scorer that the ledger lacks: the audit
    expects them (a launch recorded before A/A launches ended after the triplet), so it refuses, naming both."""
    assert _refused(tmp_path, RunSpec(calibration_of=True, ledger_omits=("watch-C", "score"))) == [
        "package watch-C: no ledger record", "package score: no ledger record"]


@pytest.mark.parametrize("omit", ["ledger", "run.json"])
def test_an_aa_launchs_trailing_reload_named_by_either_record_must_be_whole_in_both(tmp_path: Path, omit: str) -> None:
    """An A/A launch recorded before issue 51 kept the reload after its last launch; one record of it alone is
    refused, never read as a launch without it."""
    omitted = ("reload-B",)
    spec = RunSpec(calibration_of=True, ends_after_triplets=True, trailing_reload=True,
                   ledger_omits=omitted if omit == "ledger" else (), run_json_omits=omitted if omit != "ledger" else ())
    line = "no ledger record" if omit == "ledger" else "ok in the ledger but absent from run.json"
    assert _refused(tmp_path, spec) == [f"package reload-B: {line}"]


def test_an_aa_launch_without_its_trailing_reload_is_whole(tmp_path: Path) -> None:
    make_run(tmp_path, "run1", RunSpec(calibration_of=True, ends_after_triplets=True, trailing_reload=False))
    ev = collect_evidence(resolve_home(tmp_path), "run1")
    assert ev.names[-1] == "train-B" and set(ev.reloads) == {"A", "C"} and ev.watch is None and ev.score is None


def test_a_protocol_2_run_reads_its_frozen_recipe_from_its_own_run_copy(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "run1", RunSpec(recipe_file=R3_RECIPE))
    recipe = collect_evidence(resolve_home(tmp_path), "run1").recipe
    assert recipe is not None and recipe.path == run_dir / RUN_COPY and recipe.named == "recipes/synthetic.yaml"
    assert recipe.raw == R3_RECIPE


def test_a_protocol_2_run_without_its_recipe_copy_is_refused_naming_the_copy(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "run1", RunSpec(recipe_file=R3_RECIPE))
    (run_dir / RUN_COPY).unlink()
    with pytest.raises(IncompleteRunError) as err:
        collect_evidence(resolve_home(tmp_path), "run1")
    assert err.value.problems == [f"{RUN_COPY}: missing (the copy of the protocol's recipe file "
                                  "recipes/synthetic.yaml)"]


def test_a_recipe_copy_that_matches_its_digest_but_is_no_recipe_is_refused_with_the_parsers_line(
    tmp_path: Path
) -> None:
    problems = _refused(tmp_path, RunSpec(recipe_file=b"- not a mapping\n"))
    run_copy = tmp_path / "runs" / "run1" / RUN_COPY
    assert problems == [f"{RUN_COPY}: {run_copy}:1: a recipe file is a YAML mapping (schema, name, trainer, keys); "
                        "see docs/RECIPES.md"]
