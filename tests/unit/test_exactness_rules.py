"""The exactness rules on hand-made step lines and results (issue 18): first_digest_mismatch (what it counts, where
it stops, how it words a miss), final_and_reload, first_rng_mismatch and replay_mismatch.

Every expected value is worked out by hand from the rule (DESIGN.md section 1), never from the code under test.
"""

from __future__ import annotations

from typing import Any

from ledger.verdict.decide.exactness import final_and_reload, first_digest_mismatch, first_rng_mismatch, replay_mismatch
from ledger.verdict.decide.mismatch import Mismatch
from protocol.plan import ROLES
from protocol.results import (
    ObservedRecipe,
    RankSummary,
    ReloadRank,
    ReloadResult,
    RngFingerprint,
    StepRecord,
    TrainResult,
)


def _line(step: int, digests: dict[str, str] | None, combined: str | None = None) -> StepRecord:
    return StepRecord(rank=0, world_size=1, step=step, duration_s=1.0, probe_s=0.0, lr=[1e-3],
                      rng=RngFingerprint(cpu="r"), digests=digests, combined=combined)


def test_a_step_without_digests_is_one_mismatch_and_the_next_steps_are_still_compared() -> None:
    same = {"w": "a" * 32, "v": "b" * 32}
    steps = {
        "A": {0: [_line(1, same, "c"), _line(2, same, "c")]},
        "C": {0: [_line(1, None), _line(2, {**same, "w": "f" * 32}, "c")]},  # step 1: no digests; step 2: w differs
        "B": {0: [_line(1, same, "c"), _line(2, same, "c")]},
    }
    first, count, compared = first_digest_mismatch(steps, ("A", "C", "B"), [1, 2], [0])
    # step 1 is one miss (no tensors compared); step 2 compares v and w and w disagrees: 2 misses, 2 tensors
    assert (count, compared) == (2, 2)
    assert first == Mismatch("missing", 1, 0, None, {}, "no digests from arm(s) C")
    assert first.line() == "missing mismatch at step 1, rank 0: no digests from arm(s) C"


def test_a_rank_without_lines_is_missing_in_every_arm_that_lacks_it() -> None:
    steps = {"A": {0: [_line(1, {"w": "a"}, "c")]}, "C": {}, "B": {}}
    first, count, compared = first_digest_mismatch(steps, ("A", "C", "B"), [1], [0])
    assert (count, compared) == (1, 0)
    assert first is not None and first.detail == "no digests from arm(s) C, B"


def test_a_tensor_digest_mismatch_names_its_values_cut_to_16_characters() -> None:
    steps = {
        "A": {0: [_line(3, {"w": "0123456789abcdef0123"}, "c1")]},
        "C": {0: [_line(3, {"w": "fedcba9876543210fedc"}, "c2")]},
        "B": {0: [_line(3, {}, "c1")]},  # B has no digest of w at all
    }
    first, count, compared = first_digest_mismatch(steps, ("A", "C", "B"), [3], [0])
    # one tensor, one miss; the combined digests differ too but a tensor miss already counts the step
    assert (count, compared) == (1, 1)
    assert first == Mismatch(
        "digests", 3, 0, "w", {"A": "0123456789abcdef0123", "C": "fedcba9876543210fedc", "B": None},
        "digest of w differs (A=0123456789abcdef, C=fedcba9876543210, B=absent)")


def test_equal_tensors_with_a_different_combined_digest_are_a_mismatch_of_their_own() -> None:
    same = {"w": "a" * 32}
    steps = {"A": {0: [_line(1, same, "x")]}, "C": {0: [_line(1, same, "y")]}, "B": {0: [_line(1, same, "x")]}}
    first, count, compared = first_digest_mismatch(steps, ("A", "C", "B"), [1], [0])
    assert (count, compared) == (1, 1)
    assert first == Mismatch("combined", 1, 0, None, {"A": "x", "C": "y", "B": "x"},
                             "combined digest differs (A=x, C=y, B=x)")


def test_a_combined_only_difference_after_another_mismatch_adds_one_to_the_count() -> None:
    same = {"w": "a"}
    steps = {"A": {0: [_line(1, same, "x"), _line(2, same, "x")]},
             "C": {0: [_line(1, {"w": "b"}, "x"), _line(2, same, "y")]},
             "B": {0: [_line(1, same, "x"), _line(2, same, "x")]}}
    first, count, compared = first_digest_mismatch(steps, ("A", "C", "B"), [1, 2], [0])
    # step 1: w differs (one); step 2: only the combined digest differs (one more); the first stays step 1's
    assert (count, compared) == (2, 2)
    assert first is not None and (first.check, first.step) == ("digests", 1)


