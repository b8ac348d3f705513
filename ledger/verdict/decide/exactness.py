"""Numerical exactness of one run: per-step digests, reload digests, RNG, observed recipe, forbidden dtypes.

Pure Python over the probe's step lines and the worker results; every check names its first mismatch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ledger.verdict.decide.mismatch import Mismatch, Steps, by_step
from ledger.verdict.decide.recipe_check import model_differences, recipe_differences, structure_differences
from ledger.verdict.decide.trainer_numbers import first_scalar_mismatch, logged_nothing
from protocol.plan import ROLES
from protocol.recipe import RecipeFile
from protocol.results import ReloadResult, StepRecord, TrainResult


@dataclass(frozen=True)
class ForbiddenSeen:
    arm: str
    rank: int
    step: int
    op: str
    dtype: str
    package: str = ""  # train-X (the in-run watch of the warm-up) or watch-C (the watched replay)


@dataclass(frozen=True)
class Exactness:
    exact: bool
    ranks: int
    digest_first: int
    digest_last: int
    steps_compared: int
    tensors_compared: int
    first_mismatch: Mismatch | None
    mismatches: int  # how many (step, rank, tensor) places disagree in the digest steps
    reload_ok: dict[str, bool]
    rng_equal: bool
    rng_first_mismatch: Mismatch | None
    recipe_ok: bool
    recipe_differences: list[str]
    forbidden: list[ForbiddenSeen]
    problems: list[str] = field(default_factory=list)  # every reason the run is not exact, in words
    watched_steps: int = 0  # (arm, rank, step) lines recorded with the forbidden-dtype watch on
    watch_passed: dict[str, int] = field(default_factory=dict)  # HOPs / compiled regions let through -> calls
    watch_uninspected: list[str] = field(default_factory=list)  # what the watch could not look into
    scalars_equal: bool = True
    scalars_compared: int = 0
    scalars_first_mismatch: Mismatch | None = None
    scalar_steps: tuple[int, int] = (0, 0)
    replay_ok: bool | None = None  # watch-C replayed train-C bit for bit (None: no replay in the run)
    replay_first_mismatch: Mismatch | None = None
    watch_coverage: dict[str, list[int]] = field(default_factory=dict)  # package -> steps the watch covered


def first_digest_mismatch(
    steps: Steps, labels: Sequence[str], digest_steps: Sequence[int], ranks: Sequence[int]
) -> tuple[Mismatch | None, int, int]:
    """Compare every digest of every digest step on every rank across arms, in (step, rank, tensor) order.

    Returns the first mismatch, the number of mismatching places and the number of tensors compared.
    """
    first: Mismatch | None = None
    count = 0
    compared = 0
    indexed = {label: {rank: by_step(steps[label].get(rank, ())) for rank in ranks} for label in labels}
    for step in digest_steps:
        for rank in ranks:
            lines = {label: indexed[label][rank].get(step) for label in labels}
            missing = [label for label, rec in lines.items() if rec is None or rec.digests is None]
            if missing:
                count += 1
                first = first or Mismatch(
                    "missing", step, rank, None, {}, f"no digests from arm(s) {', '.join(missing)}"
                )
                continue
            digests = {label: rec.digests or {} for label, rec in lines.items() if rec is not None}
            names = sorted(set().union(*(d.keys() for d in digests.values())))
            tensor_mismatch = False
            for name in names:
                compared += 1
                values = {label: digests[label].get(name) for label in labels}
                if len(set(values.values())) != 1:
                    count += 1
                    tensor_mismatch = True
                    first = first or Mismatch(
                        "digests", step, rank, name, values, _differs(values, f"digest of {name}")
                    )
            combined = {label: rec.combined for label, rec in lines.items() if rec is not None}
            # a combined-only difference (equal tensors) still breaks exactness: count it on its own
            if len(set(combined.values())) != 1 and not tensor_mismatch:
                count += 1
                first = first or Mismatch(
                    "combined", step, rank, None, dict(combined), _differs(combined, "combined digest")
                )
    return first, count, compared


def _differs(values: Mapping[str, str | None], what: str) -> str:
    shown = ", ".join(f"{k}={(v or 'absent')[:16]}" for k, v in values.items())
    return f"{what} differs ({shown})"


def final_and_reload(
    trains: Mapping[str, TrainResult], reloads: Mapping[str, ReloadResult], labels: Sequence[str]
) -> tuple[Mismatch | None, dict[str, bool]]:
    """Final parameter/Adam digests: each train equals its reload, and the arms equal each other."""
    first: Mismatch | None = None
    reload_ok: dict[str, bool] = {}
    for label in labels:
        if label not in reloads:  # an A/A launch of `orch calibrate` runs no reload (issue 51)
            continue
        ok = True
        train_ranks = {r.rank: r for r in trains[label].ranks}
        reload_ranks = {r.rank: r for r in reloads[label].ranks}
        if set(train_ranks) != set(reload_ranks):
            ok = False
            first = first or Mismatch(
                "reload",
                None,
                None,
                None,
                {},
                f"train {label} ranks {sorted(train_ranks)} but reload {label} ranks {sorted(reload_ranks)}",
            )
        for rank in sorted(set(train_ranks) & set(reload_ranks)):
            t, r = train_ranks[rank], reload_ranks[rank]
            if t.checkpoint_sha256 != r.checkpoint_sha256:
                ok = False
                first = first or Mismatch(
                    "reload",
                    None,
                    rank,
                    None,
                    {label: t.checkpoint_sha256, f"reload {label}": r.checkpoint_sha256},
                    f"reload {label} loaded a different checkpoint than train {label} wrote",
                )
            for name in sorted(set(t.final_digests) | set(r.digests)):
                if t.final_digests.get(name) != r.digests.get(name):
                    ok = False
                    values = {label: t.final_digests.get(name), f"reload {label}": r.digests.get(name)}
                    first = first or Mismatch(
                        "reload", None, rank, name, values, _differs(values, f"final digest of {name}")
                    )
            if t.final_combined != r.combined:
                ok = False
                values = {label: t.final_combined, f"reload {label}": r.combined}
                detail = _differs(values, "final combined")
                first = first or Mismatch("reload", None, rank, None, values, detail)
        reload_ok[label] = ok
    # the final state after the last step must also be the same bits in every arm
    ranks = sorted({r.rank for label in labels for r in trains[label].ranks})
    for rank in ranks:
        finals = {label: {r.rank: r for r in trains[label].ranks}.get(rank) for label in labels}
        names = sorted({n for f in finals.values() if f is not None for n in f.final_digests})
        for name in names:
            values = {label: (f.final_digests.get(name) if f else None) for label, f in finals.items()}
            if len(set(values.values())) != 1:
                first = first or Mismatch(
                    "final", None, rank, name, values, _differs(values, f"final digest of {name}")
                )
                break
    return first, reload_ok


def first_rng_mismatch(steps: Steps, labels: Sequence[str], n_steps: int, ranks: Sequence[int]) -> Mismatch | None:
    """CPU and CUDA generator fingerprints must be equal across arms at every step on every rank."""
    for step in range(n_steps):
        for rank in ranks:
            recs = {label: by_step(steps[label].get(rank, ())).get(step) for label in labels}
            for gen in ("cpu", "cuda"):
                values = {label: (getattr(rec.rng, gen) if rec is not None else None) for label, rec in recs.items()}
                if len(set(values.values())) != 1:
                    detail = _differs(values, f"{gen} RNG state")
                    return Mismatch("rng", step, rank, f"rng.{gen}", values, detail)
            lrs = {label: (repr(rec.lr) if rec is not None else None) for label, rec in recs.items()}
            if len(set(lrs.values())) != 1:
                return Mismatch("lr", step, rank, None, lrs, _differs(lrs, "learning rate"))
    return None


def replay_mismatch(
    train: TrainResult, train_steps: Mapping[int, Sequence[StepRecord]], watch: TrainResult,
    watch_steps: Mapping[int, Sequence[StepRecord]], digest_steps: Sequence[int], n_steps: int,
    scalar_steps: Sequence[int],
) -> Mismatch | None:
    """watch-C replayed train-C: the same digests, RNG states, trainer numbers and final state on every rank."""
    pair: Steps = {"train-C": train_steps, "watch-C": watch_steps}
    ranks = sorted({r.rank for r in train.ranks} | {r.rank for r in watch.ranks})
    labels = ("train-C", "watch-C")
    first, _, _ = first_digest_mismatch(pair, labels, digest_steps, ranks)
    first = first or first_rng_mismatch(pair, labels, n_steps, ranks)
    first = first or first_scalar_mismatch(pair, labels, scalar_steps, ranks)[0]
    if first is None:
        finals = {label: {r.rank: r.final_digests for r in res.ranks} for label, res in zip(labels, (train, watch),
                                                                                             strict=True)}
        for rank in ranks:
            a, b = finals["train-C"].get(rank, {}), finals["watch-C"].get(rank, {})
            for name in sorted(set(a) | set(b)):
                if a.get(name) != b.get(name):
                    values = {"train-C": a.get(name), "watch-C": b.get(name)}
                    return Mismatch("final", None, rank, name, values, _differs(values, f"final digest of {name}"))
    return first


def exactness(
    steps: Steps,
    trains: Mapping[str, TrainResult],
    reloads: Mapping[str, ReloadResult],
    recipe: Mapping[str, Any],
    *,
    n_steps: int,
    digest_first: int,
    digest_last: int,
    labels: Sequence[str] = ROLES,
    replay_of: str = ROLES[1],  # the candidate launch that watch-C replays (C1 with repeats)
    model: Mapping[str, Any] | None = None,
    watch: TrainResult | None = None,
    watch_steps: Mapping[int, Sequence[StepRecord]] | None = None,
    recipe_file: RecipeFile | None = None,
) -> Exactness:
    """Every exactness check of DESIGN.md section 1 over one run's three train and three reload results, the
    trainer's own numbers, what the recipe fixes about parameters and optimizer, and the watched replay of C."""
    problems: list[str] = []
    worlds = {label: trains[label].world_size for label in labels}
    if len(set(worlds.values())) != 1:
        problems.append(f"world sizes differ across arms: {worlds}")
    n_ranks = max(worlds.values())
    ranks = list(range(n_ranks))
    digest_steps = list(range(digest_first, digest_last + 1))
    for label in labels:
        seen = list(trains[label].digest_steps)
        if seen != digest_steps:
            shown = f"{seen[0]}-{seen[-1]}" if seen else "none"
            wanted = f"{digest_first}-{digest_last}"
            problems.append(f"arm {label}: digest steps {shown} are not the protocol's {wanted}")
        if not trains[label].stopped_cleanly:
            problems.append(f"arm {label}: the trainer was not stopped cleanly")
    first, count, compared = first_digest_mismatch(steps, labels, digest_steps, ranks)
    final_first, reload_ok = final_and_reload(trains, reloads, labels)
    rng_first = first_rng_mismatch(steps, labels, n_steps, ranks)
    if first is not None:
        problems.append(first.line())
    if final_first is not None:
        problems.append(final_first.line())
    if rng_first is not None:
        problems.append(rng_first.line())
    diffs: list[str] = []
    for label in labels:
        diffs += recipe_differences(trains[label].observed_recipe, recipe, label, recipe_file)
        if model is not None:
            diffs += model_differences(trains[label].observed_recipe, model, label)
    diffs += structure_differences({label: trains[label].observed_recipe for label in labels}, labels[0])
    problems += [f"recipe violation: {d}" for d in diffs]
    # the trainer's numbers: record k+1 holds what step k logs after its optimizer step, so one step past the digests
    scalar_steps = list(range(digest_first, min(n_steps - 1, digest_last + 1) + 1))
    scalar_first, _, scalars_compared = first_scalar_mismatch(steps, labels, scalar_steps, ranks)
    if scalar_first is not None:
        problems.append(scalar_first.line())
    for label in logged_nothing(steps, labels, scalar_steps):
        problems.append(
            f"arm {label}: its trainer logged no training step (no number through wandb.log or logging in steps "
            f"{scalar_steps[0]}-{scalar_steps[-1]}); its own numbers cannot be compared"
        )
    forbidden = [
        ForbiddenSeen(label, rank, op.step, op.op, op.dtype, f"train-{label}")
        for label in labels
        for rank, recs in sorted(steps[label].items())
        for rec in recs
        for op in rec.forbidden
    ]
    coverage = {f"train-{label}": list(trains[label].watched_steps) for label in labels}
    replay_first: Mismatch | None = None
    replay_ok: bool | None = None
    if watch is not None and watch_steps is not None and replay_of in trains:
        coverage["watch-C"] = list(watch.watched_steps)
        in_run = set(trains[replay_of].watched_steps)
        # every step of the candidate is watched by train-C (its warm-up) or by the replay (the rest; issue 51)
        unwatched = sorted(set(range(n_steps)) - in_run - set(watch.watched_steps))
        if unwatched:
            problems.append(f"watch-C: steps {_span(unwatched)} of the candidate were watched neither by "
                            f"train-{replay_of} (steps {_span(sorted(in_run))}) nor by the replay (steps "
                            f"{_span(watch.watched_steps)}); every step 0-{n_steps - 1} must be")
        # what the in-run watch saw is listed once, from train-C; the replay adds the steps it alone watched
        forbidden += [
            ForbiddenSeen(replay_of, rank, op.step, op.op, op.dtype, "watch-C")
            for rank, recs in sorted(watch_steps.items())
            for rec in recs
            for op in rec.forbidden
            if op.step not in in_run
        ]
        replay_first = replay_mismatch(trains[replay_of], steps[replay_of], watch, watch_steps, digest_steps, n_steps,
                                       scalar_steps)
        replay_ok = replay_first is None
        if replay_first is not None:
            problems.append(f"watch-C did not replay train-C (its forbidden-dtype watch proves nothing): "
                            f"{replay_first.line()}")
    if forbidden:
        f0 = forbidden[0]
        replayed = ", watched replay" if f0.package.startswith("watch") else ""
        problems.append(
            f"forbidden dtype: {f0.op} in {f0.dtype} at step {f0.step} (arm {f0.arm}{replayed}, rank {f0.rank})"
            + (f" and {len(forbidden) - 1} more" if len(forbidden) > 1 else "")
        )
    passed: dict[str, int] = {}
    uninspected: set[str] = set()
    watched = 0
    for label in labels:
        for recs in steps[label].values():
            for rec in recs:
                watched += rec.watched
                for name, n in rec.hops.items():
                    passed[name] = passed.get(name, 0) + n
                uninspected.update(rec.uninspected)
    return Exactness(
        exact=not problems,
        ranks=n_ranks,
        digest_first=digest_first,
        digest_last=digest_last,
        steps_compared=len(digest_steps),
        tensors_compared=compared,
        first_mismatch=first or final_first,
        mismatches=count,
        reload_ok=reload_ok,
        rng_equal=rng_first is None,
        rng_first_mismatch=rng_first,
        recipe_ok=not diffs,
        recipe_differences=diffs,
        forbidden=forbidden,
        problems=problems,
        watched_steps=watched,
        watch_passed=dict(sorted(passed.items())),
        watch_uninspected=sorted(uninspected),
        scalars_equal=scalar_first is None,
        scalars_compared=scalars_compared,
        scalars_first_mismatch=scalar_first,
        scalar_steps=(scalar_steps[0], scalar_steps[-1]),
        replay_ok=replay_ok,
        replay_first_mismatch=replay_first,
        watch_coverage=coverage,
    )


def _span(steps: Sequence[int]) -> str:
    return f"{min(steps)}-{max(steps)}" if steps else "none"
