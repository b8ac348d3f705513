"""The audit's compile-cache section: what the prime sealed, what each launch took from it and tuned itself, what
the priming cost, and, when C is not bit for bit the baseline, which of C's own kernels may explain it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from protocol.plan import arm_of
from protocol.run_record import CacheUse, RunRecord

TRAINER_KINDS = ("train", "replay")


def _launch(use: CacheUse) -> dict[str, Any]:
    return {
        "taken": use.taken, "taken_tuned": use.taken_tuned, "made": use.made, "made_tuned": use.made_tuned,
        "changed": use.changed, "tuned_sha256": use.tuned_sha256,
        "baseline_tuned_sha256": use.baseline_tuned_sha256,
        "own_kernels": [k.model_dump() for k in use.own_kernels],
    }


def compile_cache_doc(
    run: RunRecord, gpu_seconds: Mapping[str, float], exact: bool, mode: str = "prime",
    prime_steps: tuple[int, int] | None = None,
) -> dict[str, Any] | None:
    """None for a run recorded before the prime package existed. measurement.compile: none: no prime ran, and orch
    found every package's compile cache empty after it (a package that compiled failed the run, named).
    The baseline cache is the one this run's prime sealed, or a kept one it loaded (issue 51: `loaded` says which,
    when and by which run it was sealed). `unprimed` names every baseline launch that compiled or tuned what the
    sealed cache did not hold (the prime's own step count, recorded with it since issue 51; for older runs
    prime_steps: (measurement.prime_steps, steps) when it shortened the prime)."""
    if mode == "none":
        return {"mode": "none", "checked": [e.name for e in run.packages if e.status == "ok"],
                "prime_gpu_seconds": 0.0, "prime_share": 0.0, "diagnosis": []}
    prime = run.package("prime")
    kept = run.compile_cache
    if prime is not None and prime.compile_cache is not None:
        sealed = prime.compile_cache
        base = {"files": sealed.baseline_files, "tuned": sealed.baseline_tuned,
                "tuned_sha256": sealed.baseline_tuned_sha256}
        if sealed.prime_steps is not None and sealed.launch_steps is not None:
            prime_steps = (sealed.prime_steps, sealed.launch_steps)
    elif kept is not None and kept.reused:
        base = {"files": kept.files, "tuned": kept.tuned, "tuned_sha256": kept.tuned_sha256}
        prime_steps = (kept.prime_steps or 0, kept.launch_steps or 0)
    else:
        return None
    launches: dict[str, dict[str, Any]] = {}
    arms: dict[str, str] = {}
    for entry in run.packages:
        if entry.compile_cache is None or entry.kind == "prime":
            continue
        launches[entry.name] = _launch(entry.compile_cache)
        if entry.kind in TRAINER_KINDS and entry.arm_label:
            arms[entry.name] = arm_of(entry.arm_label)
    same = sorted(n for n in arms if launches[n]["baseline_tuned_sha256"] == base["tuned_sha256"])
    total = sum(gpu_seconds.values())
    cost = gpu_seconds.get("prime", 0.0)
    short = {} if prime_steps is None else {"prime_steps": prime_steps[0], "unprimed": unprimed(launches, arms,
                                                                                                  prime_steps)}
    loaded = {} if kept is None else {"loaded": {
        "cache": kept.name, "reused": kept.reused, "sealed_by": kept.sealed_by, "sealed_at": kept.sealed_at,
        "manifest_sha256": kept.manifest_sha256, "entries": kept.entries, "reason": kept.reason,
        "sealing_prime_gpu_seconds": kept.prime_gpu_seconds, "checked_s": kept.checked_s}}
    return {
        "baseline": base,
        "launches": launches,
        "same_baseline_picks": same,
        "differing_baseline_picks": sorted(set(arms) - set(same)),
        "prime_gpu_seconds": cost,
        "prime_share": cost / total if total else 0.0,
        "diagnosis": [] if exact else diagnosis(launches, arms),
        **short,
        **loaded,
    }


def unprimed(
    launches: Mapping[str, Mapping[str, Any]], arms: Mapping[str, str], prime_steps: tuple[int, int]
) -> list[str]:
    """Baseline launches that compiled or tuned anything the shortened prime did not reach: their steps may hold
    compile time, and cold ranks or launches may pick apart. (The candidate's launches compile their own kernels;
    a baseline kernel the prime missed shows in A and B as well.)"""
    ran, steps = prime_steps
    return [f"{name} compiled or tuned what the prime's {ran} of {steps} steps did not reach: {what}"
            for name in sorted(arms) if arms[name] == "baseline" and (what := _own_work(launches[name]))]


def _own_work(use: Mapping[str, Any]) -> str | None:
    """What a launch tuned or compiled beyond the baseline's sealed cache; None when nothing."""
    own = list(use["own_kernels"])
    if own:
        return _kernels(own)
    return f"{use['made']} compiled artifact(s)" if use["made"] else None


def _kernels(own: Sequence[Mapping[str, Any]]) -> str:
    shown = [f"{k['kernel']} ({k['pick']}" + (f"; the baseline's: {k['baseline_pick']})" if k["baseline_pick"]
                                             else "; not in the baseline's cache)") for k in own[:3]]
    return "; ".join(shown) + (f" and {len(own) - 3} more" if len(own) > 3 else "")


def diagnosis(launches: Mapping[str, Mapping[str, Any]], arms: Mapping[str, str]) -> list[str]:
    """Lines a user can act on: kernels a launch tuned itself instead of taking the baseline's primed pick."""
    lines: list[str] = []
    for name in sorted(arms):
        use = launches[name]
        own = list(use["own_kernels"])
        if arms[name] == "candidate":
            if own:
                lines.append(f"{name} tuned {len(own)} kernel(s) itself instead of the baseline's primed pick: "
                             f"{_kernels(own)}; a different pick sums in another order, so its bits may differ "
                             "without any change to the arithmetic of its code")
            elif use["made"]:
                lines.append(f"{name} compiled {use['made']} artifact(s) that the baseline's cache did not have "
                             "(no tuned pick among them): a difference is consistent with compile-time code "
                             "generation of the candidate's own kernels")
        elif what := _own_work(use):
            lines.append(f"{name} (baseline) compiled or tuned what the prime did not reach: {what}; cold ranks "
                         "can pick differently: the prime runs the baseline's steps, so report this trainer's "
                         "step-dependent compilation")
    if not lines:
        lines.append("every launch ran the baseline's primed kernel picks and compiled nothing of its own: the "
                     "difference is not explained by compile-time tuning")
    return lines