def test_a_missing_rank_does_not_skip_the_other_ranks_of_that_step() -> None:
    def line(rank: int, w: str | None) -> StepRecord:
        return StepRecord(rank=rank, world_size=2, step=1, duration_s=1.0, probe_s=0.0, lr=[1e-3],
                          rng=RngFingerprint(cpu="r"), digests=None if w is None else {"w": w}, combined="c")

    steps = {"A": {0: [line(0, "a")], 1: [line(1, "a")]}, "C": {0: [line(0, None)], 1: [line(1, "b")]},
             "B": {0: [line(0, "a")], 1: [line(1, "a")]}}
    first, count, compared = first_digest_mismatch(steps, ("A", "C", "B"), [1], [0, 1])
    # rank 0: C has no digests (one miss); rank 1: w differs (one more miss, one tensor compared)
    assert (count, compared) == (2, 1)
    assert first is not None and (first.check, first.rank) == ("missing", 0)


# --- the final state: each train against its own reload, then the arms against each other ---------------------------

def _summary(rank: int, final: dict[str, str], combined: str = "fc", checkpoint: str = "k") -> RankSummary:
    return RankSummary(rank=rank, steps_file=f"steps.rank{rank}.jsonl", steps_sha256="0" * 64, steps=2,
                       final_combined=combined, final_digests=final, checkpoint_sha256=checkpoint)


