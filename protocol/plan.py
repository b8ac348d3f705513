"""The plan of a run: the one place where its packages, their order and the triplets of launches are listed.

repeats = 1 is the owner's run (checks, train/reload A, C, B, score); K >= 2 runs K fresh triplets, order balanced.
"""

from __future__ import annotations

from dataclasses import dataclass

ARMS = ("baseline", "candidate")
ROLES = ("A", "C", "B")  # the owner's roles in one triplet, in the owner's launch order: baseline, candidate, baseline
BASELINE_ROLES = ("A", "B")  # the two baseline launches of a triplet
KINDS = ("checks", "train", "reload", "replay", "score")  # the kinds of the plan's packages


@dataclass(frozen=True)
class PlannedPackage:
    name: str
    kind: str  # one of KINDS
    arm_label: str | None = None  # A | C | B (repeats 1); A1, C1, B1, B2, C2, A2, ... (repeats K)

    @property
    def arm(self) -> str | None:
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


def triplets(repeats: int) -> list[Triplet]:
    """K triplets; odd ones launch A C B, even ones B C A, so that label A is first as often as B (position effect).

    Every triplet keeps the owner's shape baseline -> candidate -> baseline, so linear drift cancels inside each.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if repeats == 1:
        return [Triplet(1, *ROLES, order=ROLES)]
    out = []
    for k in range(1, repeats + 1):
        a, c, b = f"A{k}", f"C{k}", f"B{k}"
        out.append(Triplet(k, a, c, b, (a, c, b) if k % 2 else (b, c, a)))
    return out


def plan(repeats: int = 1) -> tuple[PlannedPackage, ...]:
    """checks, train/reload of every launch in triplet order, the watched replay watch-C, then score."""
    pkgs = [PlannedPackage("checks", "checks")]
    for t in triplets(repeats):
        for label in t.order:
            pkgs.append(PlannedPackage(f"train-{label}", "train", label))
            pkgs.append(PlannedPackage(f"reload-{label}", "reload", label))
    # untimed, after the triplets so that nothing sits between timed launches: the first triplet's C again, every
    # step watched (its digests are compared with that launch's)
    pkgs.append(PlannedPackage("watch-C", "replay", replay_label(repeats)))
    pkgs.append(PlannedPackage("score", "score"))
    return tuple(pkgs)


def replay_label(repeats: int = 1) -> str:
    """The candidate launch that the watched replay watch-C repeats: C, or C1 with repeats."""
    return triplets(repeats)[0].c


def package_names(repeats: int = 1) -> tuple[str, ...]:
    return tuple(p.name for p in plan(repeats))


def launch_labels(repeats: int = 1) -> tuple[str, ...]:
    """Train labels in launch order."""
    return tuple(p.arm_label for p in plan(repeats) if p.kind == "train" and p.arm_label)


def score_labels(repeats: int = 1) -> tuple[str, str]:
    """The checkpoints the scorer reads: the first triplet's baseline A and candidate C (all launches are exact)."""
    first = triplets(repeats)[0]
    return first.a, first.c


def kept_checkpoints(repeats: int = 1) -> frozenset[str]:
    """Labels whose checkpoints must outlive their reload (the scorer's); every other one is deleted after it."""
    return frozenset(score_labels(repeats))
