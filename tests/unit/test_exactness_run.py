"""exactness() over one hand-made run (issue 18): which checks it runs, on which steps and ranks, in what order it
lists the problems, and what it sums up from the step lines (forbidden ops, the watch's passes, the replay).

Three arms of one rank; steps 0 to N-1; digests at steps 1-2 (tensors w and v). Every expected value is worked out by
hand from DESIGN.md section 1 and the module's docstrings, never from the code under test.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ledger.verdict.decide.exactness import Exactness, ForbiddenSeen, exactness
from ledger.verdict.decide.mismatch import Mismatch
from protocol.plan import ROLES
from protocol.results import (
    ForbiddenOp,
    ObservedRecipe,
    RankSummary,
    ReloadRank,
    ReloadResult,
    RngFingerprint,
    StepRecord,
    TrainResult,
)

ONE = "float64:000000000000f03f"  # 1.0: IEEE 754 double 0x3FF0000000000000, little-endian
TWO = "float64:0000000000000040"  # 2.0: 0x4000000000000000
RECIPE = ObservedRecipe(optimizer="AdamW", lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                        layers={"model.layers": 2})


def line(step: int, *, rank: int = 0, w: str = "a", cpu: str = "r", scalars: dict[str, str] | None = None,
         forbidden: list[ForbiddenOp] | None = None, watched: bool = False, hops: dict[str, int] | None = None,
         uninspected: list[str] | None = None) -> StepRecord:
    digests = {"w": w, "v": "b"} if 1 <= step <= 2 else None
    return StepRecord(rank=rank, world_size=1, step=step, duration_s=1.0, probe_s=0.0, lr=[1e-3],
                      rng=RngFingerprint(cpu=cpu), digests=digests, combined="c" if digests else None,
                      scalars={"log[0] loss#0": ONE} if scalars is None else scalars, forbidden=forbidden or [],
                      watched=watched, hops=hops or {}, uninspected=uninspected or [])


def train(arm: str, *, final: str = "f", world: int = 1, digest_steps: tuple[int, ...] = (1, 2),
          stopped: bool = True, watched: tuple[int, ...] = (), recipe: ObservedRecipe = RECIPE) -> TrainResult:
    rank = RankSummary(rank=0, steps_file="steps.rank0.jsonl", steps_sha256="0" * 64, steps=6, final_combined="fc",
                       final_digests={"w": final}, checkpoint_sha256="k")
    return TrainResult(arm=arm, world_size=world, steps=6, digest_steps=list(digest_steps), device="cpu",
                       observed_recipe=recipe, ranks=[rank], stopped_cleanly=stopped, watched_steps=list(watched))


def reload(result: TrainResult) -> ReloadResult:
    return ReloadResult(arm=result.arm, world_size=result.world_size, ranks=[
        ReloadRank(rank=r.rank, checkpoint_sha256=r.checkpoint_sha256 or "", combined=r.final_combined,
                   digests=dict(r.final_digests)) for r in result.ranks])


def run(n: int = 6, lines: dict[str, list[StepRecord]] | None = None, trains: dict[str, TrainResult] | None = None,
        **kw: Any) -> Exactness:
    lines = {arm: (lines or {}).get(arm, [line(s) for s in range(n)]) for arm in ROLES}
    trains = {arm: (trains or {}).get(arm, train(arm)) for arm in ROLES}
    reloads = {arm: reload(t) for arm, t in trains.items()}
    return exactness({arm: {0: lines[arm]} for arm in ROLES}, trains, reloads, kw.pop("recipe", {"lr": 1e-3}),
                     n_steps=n, digest_first=1, digest_last=2, **kw)


CLEAN = Exactness(
    exact=True, ranks=1, digest_first=1, digest_last=2, steps_compared=2,
    tensors_compared=4,  # w and v at steps 1 and 2
    first_mismatch=None, mismatches=0, reload_ok={"A": True, "C": True, "B": True}, rng_equal=True,
    rng_first_mismatch=None, recipe_ok=True, recipe_differences=[], forbidden=[], problems=[], watched_steps=0,
    watch_passed={}, watch_uninspected=[], scalars_equal=True,
    # the trainer's numbers of step k are recorded with step k+1: steps 1 to min(N-1, 2+1) = 3
    scalars_compared=3, scalars_first_mismatch=None, scalar_steps=(1, 3), replay_ok=None,
    replay_first_mismatch=None, watch_coverage={"train-A": [], "train-C": [], "train-B": []})


def test_a_clean_run_is_exact_with_every_figure_as_counted_by_hand() -> None:
    assert run() == CLEAN


def test_the_trainers_numbers_stop_at_the_last_step_when_the_run_ends_right_after_the_digests() -> None:
    # N = 3: min(N-1, 2+1) = 2, so steps 1-2
    assert run(3) == replace(CLEAN, scalars_compared=2, scalar_steps=(1, 2))


def test_world_sizes_that_differ_are_a_problem_and_the_largest_sets_the_ranks_compared() -> None:
    ex = run(trains={"C": train("C", world=2)})
    # rank 1 has no lines in any arm: at each digest step all three lack digests there
    missing = Mismatch("missing", 1, 1, None, {}, "no digests from arm(s) A, C, B")
    assert (ex.exact, ex.ranks, ex.first_mismatch, ex.mismatches, ex.tensors_compared) == (False, 2, missing, 2, 4)
    assert ex.problems == ["world sizes differ across arms: {'A': 1, 'C': 2, 'B': 1}", missing.line()]


def test_digest_steps_other_than_the_protocols_and_an_unclean_stop_are_named_per_arm() -> None:
    ex = run(trains={"A": train("A", digest_steps=(1, 2, 3)), "C": train("C", digest_steps=()),
                     "B": train("B", stopped=False)})
    assert ex.problems == ["arm A: digest steps 1-3 are not the protocol's 1-2",
                           "arm C: digest steps none are not the protocol's 1-2",
                           "arm B: the trainer was not stopped cleanly"]
    assert not ex.exact and ex.first_mismatch is None


def test_digest_final_and_rng_mismatches_are_listed_in_that_order_and_the_digest_one_is_first() -> None:
    c = [line(0), line(1, w="z"), line(2, w="z"), line(3, cpu="q"), line(4), line(5)]
    ex = run(lines={"C": c}, trains={"C": train("C", final="g")})
    digest = Mismatch("digests", 1, 0, "w", {"A": "a", "C": "z", "B": "a"}, "digest of w differs (A=a, C=z, B=a)")
    final = Mismatch("final", None, 0, "w", {"A": "f", "C": "g", "B": "f"}, "final digest of w differs (A=f, C=g, B=f)")
    rng = Mismatch("rng", 3, 0, "rng.cpu", {"A": "r", "C": "q", "B": "r"}, "cpu RNG state differs (A=r, C=q, B=r)")
    assert ex == replace(CLEAN, exact=False, first_mismatch=digest, mismatches=2, rng_equal=False,
                         rng_first_mismatch=rng, problems=[digest.line(), final.line(), rng.line()])
    # without a digest mismatch the final one is the run's first mismatch
    ex = run(trains={"C": train("C", final="g")})
    assert ex == replace(CLEAN, exact=False, first_mismatch=final, problems=[final.line()])


def test_recipe_model_and_structure_differences_are_recipe_violations() -> None:
    bigger = RECIPE.model_copy(update={"trainable_params": 5})
    ex = run(trains={"C": train("C", recipe=bigger)}, recipe={"lr": 2e-3},
             model={"layer_prefix": "model.layers", "layers": 3})
    diffs = []
    for arm in ROLES:
        diffs += [f"arm {arm}: lr observed 0.001, frozen 0.002",
                  f"arm {arm}: declared 3 layers under model.layers, the trainer built 2"]
    diffs.append("arm C: trainable_params 5, arm A 0")
    assert ex == replace(CLEAN, exact=False, recipe_ok=False, recipe_differences=diffs,
                         problems=[f"recipe violation: {d}" for d in diffs])
    # no model declared: no model check
    assert run(recipe={"lr": 2e-3}).recipe_differences == [f"arm {arm}: lr observed 0.001, frozen 0.002"
                                                           for arm in ROLES]


def test_a_trainer_number_that_differs_is_named_and_a_trainer_that_logs_nothing_is_a_problem() -> None:
    c = [line(s, scalars={"log[0] loss#0": TWO if s == 2 else ONE}) for s in range(6)]
    ex = run(lines={"C": c})
    scalars = Mismatch("scalars", 2, 0, "log[0] loss#0", {"A": ONE, "C": TWO, "B": ONE},
                       "the trainer's log[0] loss#0 differs (A=1.0, C=2.0, B=1.0)")
    assert ex == replace(CLEAN, exact=False, scalars_equal=False, scalars_first_mismatch=scalars,
                         problems=[scalars.line()])
    # a loss at backward is compared but is not a logged number; step 4 is past the compared steps 1-3
    silent = {arm: [line(s, scalars={"log[0] loss#0": ONE} if s == 4 else {"backward[0]": ONE}) for s in range(6)]
              for arm in ROLES}
    ex = run(lines=silent)
    assert (ex.scalars_compared, ex.scalars_equal) == (3, True)
    assert ex.problems == [f"arm {arm}: its trainer logged no training step (no number through wandb.log or "
                           "logging in steps 1-3); its own numbers cannot be compared" for arm in ROLES]


def test_forbidden_ops_are_listed_in_arm_order_and_the_first_is_named_with_the_count_of_the_rest() -> None:
    mm, add = ForbiddenOp(op="aten.mm", dtype="torch.float16", step=1), ForbiddenOp(op="aten.add", dtype="torch.int8",
                                                                                   step=2)
    b = [line(s, forbidden=[add] if s == 2 else None) for s in range(6)]
    c = [line(s, forbidden=[mm] if s == 1 else None) for s in range(6)]
    ex = run(lines={"B": b, "C": c})
    assert ex.forbidden == [ForbiddenSeen("C", 0, 1, "aten.mm", "torch.float16", "train-C"),
                            ForbiddenSeen("B", 0, 2, "aten.add", "torch.int8", "train-B")]
    assert ex.problems == ["forbidden dtype: aten.mm in torch.float16 at step 1 (arm C, rank 0) and 1 more"]
    assert not ex.exact
    ex = run(lines={"B": b})
    assert ex.problems == ["forbidden dtype: aten.add in torch.int8 at step 2 (arm B, rank 0)"]


def test_the_watch_figures_sum_every_arms_step_lines() -> None:
    a = [line(s, watched=True, hops={"cond": 1} if s < 2 else None, uninspected=["x"] if s == 0 else None)
         for s in range(6)]
    c = [line(s, watched=s == 0, hops={"cond": 1, "attn": 2} if s == 3 else None,
              uninspected=["x", "a"] if s == 3 else None) for s in range(6)]
    ex = run(lines={"A": a, "C": c})
    assert ex == replace(CLEAN, watched_steps=7, watch_passed={"attn": 2, "cond": 3}, watch_uninspected=["a", "x"])
    assert list(ex.watch_passed) == ["attn", "cond"]


def test_a_faithful_watched_replay_adds_only_the_forbidden_ops_the_in_run_watch_did_not_see() -> None:
    mm = ForbiddenOp(op="aten.mm", dtype="torch.float16", step=0)
    late = ForbiddenOp(op="aten.bmm", dtype="torch.float16", step=4)
    watch_lines = {0: [line(s, watched=True, forbidden=[mm] if s == 0 else [late] if s == 4 else None)
                       for s in range(6)]}
    watch = train("C", watched=tuple(range(6)))
    ex = run(trains={"C": train("C", watched=(0, 1))}, watch=watch, watch_steps=watch_lines)
    # step 0 was inside train-C's own watch, so only step 4 is added; train-C's lines had no forbidden op
    seen = ForbiddenSeen("C", 0, 4, "aten.bmm", "torch.float16", "watch-C")
    assert ex == replace(CLEAN, exact=False, forbidden=[seen], replay_ok=True,
                         problems=["forbidden dtype: aten.bmm in torch.float16 at step 4 (arm C, watched replay, "
                                   "rank 0)"],
                         watch_coverage={"train-A": [], "train-C": [0, 1], "train-B": [], "watch-C": list(range(6))})


def test_a_watch_that_misses_steps_or_a_replay_that_differs_is_a_problem() -> None:
    lines = {0: [line(s) for s in range(6)]}
    ex = run(watch=train("C", watched=(0, 1, 2)), watch_steps=lines)
    assert ex.problems == ["watch-C: steps 3-5 of the candidate were watched neither by train-C (steps none) nor by "
                           "the replay (steps 0-2); every step 0-5 must be"] and ex.replay_ok is True
    ex = run(watch=train("C"), watch_steps=lines)
    assert ex.problems == ["watch-C: steps 0-5 of the candidate were watched neither by train-C (steps none) nor by "
                           "the replay (steps none); every step 0-5 must be"]
    # issue 51: the replay watches the steps train-C did not (its warm-up): together they cover every step
    ex = run(trains={"C": train("C", watched=(0, 1))}, watch=train("C", watched=(2, 3, 4, 5)), watch_steps=lines)
    assert ex.problems == [] and ex.watch_coverage["watch-C"] == [2, 3, 4, 5]
    ex = run(trains={"C": train("C", watched=(0, 1))}, watch=train("C", watched=(3, 4, 5)), watch_steps=lines)
    assert ex.problems == ["watch-C: steps 2-2 of the candidate were watched neither by train-C (steps 0-1) nor by "
                           "the replay (steps 3-5); every step 0-5 must be"]
    differs = {0: [line(s, w="z" if s == 1 else "a") for s in range(6)]}
    ex = run(watch=train("C", watched=tuple(range(6))), watch_steps=differs)
    m = Mismatch("digests", 1, 0, "w", {"train-C": "a", "watch-C": "z"}, "digest of w differs (train-C=a, watch-C=z)")
    assert (ex.replay_ok, ex.replay_first_mismatch, ex.exact) == (False, m, False)
    assert ex.problems == [f"watch-C did not replay train-C (its forbidden-dtype watch proves nothing): {m.line()}"]


def test_the_replay_is_compared_with_the_launch_it_replays_and_needs_both_its_result_and_its_lines() -> None:
    # C's step-1 digest differs from A and B; the replay copies A's lines
    c = [line(s, w="z" if s == 1 else "a") for s in range(6)]
    a_lines = {0: [line(s) for s in range(6)]}
    watch = train("C", watched=tuple(range(6)))
    assert run(lines={"C": c}, watch=watch, watch_steps=a_lines, replay_of="A").replay_ok is True
    assert run(lines={"C": c}, watch=watch, watch_steps=a_lines).replay_ok is False  # replays C by default
    for kw in ({"watch": watch}, {"watch_steps": a_lines}, {"watch": watch, "watch_steps": a_lines, "replay_of": "X"}):
        ex = run(**kw)
        assert (ex.replay_ok, ex.watch_coverage) == (None, CLEAN.watch_coverage)


def test_with_repeats_every_launch_is_compared_against_the_first_baseline_launch() -> None:
    labels = ("A1", "C1", "B1", "B2", "C2", "A2")  # launch_labels(2)
    trains = {label: train(label) for label in labels}
    trains["C2"] = train("C2", recipe=RECIPE.model_copy(update={"trainable_params": 5}))
    ex = exactness({label: {0: [line(s) for s in range(6)]} for label in labels}, trains,
                   {label: reload(t) for label, t in trains.items()}, {"lr": 1e-3}, n_steps=6, digest_first=1,
                   digest_last=2, labels=labels, replay_of="C1")
    assert ex.recipe_differences == ["arm C2: trainable_params 5, arm A1 0"]
    assert ex.reload_ok == dict.fromkeys(labels, True) and ex.problems == ["recipe violation: arm C2: trainable_params "
                                                                          "5, arm A1 0"]


def test_the_observed_recipe_is_judged_by_the_runs_own_recipe_file_not_r3s() -> None:
    """A run names its frozen recipe file: its observation specs and optimizer are what the observed recipe is checked
    against (R3's file only for runs recorded before recipe files)."""
    from protocol.recipe import v1_recipe

    r3 = v1_recipe().recipe
    assert run().recipe_differences == [] and run(recipe_file=r3).recipe_differences == []
    sgd = r3.model_copy(update={"optimizer": "SGD"})
    ex = run(recipe_file=sgd)
    assert not ex.exact and ex.recipe_differences == [f"arm {arm}: optimizer {RECIPE.optimizer}, frozen SGD"
                                                      for arm in "ACB"]