def _train(arm: str, ranks: list[RankSummary]) -> TrainResult:
    recipe = ObservedRecipe(optimizer="AdamW", lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    return TrainResult(arm=arm, world_size=len(ranks), steps=2, digest_steps=[1], device="cpu",
                       observed_recipe=recipe, ranks=ranks, stopped_cleanly=True)


def _reload(arm: str, ranks: list[RankSummary]) -> ReloadResult:
    """The reload of a train that reads back exactly what it wrote."""
    return ReloadResult(arm=arm, world_size=len(ranks), ranks=[
        ReloadRank(rank=r.rank, checkpoint_sha256=r.checkpoint_sha256 or "", combined=r.final_combined,
                   digests=dict(r.final_digests)) for r in ranks])


def _three(final: dict[str, str]) -> tuple[dict[str, TrainResult], dict[str, ReloadResult]]:
    trains = {arm: _train(arm, [_summary(0, final)]) for arm in ROLES}
    return trains, {arm: _reload(arm, trains[arm].ranks) for arm in ROLES}


def test_equal_finals_that_reload_to_themselves_are_no_mismatch() -> None:
    trains, reloads = _three({"w": "1", "v": "2"})
    assert final_and_reload(trains, reloads, ROLES) == (None, {"A": True, "C": True, "B": True})


def test_a_reload_with_other_ranks_than_its_train_fails_that_arm_and_is_named_first() -> None:
    trains, reloads = _three({"w": "1"})
    trains["A"] = _train("A", [_summary(0, {"w": "1"}), _summary(1, {"w": "1"})])
    reloads["A"] = _reload("A", [_summary(0, {"w": "1"})])
    reloads["B"] = ReloadResult(arm="B", world_size=1, ranks=[ReloadRank(rank=0, checkpoint_sha256="other",
                                                                         combined="fc", digests={"w": "1"})])
    first, ok = final_and_reload(trains, reloads, ROLES)
    # A's rank 0 is still compared (and equal): only the rank sets differ; B's checkpoint is a later problem
    assert first == Mismatch("reload", None, None, None, {}, "train A ranks [0, 1] but reload A ranks [0]")
    assert first.line() == "reload mismatch at run level: train A ranks [0, 1] but reload A ranks [0]"
    assert ok == {"A": False, "C": True, "B": False}


def test_a_reload_of_another_checkpoint_is_a_reload_mismatch_even_with_equal_digests() -> None:
    trains, reloads = _three({"w": "1"})
    reloads["C"] = ReloadResult(arm="C", world_size=1, ranks=[ReloadRank(rank=0, checkpoint_sha256="k2",
                                                                         combined="fc", digests={"w": "1"})])
    first, ok = final_and_reload(trains, reloads, ROLES)
    assert first == Mismatch("reload", None, 0, None, {"C": "k", "reload C": "k2"},
                             "reload C loaded a different checkpoint than train C wrote")
    assert ok == {"A": True, "C": False, "B": True}


def test_a_reloaded_tensor_that_differs_or_is_only_on_one_side_is_named_with_both_values() -> None:
    trains, reloads = _three({"v": "same"})
    trains["A"] = _train("A", [_summary(0, {"v": "same", "w": "a" * 20})])
    reloads["A"] = ReloadResult(arm="A", world_size=1, ranks=[ReloadRank(
        rank=0, checkpoint_sha256="k", combined="fc", digests={"v": "same", "w": "b" * 20})])
    first, ok = final_and_reload(trains, reloads, ROLES)
    assert first == Mismatch("reload", None, 0, "w", {"A": "a" * 20, "reload A": "b" * 20},
                             "final digest of w differs (A=aaaaaaaaaaaaaaaa, reload A=bbbbbbbbbbbbbbbb)")
    assert ok == {"A": False, "C": True, "B": True}
    # a tensor only the reload has: the train's side is absent
    trains, reloads = _three({"v": "same"})
    reloads["B"] = ReloadResult(arm="B", world_size=1, ranks=[ReloadRank(
        rank=0, checkpoint_sha256="k", combined="fc", digests={"v": "same", "extra": "e"})])
    first, ok = final_and_reload(trains, reloads, ROLES)
    assert first == Mismatch("reload", None, 0, "extra", {"B": None, "reload B": "e"},
                             "final digest of extra differs (B=absent, reload B=e)")
    assert ok == {"A": True, "C": True, "B": False}


def test_a_reload_with_equal_tensors_but_another_combined_digest_fails() -> None:
    trains, reloads = _three({"w": "1"})
    reloads["B"] = ReloadResult(arm="B", world_size=1, ranks=[ReloadRank(rank=0, checkpoint_sha256="k",
                                                                         combined="fc2", digests={"w": "1"})])
    first, ok = final_and_reload(trains, reloads, ROLES)
    assert first == Mismatch("reload", None, 0, None, {"B": "fc", "reload B": "fc2"},
                             "final combined differs (B=fc, reload B=fc2)")
    assert ok == {"A": True, "C": True, "B": False}


def test_arms_whose_final_states_differ_are_a_final_mismatch_though_each_reloads_to_itself() -> None:
    trains = {arm: _train(arm, [_summary(0, {"w": "x"}), _summary(1, {"u": "0", "w": w})])
              for arm, w in (("A", "x"), ("C", "y"), ("B", "x"))}
    reloads = {arm: _reload(arm, trains[arm].ranks) for arm in ROLES}
    first, ok = final_and_reload(trains, reloads, ROLES)
    # rank 0 agrees; on rank 1 u agrees and w does not
    assert first == Mismatch("final", None, 1, "w", {"A": "x", "C": "y", "B": "x"},
                             "final digest of w differs (A=x, C=y, B=x)")
    assert ok == {"A": True, "C": True, "B": True}


def test_a_rank_that_only_one_arm_has_is_a_final_mismatch_with_the_others_absent() -> None:
    trains, reloads = _three({"w": "x"})
    trains["A"] = _train("A", [_summary(0, {"w": "x"}), _summary(1, {"w": "x"})])
    reloads["A"] = _reload("A", trains["A"].ranks)
    first, ok = final_and_reload(trains, reloads, ROLES)
    assert first == Mismatch("final", None, 1, "w", {"A": "x", "C": None, "B": None},
                             "final digest of w differs (A=x, C=absent, B=absent)")
    assert ok == {"A": True, "C": True, "B": True}


# --- the RNG fingerprints and learning rates, step by step -----------------------------------------------------------

def _rng_line(step: int, cpu: str = "c", cuda: str | None = "g", lr: float = 1e-3, rank: int = 0) -> StepRecord:
    return StepRecord(rank=rank, world_size=1, step=step, duration_s=1.0, probe_s=0.0, lr=[lr],
                      rng=RngFingerprint(cpu=cpu, cuda=cuda))


def _rng_steps(**changed: dict[int, dict[str, Any]]) -> dict[str, dict[int, list[StepRecord]]]:
    """Three arms with steps 0-2 on rank 0 alike; changed[arm][step] overrides that line's fields."""
    return {arm: {0: [_rng_line(s, **changed.get(arm, {}).get(s, {})) for s in range(3)]} for arm in ROLES}


def test_equal_generators_and_learning_rates_are_no_mismatch_and_steps_past_the_lines_are_not_a_miss() -> None:
    # n_steps 4: step 3 has no line in any arm, which is alike everywhere
    assert first_rng_mismatch(_rng_steps(), ROLES, 4, [0]) is None


def test_the_first_differing_cpu_generator_is_named_with_every_arm() -> None:
    steps = _rng_steps(C={1: {"cpu": "0123456789abcdefXYZ"}, 2: {"cpu": "z"}})
    assert first_rng_mismatch(steps, ROLES, 3, [0]) == Mismatch(
        "rng", 1, 0, "rng.cpu", {"A": "c", "C": "0123456789abcdefXYZ", "B": "c"},
        "cpu RNG state differs (A=c, C=0123456789abcdef, B=c)")
    # a mutant that looks at fewer steps than n_steps misses step 2
    steps = _rng_steps(B={2: {"cpu": "z"}})
    assert first_rng_mismatch(steps, ROLES, 3, [0]) == Mismatch(
        "rng", 2, 0, "rng.cpu", {"A": "c", "C": "c", "B": "z"}, "cpu RNG state differs (A=c, C=c, B=z)")


def test_the_cuda_generator_is_compared_too_and_after_the_cpu_one() -> None:
    steps = _rng_steps(A={0: {"cuda": None}})
    m = first_rng_mismatch(steps, ROLES, 3, [0])
    assert m == Mismatch("rng", 0, 0, "rng.cuda", {"A": None, "C": "g", "B": "g"},
                         "cuda RNG state differs (A=absent, C=g, B=g)")
    assert m.line() == "rng mismatch at step 0, rank 0, tensor rng.cuda: cuda RNG state differs (A=absent, C=g, B=g)"
    steps = _rng_steps(A={0: {"cuda": "h", "cpu": "d"}})
    assert first_rng_mismatch(steps, ROLES, 3, [0]) == Mismatch(
        "rng", 0, 0, "rng.cpu", {"A": "d", "C": "c", "B": "c"}, "cpu RNG state differs (A=d, C=c, B=c)")


def test_a_different_learning_rate_is_an_lr_mismatch_in_step_order() -> None:
    # step 1: lr differs; step 2: the RNG differs, later
    steps = _rng_steps(C={1: {"lr": 2e-3}, 2: {"cpu": "z"}})
    m = first_rng_mismatch(steps, ROLES, 3, [0])
    assert m == Mismatch("lr", 1, 0, None, {"A": "[0.001]", "C": "[0.002]", "B": "[0.001]"},
                         "learning rate differs (A=[0.001], C=[0.002], B=[0.001])")
    # the generators of a step are checked before its learning rate
    steps = _rng_steps(C={1: {"lr": 2e-3, "cuda": "h"}})
    assert first_rng_mismatch(steps, ROLES, 3, [0]) == Mismatch(
        "rng", 1, 0, "rng.cuda", {"A": "g", "C": "h", "B": "g"}, "cuda RNG state differs (A=g, C=h, B=g)")


def test_a_missing_step_line_is_an_rng_mismatch_with_that_arm_absent() -> None:
    steps = _rng_steps()
    steps["B"] = {0: [_rng_line(0), _rng_line(2)]}
    assert first_rng_mismatch(steps, ROLES, 3, [0]) == Mismatch(
        "rng", 1, 0, "rng.cpu", {"A": "c", "C": "c", "B": None}, "cpu RNG state differs (A=c, C=c, B=absent)")


def test_every_rank_is_compared() -> None:
    steps = {arm: {0: [_rng_line(0)], 1: [_rng_line(0, rank=1, cpu="z" if arm == "C" else "c")]} for arm in ROLES}
    assert first_rng_mismatch(steps, ROLES, 1, [0, 1]) == Mismatch(
        "rng", 0, 1, "rng.cpu", {"A": "c", "C": "z", "B": "c"}, "cpu RNG state differs (A=c, C=z, B=c)")


# --- the watched replay watch-C against train-C ----------------------------------------------------------------------

def _replay_line(step: int, rank: int = 0, w: str = "a", cpu: str = "c", loss: str = "float64:00") -> StepRecord:
    return StepRecord(rank=rank, world_size=1, step=step, duration_s=1.0, probe_s=0.0, lr=[1e-3],
                      rng=RngFingerprint(cpu=cpu), digests={"w": w} if step == 1 else None,
                      combined="c" if step == 1 else None, scalars={"log[0] loss#0": loss})


def _replay(watch_lines: list[StepRecord], watch_final: dict[str, str] | None = None,
            train_final: dict[str, str] | None = None) -> Mismatch | None:
    train = _train("C", [_summary(0, train_final or {"w": "f"})])
    watch = _train("C", [_summary(0, watch_final or {"w": "f"})])
    train_lines = [_replay_line(s) for s in range(3)]
    return replay_mismatch(train, {0: train_lines}, watch, {0: watch_lines}, [1], 3, [1, 2])


def test_a_faithful_replay_is_no_mismatch() -> None:
    assert _replay([_replay_line(s) for s in range(3)]) is None


def test_a_replay_is_checked_for_digests_then_rng_then_the_trainers_numbers_then_the_final_state() -> None:
    assert _replay([_replay_line(0), _replay_line(1, w="b", cpu="z"), _replay_line(2)]) == Mismatch(
        "digests", 1, 0, "w", {"train-C": "a", "watch-C": "b"}, "digest of w differs (train-C=a, watch-C=b)")
    assert _replay([_replay_line(0), _replay_line(1), _replay_line(2, cpu="z", loss="float64:01")]) == Mismatch(
        "rng", 2, 0, "rng.cpu", {"train-C": "c", "watch-C": "z"}, "cpu RNG state differs (train-C=c, watch-C=z)")
    m = _replay([_replay_line(0), _replay_line(1), _replay_line(2, loss="float64:01")], watch_final={"w": "g"})
    assert m is not None and (m.check, m.step, m.rank, m.tensor) == ("scalars", 2, 0, "log[0] loss#0")
    assert m.values == {"train-C": "float64:00", "watch-C": "float64:01"}
    m = _replay([_replay_line(s) for s in range(3)], watch_final={"w": "g"})
    assert m == Mismatch("final", None, 0, "w", {"train-C": "f", "watch-C": "g"},
                         "final digest of w differs (train-C=f, watch-C=g)")
    # a final tensor only one side has
    m = _replay([_replay_line(s) for s in range(3)], watch_final={"w": "f", "extra": "e"})
    assert m == Mismatch("final", None, 0, "extra", {"train-C": None, "watch-C": "e"},
                         "final digest of extra differs (train-C=absent, watch-C=e)")


def test_a_rank_that_only_one_side_has_is_compared() -> None:
    # watch-C has a rank 1 that train-C lacks: its digests are missing from train-C
    train = _train("C", [_summary(0, {"w": "f"})])
    watch = _train("C", [_summary(0, {"w": "f"}), _summary(1, {"w": "f"})])
    lines = [_replay_line(s) for s in range(3)]
    m = replay_mismatch(train, {0: lines}, watch, {0: lines, 1: [_replay_line(s, rank=1) for s in range(3)]},
                        [1], 3, [1, 2])
    assert m == Mismatch("missing", 1, 1, None, {}, "no digests from arm(s) train-C")
    # with no step compared, the final state of the rank one side lacks is still compared, either way round
    assert replay_mismatch(train, {}, watch, {}, [], 0, []) == Mismatch(
        "final", None, 1, "w", {"train-C": None, "watch-C": "f"},
        "final digest of w differs (train-C=absent, watch-C=f)")
    assert replay_mismatch(watch, {}, train, {}, [], 0, []) == Mismatch(
        "final", None, 1, "w", {"train-C": "f", "watch-C": None},
        "final digest of w differs (train-C=f, watch-C=absent)")


def test_an_arm_without_a_reload_is_skipped_and_the_arms_after_it_are_still_checked() -> None:
    # an A/A launch of `orch calibrate` runs no reload (issue 51): A has none here, and C's reload still fails C
    trains, reloads = _three({"w": "1"})
    del reloads["A"]
    reloads["C"] = ReloadResult(arm="C", world_size=1, ranks=[ReloadRank(rank=0, checkpoint_sha256="k",
                                                                         combined="fc2", digests={"w": "1"})])
    first, ok = final_and_reload(trains, reloads, ROLES)
    assert first == Mismatch("reload", None, 0, None, {"C": "fc", "reload C": "fc2"},
                             "final combined differs (C=fc, reload C=fc2)")
    assert ok == {"C": False, "B": True}
