"""The plan: the one list of a run's packages; repeats 1 is exactly the owner's run, K triplets balance order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol.plan import (
    arm_of,
    kept_checkpoints,
    launch_labels,
    package_names,
    plan,
    replay_label,
    score_labels,
    triplets,
    triplets_in,
)


def test_one_triplet_is_the_owners_run() -> None:
    assert package_names(1) == ("checks", "prime", "train-A", "reload-A", "train-C", "reload-C", "train-B",
                                "reload-B", "watch-C", "score")
    assert package_names(1, prime=False) == ("checks", "train-A", "reload-A", "train-C", "reload-C", "train-B",
                                             "reload-B", "watch-C", "score")  # runs recorded before the prime
    first = [(p.name, p.kind, p.arm) for p in plan(1)][:2]
    assert first == [("checks", "checks", None), ("prime", "prime", "baseline")]
    assert [(p.arm_label, p.arm) for p in plan(1) if p.kind == "train"] == [
        ("A", "baseline"), ("C", "candidate"), ("B", "baseline")]
    assert score_labels(1) == ("A", "C")


def test_two_triplets_alternate_which_baseline_launch_comes_first() -> None:
    assert launch_labels(2) == ("A1", "C1", "B1", "B2", "C2", "A2")
    assert [t.labels for t in triplets(2)] == [{"A": "A1", "C": "C1", "B": "B1"}, {"A": "A2", "C": "C2", "B": "B2"}]
    assert package_names(2)[:4] == ("checks", "prime", "train-A1", "reload-A1") and package_names(2)[-1] == "score"
    assert score_labels(2) == ("A1", "C1") and kept_checkpoints(2) == {"A1", "C1"}


@given(st.integers(1, 32))
def test_every_triplet_is_baseline_candidate_baseline_and_labels_are_unique(k: int) -> None:
    labels = launch_labels(k)
    assert len(labels) == len(set(labels)) == 3 * k
    for i in range(k):
        roles = [arm_of(lab) for lab in labels[3 * i: 3 * i + 3]]
        assert roles == ["baseline", "candidate", "baseline"]
    assert len(package_names(k)) == 4 + 6 * k and len(package_names(k, prime=False)) == 3 + 6 * k
    assert package_names(k)[-2] == "watch-C"
    firsts = [t.order[0] for t in triplets(k)]
    if k > 1:  # label A leads in odd triplets, B in even ones
        assert sum(f.startswith("A") for f in firsts) - sum(f.startswith("B") for f in firsts) in (0, 1)


@given(st.integers(1, 32), st.booleans())
def test_an_aa_launch_is_the_owners_plan_up_to_its_last_timed_launch(k: int, prime: bool) -> None:
    """`orch calibrate`'s A/A launches: the same packages in the same order up to the last train launch, then
    nothing (no reload after it, no watched replay of a candidate that is the baseline, no scorer): the timed launches
    and the gaps between them, reloads included, are those of the run they calibrate (issue 51)."""
    full, aa = plan(k, prime=prime), plan(k, prime=prime, calibration=True)
    assert aa == full[:-3] and [p.name for p in full[-3:]] == [f"reload-{aa[-1].arm_label}", "watch-C", "score"]
    assert aa[-1].kind == "train" and not {p.kind for p in aa} & {"replay", "score"}
    assert package_names(k, prime=prime, calibration=True) == tuple(p.name for p in aa)
    # one recorded before issue 51 is read with the reload after its last launch
    assert plan(k, prime=prime, calibration=True, trailing_reload=True) == full[:-2]


@given(st.integers(1, 31))
def test_a_sequential_plan_grows_one_triplet_before_watch_c(k: int) -> None:
    now, then = plan(k, sequential=True), plan(k + 1, sequential=True)
    assert then[: len(now) - 2] == now[:-2] and then[-2:] == now[-2:]  # the same prefix; watch-C and score last
    added = [p.name for p in then[len(now) - 2: -2]]
    assert added == [f"{kind}-{label}" for label in triplets(k + 1)[k].order for kind in ("train", "reload")]
    assert plan(k, sequential=True) == plan(k) if k > 1 else launch_labels(1, sequential=True) == ("A1", "C1", "B1")


@given(st.integers(1, 32))
def test_the_scorers_checkpoints_are_known_before_the_number_of_triplets(k: int) -> None:
    assert kept_checkpoints(k, sequential=True) == {"A1", "C1"} == set(score_labels(k, sequential=True))
    assert replay_label(k, sequential=True) == "C1"
    assert triplets_in(package_names(k, sequential=True)) == k


def test_triplets_in_reads_only_numbered_train_and_reload_names() -> None:
    assert triplets_in(package_names(1)) == 0  # the owner's run: labels A, C, B
    assert triplets_in(["checks", "train-B12", "reload-A3", "watch-C", "score", "train-X4", "train-A0"]) == 12
