"""Where two runs' probe step lines first differ: the (step, rank, tensor) of the first digest mismatch.

Pure Python on parsed JSON lines (no torch), shared by the tests and the audit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _index(lines: Iterable[Mapping[str, Any]]) -> dict[tuple[int, int], Mapping[str, str]]:
    out: dict[tuple[int, int], Mapping[str, str]] = {}
    for rec in lines:
        digests = rec.get("digests")
        if digests is not None:
            out[(int(rec["step"]), int(rec["rank"]))] = digests
    return out


def first_mismatch(
    steps_a: Iterable[Mapping[str, Any]], steps_b: Iterable[Mapping[str, Any]]
) -> tuple[int, int, str] | None:
    """First (step, rank, tensor name) whose digests differ, in step, rank, name order; None when all agree.

    A (step, rank) present on one side only, or a name present on one side only, is a mismatch too
    (tensor name "<missing step>" or the missing name).
    """
    a = _index(steps_a)
    b = _index(steps_b)
    for key in sorted(set(a) | set(b)):
        step, rank = key
        if key not in a or key not in b:
            return step, rank, "<missing step>"
        da, db = a[key], b[key]
        for name in sorted(set(da) | set(db)):
            if da.get(name) != db.get(name):
                return step, rank, name
    return None
