"""Before the lock: what this host's calibration lets the run decide (issue 50).

A launch is expensive where it matters (hours of eight GPUs), and whether its interval can decide anything is known
before it starts: the audit will pool the host's A/A calibrations, so the width a candidate as steady as the
baseline gets is their t * sqrt(s^2 / K + s^2 / n). One line says it, with the K a +-5% interval needs, so that a
run that cannot decide is seen as such before any GPU time. It changes nothing the run does or the audit reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from ledger.verdict.decide.sequential_doc import calibration_spread
from ledger.verdict.decide.stats import (
    TARGET_HALF_WIDTH,
    expected_half_width,
    position_variance,
    triplets_needed,
    width_floor,
)
from orchestrator.run.sequential_launch import Lookup, calibration_block


class Planned(Lookup, Protocol):
    """What the forecast reads of orchestrator.run.run_plan.RunContext."""

    @property
    def calibrates(self) -> bool: ...

    @property
    def shape(self) -> tuple[int, bool]: ...


def forecast_line(ctx: Planned, most_triplets: int | None) -> str | None:
    """The line, or None for an A/A launch of `orch calibrate` (it measures the spread, it does not use one).
    `most_triplets`: a sequential run's maximum; None: the protocol's fixed repeats."""
    if ctx.calibrates:
        return None
    k = most_triplets if most_triplets is not None else ctx.shape[0]
    block = calibration_block(ctx, None, reference=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    cal = calibration_spread(block)
    runs = "at most " if most_triplets is not None else ""
    if cal is None:
        bound = ("a one-triplet run cannot be bounded: its interval will be unbounded and its verdict "
                 "'no difference shown'" if k == 1 else f"the interval will use the run's own spread of {runs}{k} "
                 "triplets alone")
        return f"forecast: {block.get('words', 'no usable A/A calibration')}; {bound}"
    launches = cal.position.launches if cal.position is not None else None
    of = f", {launches} A/A launches" if launches else ""
    need = triplets_needed(cal.sd, cal.df, carried=position_variance(cal))
    if need is not None:
        target = f"+-{TARGET_HALF_WIDTH:.0%} needs K = {need}"
    else:
        target = (f"+-{TARGET_HALF_WIDTH:.0%} is out of reach at any K: the A/A mean every triplet has subtracted is "
                  f"known only to +-{width_floor(position_variance(cal)):.1%}; more A/A launches (`orch calibrate` "
                  "again) narrow it")
    return (f"forecast: this host's calibration (SD {cal.sd:.4f} of the paired log speedup, df {cal.df:g}{of}) gives "
            f"about +-{expected_half_width(cal, k):.1%} with {runs}{k} triplet(s) for a candidate whose steps are as "
            f"steady as the baseline's (a noisier one gets wider); {target}")


def forecast(ctx: Planned, most_triplets: int | None, say: Callable[[str], None]) -> None:
    line = forecast_line(ctx, most_triplets)
    if line is not None:
        say(line)
