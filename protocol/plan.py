"""The plan of a run: the one place where its packages, their order and the triplets of launches are listed.

repeats = 1 is the owner's run (checks, prime, train/reload A, C, B, score); K >= 2 runs K fresh triplets, order
balanced. The untimed prime fills the baseline's compile cache that every later package starts from.
A sequential run (repeats: auto) numbers its triplets from the first, and its plan grows one triplet at a time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

ARMS = ("baseline", "candidate")
ROLES = ("A", "C", "B")  # the owner's roles in one triplet, in the owner's launch order: baseline, candidate, baseline
BASELINE_ROLES = ("A", "B")  # the two baseline launches of a triplet
KINDS = ("checks", "prime", "train", "reload", "replay", "score")  # the kinds of the plan's packages
AFTER_TRIPLETS = ("watch-C", "score")  # the untimed packages after the last reload; an A/A launch runs neither
MAX_REPEATS = 32  # triplets in one run, fixed or sequential
DEFAULT_MAX_REPEATS = 6  # repeats: auto without measurement.max_repeats, and --until-decided without --max-repeats
DEFAULT_TARGET_HALF_WIDTH = 0.05  # repeats: auto: stop once the repeated interval is +-5 %


@dataclass(frozen=True)
class PlannedPackage:
    name: str
    kind: str  # one of KINDS
    arm_label: str | None = None  # A | C | B (repeats 1); A1, C1, B1, B2, C2, A2, ... (repeats K)

    @property
    def arm(self) -> str | None:
        if self.kind == "prime":  # the baseline's trainer, untimed, compiling into the baseline's cache
            return "baseline"
        return arm_of(self.arm_label) if self.arm_label else None


@dataclass(frozen=True)
class Triplet:
    """One fresh baseline -> candidate -> baseline triplet: its labels and the order they were launched in."""

    index: int  # 1-based
    a: str  # label of the baseline launch called A (the owner's ratio uses mean(A, B) / C)
    c: str
    b: str
    order: tuple[str, str, str]  # launch order of the three labels

    @property
    def labels(self) -> dict[str, str]:
        """Owner's role (A, C, B) -> this triplet's label."""
        return dict(zip(ROLES, (self.a, self.c, self.b), strict=True))


def arm_of(label: str) -> str:
    """A* and B* are baseline launches, C* candidate launches."""
    if not label or label[0] not in ROLES:
        raise ValueError(f"not an arm label: {label!r}")
    return "candidate" if label[0] == "C" else "baseline"


def triplets(repeats: int, sequential: bool = False) -> list[Triplet]:
    """K triplets; odd ones launch A C B, even ones B C A, so that label A is first as often as B (position effect).

    Every triplet keeps the owner's shape baseline -> candidate -> baseline, so linear drift cancels inside each.
    A sequential run numbers its labels (A1, C1, B1) even when it stops after one triplet: when the first triplet
    runs, nobody knows whether a second will follow, and the first K triplets of any run are those of triplets(K).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if repeats == 1 and not sequential:
        return [Triplet(1, *ROLES, order=ROLES)]
    out = []
    for k in range(1, repeats + 1):
        a, c, b = f"A{k}", f"C{k}", f"B{k}"
        out.append(Triplet(k, a, c, b, (a, c, b) if k % 2 else (b, c, a)))
    return out


def triplet_packages(t: Triplet) -> tuple[PlannedPackage, ...]:
    """train and reload of each of the triplet's launches, in its launch order."""
    return tuple(PlannedPackage(f"{kind}-{label}", kind, label) for label in t.order for kind in ("train", "reload"))


def plan(
    repeats: int = 1, sequential: bool = False, prime: bool = True, calibration: bool = False,
    trailing_reload: bool | None = None,
) -> tuple[PlannedPackage, ...]:
    """checks, prime, train/reload of every launch in triplet order, the watched replay watch-C, then score.

    plan(K + 1, sequential=True) is plan(K, sequential=True) with triplet K + 1 inserted before watch-C: a
    sequential run grows its plan there, one triplet per look. prime=False: the plan of runs recorded before the
    prime package existed (their evidence is read with it). calibration=True: an A/A launch of `orch calibrate`
    ends after its triplet: its candidate is the baseline, so a watched replay of it checks nothing the two baseline
    launches do not, and a calibration reads no quality metric. Everything up to the last reload, the order and the
    gaps between the timed launches included, is the owner's plan. trailing_reload (default: not calibration): an
    A/A launch keeps the reloads that sit between its timed launches (the gaps stay the owner's, and their digests are
    part of its exactness) and drops the one after its last timed launch, which no calibration figure reads (issue 51;
    one recorded before that is read with it: trailing_reload=True)."""
    pkgs = [PlannedPackage("checks", "checks")]
    if prime:
        pkgs.append(PlannedPackage("prime", "prime"))
    for t in triplets(repeats, sequential):
        pkgs.extend(triplet_packages(t))
    if calibration:
        if not trailing_reload:
            last = max(i for i, p in enumerate(pkgs) if p.kind == "train")
            pkgs = pkgs[: last + 1] + [p for p in pkgs[last + 1 :] if p.kind != "reload"]
        return tuple(pkgs)
    # untimed, after the triplets so that nothing sits between timed launches: the first triplet's C again, every
    # step watched (its digests are compared with that launch's)
    watch, score = AFTER_TRIPLETS
    pkgs.append(PlannedPackage(watch, "replay", replay_label(repeats, sequential)))
    pkgs.append(PlannedPackage(score, "score"))
    return tuple(pkgs)


def replay_label(repeats: int = 1, sequential: bool = False) -> str:
    """The candidate launch that the watched replay watch-C repeats: C, or C1 with repeats."""
    return triplets(repeats, sequential)[0].c


def package_names(
    repeats: int = 1, sequential: bool = False, prime: bool = True, calibration: bool = False,
    trailing_reload: bool | None = None,
) -> tuple[str, ...]:
    return tuple(p.name for p in plan(repeats, sequential, prime, calibration, trailing_reload))


def launch_labels(repeats: int = 1, sequential: bool = False) -> tuple[str, ...]:
    """Train labels in launch order."""
    return tuple(p.arm_label for p in plan(repeats, sequential) if p.kind == "train" and p.arm_label)


def score_labels(repeats: int = 1, sequential: bool = False) -> tuple[str, str]:
    """The checkpoints the scorer reads: the first triplet's baseline A and candidate C (all launches are exact)."""
    first = triplets(repeats, sequential)[0]
    return first.a, first.c


def kept_checkpoints(repeats: int = 1, sequential: bool = False) -> frozenset[str]:
    """Labels whose checkpoints must outlive their reload (the scorer's); every other one is deleted after it.

    The scorer reads the first triplet's, so a sequential run knows them before it knows how many triplets it takes.
    """
    return frozenset(score_labels(repeats, sequential))


_NUMBERED = re.compile(r"^(?:train|reload)-[ACB]([1-9][0-9]*)$")


def triplets_in(package_names: Iterable[str]) -> int:
    """The number of numbered triplets that package names (e.g. a run's ledger records) reach: the largest k of
    train-A{k} / reload-C{k} ...; 0 when there is none."""
    return max((int(m.group(1)) for n in package_names if (m := _NUMBERED.match(n))), default=0)
