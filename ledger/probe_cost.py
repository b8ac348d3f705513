"""The probe's own cost per step: the time of its work at a step's boundary as a fraction of that step's duration,
per launch and rank, split into digests and the rest, against the goals (<= 1% without digests, <= 3% with)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from protocol.results import StepRecord

GOAL_WITHOUT_DIGESTS = 0.01
GOAL_WITH_DIGESTS = 0.03


@dataclass(frozen=True)
class BoundaryCost:
    """Step k's boundary: the probe's seconds there (whole when recorded, else probe_s) and its digest part."""

    step: int
    duration_s: float  # the step's own duration (probe work excluded)
    probe_s: float  # the boundary's whole time when the next line recorded it (prev_boundary_s), else probe_s
    digest_s: float | None  # None: no digest ran, or a record older than digest_s
    digests: bool  # a digest ran at this boundary
    whole: bool  # probe_s includes the record's write (the next line's prev_boundary_s; the last step has none)

    @property
    def fraction(self) -> float:
        return self.probe_s / self.duration_s if self.duration_s > 0 else float("inf")


def boundary_costs(records: Sequence[StepRecord], n_steps: int) -> list[BoundaryCost]:
    """One rank's launch: the cost of each step's boundary. The boundary after step k is recorded by two lines:
    probe_s and digest_s in step k's, its whole time (record write included) as prev_boundary_s in step k+1's."""
    by_step = {r.step: r for r in records}
    out = []
    for k in sorted(by_step):
        r = by_step[k]
        nxt = by_step.get(k + 1)
        total = nxt.prev_boundary_s if nxt is not None and nxt.prev_boundary_s is not None else None
        # the last step digests for the final digests even when its line carries none; its boundary ends with the
        # probe's stop (summary, checkpoint), which no line records: probe_s is its cost
        last = k == n_steps - 1
        ran = r.digest_s is not None or r.digests is not None or last
        out.append(BoundaryCost(k, r.duration_s, r.probe_s if total is None else total, r.digest_s, ran,
                                total is not None or last))  # fmt: skip
    return out


def _part(costs: Sequence[BoundaryCost]) -> dict[str, Any] | None:
    if not costs:
        return None
    fractions = [c.fraction for c in costs]
    digest = [c.digest_s / c.duration_s for c in costs if c.digest_s is not None and c.duration_s > 0]
    rest = [(c.probe_s - c.digest_s) / c.duration_s for c in costs if c.digest_s is not None and c.duration_s > 0]
    return {
        "steps": [c.step for c in costs],
        "fractions": fractions,
        "median": statistics.median(fractions),
        "max": max(fractions),
        "probe_s_median": statistics.median(c.probe_s for c in costs),
        "digest_median": statistics.median(digest) if digest and len(digest) == len(costs) else None,
        "rest_median": statistics.median(rest) if rest and len(rest) == len(costs) else None,
        "whole": all(c.whole for c in costs),
    }


def probe_cost_doc(
    steps: Mapping[str, Mapping[int, Sequence[StepRecord]]], n_steps: int, warmup: int
) -> dict[str, Any]:
    """audit.json's probe_cost: per launch label and rank, over the timed steps (warmup .. n_steps - 1), the
    fraction probe seconds / step seconds with and without digests; the goal is judged on the worst launch and
    rank's median (the maximum is shown beside it)."""
    rows: list[dict[str, Any]] = []
    for label in sorted(steps):
        for rank in sorted(steps[label]):
            timed = [c for c in boundary_costs(steps[label][rank], n_steps) if warmup <= c.step < n_steps]
            rows.append({
                "launch": label,
                "rank": rank,
                "with_digests": _part([c for c in timed if c.digests]),
                "without_digests": _part([c for c in timed if not c.digests]),
            })  # fmt: skip
    goals = {"with_digests": GOAL_WITH_DIGESTS, "without_digests": GOAL_WITHOUT_DIGESTS}
    worst: dict[str, float | None] = {}
    met: list[bool] = []
    for kind, goal in goals.items():
        medians = [float(r[kind]["median"]) for r in rows if r[kind] is not None]
        worst[kind] = max(medians) if medians else None
        if medians:
            met.append(max(medians) <= goal)
    doc: dict[str, Any] = {
        "timed_steps": [warmup, n_steps - 1],
        "goal": {**goals, "statistic": "median over the timed steps, worst launch and rank"},
        "rows": rows,
        "worst_median_with_digests": worst["with_digests"],
        "worst_median_without_digests": worst["without_digests"],
        "goal_met": all(met) if met else None,
    }
    doc["words"] = probe_cost_words(doc)
    return doc


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def probe_cost_words(doc: Mapping[str, Any]) -> str:
    """One line: the worst medians against the goals, the digest part, and whether the record write is inside."""
    rows = doc["rows"]
    first, last = doc["timed_steps"]
    parts = []
    for kind, goal in (("without_digests", doc["goal"]["without_digests"]),
                       ("with_digests", doc["goal"]["with_digests"])):  # fmt: skip
        worst = doc[f"worst_median_{kind}"]
        if worst is None:
            parts.append(f"{kind.replace('_', ' ')}: no timed step")
            continue
        row = max((r for r in rows if r[kind] is not None), key=lambda r: float(r[kind]["median"]))
        part = row[kind]
        split = ""
        if part["digest_median"] is not None:
            split = f" (digest {_pct(part['digest_median'])}, rest {_pct(part['rest_median'])})"
        mark = "met" if worst <= goal else "missed"
        parts.append(f"{kind.replace('_', ' ')} {_pct(worst)}{split}, max {_pct(part['max'])} "
                     f"(launch {row['launch']} rank {row['rank']}; goal <= {_pct(goal)}: {mark})")  # fmt: skip
    whole = all(r[k] is None or r[k]["whole"] for r in rows for k in ("with_digests", "without_digests"))
    note = "" if whole else "; older records lack the boundaries' record writes: a lower bound"
    return (f"probe cost per step (its own time / the step's duration, median over timed steps {first}-{last}): "
            + "; ".join(parts) + note)  # fmt: skip
