"""Renderings of an audit document: the rich terminal report, audit.md and the step-time plot (PNG).

All three read only the audit document (orch.audit/2, or /1 as recorded); the DEV score appears in the terminal only,
as informational.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from ledger.render import print_whole, whole_table
from ledger.verdict.documents.interval_doc import interval_text, verdict_lines
from ledger.verdict.documents.isolation_doc import isolation_lines
from protocol.plan import ROLES

if TYPE_CHECKING:
    from ledger.verdict.documents.document import AuditResult

ARM_COLORS = {"A": "#1f77b4", "C": "#d62728", "B": "#2ca02c"}
VERDICT_STYLE = {"accepted": "bold green", "no difference shown": "bold yellow", "not exact": "bold red"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ("+" if n > 0 else "")
    return f"{sign}{abs(n) / 2**20:.1f} MiB"


def _peak(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


def window_rows(doc: Mapping[str, Any]) -> list[list[str]]:
    """One row per window: name, steps, A/C/B per-step times (ms: the window's time over its steps), CVs, ratio,
    drift, within noise."""
    rows = []
    for w in doc["speedup"]["windows"]:
        cv = w["cv"]
        n = max(len(w["steps"]), 1)
        rows.append(
            [
                w["name"],
                f"{w['steps'][0]}-{w['steps'][-1]}",
                _ms(w["A"] / n),
                _ms(w["C"] / n),
                _ms(w["B"] / n),
                f"{cv['A'] * 100:.1f}/{cv['C'] * 100:.1f}/{cv['B'] * 100:.1f}",
                f"{w['ratio']:.4f}",
                f"{w['drift']:.4f}",
                "yes" if w["within_noise"] else "no",
            ]
        )
    return rows


WINDOW_HEADER = ["window", "steps", "A ms/step", "C ms/step", "B ms/step", "CV% A/C/B", "ratio", "drift", "in noise"]


def exactness_lines(doc: Mapping[str, Any]) -> list[str]:
    ex = doc["exactness"]
    first, last = ex["digest_steps"]
    lines = []
    if ex["first_mismatch"] is None and ex["mismatches"] == 0:
        lines.append(
            f"digests: all equal across A, C, B on {ex['ranks']} ranks x steps {first}-{last} "
            f"({ex['tensors_compared']} tensor digests compared)"
        )
    else:
        fm = ex["first_mismatch"]
        lines.append(f"digests: {ex['mismatches']} mismatching place(s); first: {fm['text'] if fm else 'n/a'}")
    reload_ok = ex["reload_equal"]
    lines.append(
        "final digests == reload digests: "
        + (", ".join(f"{label} {'equal' if ok else 'DIFFERENT'}" for label, ok in reload_ok.items()) if reload_ok
           else "no reload (an A/A launch reads step times and digests, no checkpoint)")
    )
    rng = ex["rng_first_mismatch"]
    lines.append("RNG fingerprints: " + ("equal at every step" if ex["rng_equal"] else rng["text"]))
    lines.append(
        "observed recipe: "
        + ("equals the frozen recipe in every arm (frozen and trainable parameters, optimizer groups)"
           if ex["recipe_equal"] else "; ".join(ex["recipe_differences"]))
    )
    recipe = doc.get("recipe")  # absent from audits recorded before recipe files
    if recipe:
        lines.append(
            f"frozen recipe: {recipe['file']} (sha256 {recipe['sha256'][:12]}, {recipe['name']}, trainer "
            f"{recipe['trainer']}): {len(recipe['observed_keys'])} key(s) observed at run time, "
            f"{len(recipe['flag_only_keys'])} checked by their flags only"
        )
    if "scalars_equal" in ex:
        s_first, s_last = ex["scalar_steps"]
        sm = ex["scalars_first_mismatch"]
        silent = [p.split(":")[0] for p in ex.get("problems", []) if "logged no training step" in p]
        lines.append(
            f"trainer numbers (losses at backward, grad norms, logged values): equal across A, C, B at steps "
            f"{s_first}-{s_last} ({ex['scalars_compared']} compared)"
            + (f"; but {', '.join(silent)} logged no number of its own: not exact" if silent else "")
            if ex["scalars_equal"] else f"trainer numbers: {sm['text'] if sm else 'differ'}"
        )
    watched = ex.get("watch_coverage") or {}
    forbidden = ex["forbidden"]
    if forbidden:
        f = forbidden[0]
        replayed = ", watched replay" if str(f.get("package", "")).startswith("watch") else ""
        lines.append(
            f"forbidden dtype: {f['op']} in {f['dtype']} at step {f['step']} (arm {f['arm']}{replayed}, "
            f"rank {f['rank']})" + (f", {len(forbidden) - 1} more" if len(forbidden) > 1 else "")
        )
    else:
        covered = ", ".join(f"{name} steps {_span(steps)}" for name, steps in watched.items() if steps)
        lines.append("forbidden dtype: none seen" + (f" (watched: {covered})" if covered else ""))
    watch = ex.get("watch")  # absent from audits written before the watch said what it let through
    if watch is not None:
        passed = ", ".join(f"{name} x{n}" for name, n in watch["passed_through"].items()) or "none"
        lines.append(f"watch: {watch['watched_steps']} watched step line(s); passed through: {passed}")
        for what in watch["uninspected"]:
            lines.append(f"watch could not inspect: {what}")
    if ex.get("replay_equal") is False and ex.get("replay_first_mismatch"):
        lines.append(f"watched replay: not a replay of train-C: {ex['replay_first_mismatch']['text']}")
    lines += compile_cache_lines(doc)
    return lines


def compile_cache_lines(doc: Mapping[str, Any]) -> list[str]:
    """The compile caches (absent from audits of runs recorded before the prime package)."""
    cc = doc.get("compile_cache")
    if not cc:
        return []
    if cc.get("mode") == "none":
        return [f"compile cache: measurement.compile none: no prime; {len(cc['checked'])} package(s) checked, each "
                "compiled and tuned nothing"]
    base = cc["baseline"]
    trainers = cc["same_baseline_picks"] + cc["differing_baseline_picks"]
    picks = f"{base['files']} file(s), {base['tuned']} tuned pick(s) (sha256 {base['tuned_sha256'][:12]})"
    loaded = cc.get("loaded")
    if loaded and loaded["reused"]:  # no prime in this run: a kept cache sealed by an earlier one (issue 51)
        sealing, checked = loaded.get("sealing_prime_gpu_seconds"), loaded.get("checked_s")
        prime = ([f"its prime ran {cc['prime_steps']} step(s)"] if cc.get("prime_steps") else []) + (
            [f"{sealing:.1f} GPU-s paid in that run"] if sealing is not None else [])
        lines = [f"compile cache: no prime; loaded the kept cache {loaded['cache']}, sealed by run "
                 f"{loaded['sealed_by']} at {loaded['sealed_at']}" + (f" ({', '.join(prime)})" if prime else "")
                 + f": {picks}; {loaded['entries']} entries checked against its manifest"
                 + (f" in {checked:.1f} s" if checked is not None else "")]
    else:
        lines = [f"compile cache: the prime sealed {picks} in {cc['prime_gpu_seconds']:.1f} GPU-s "
                 f"({100 * cc['prime_share']:.1f}% of the run)"
                 + (f"; the prime ran {cc['prime_steps']} of the steps (measurement.prime_steps)" if "prime_steps" in cc
                    else "")]
        if loaded:
            lines.append(f"compile cache: kept as {loaded['cache']}; later runs of its key load it"
                         + (f"; a fresh prime: {loaded['reason']}" if loaded.get("reason") else ""))
    same = cc["same_baseline_picks"]
    lines.append(f"compile cache: {len(same)} of {len(trainers)} trainer launch(es) ran the baseline's picks"
                 + (f"; different: {', '.join(cc['differing_baseline_picks'])}" if cc["differing_baseline_picks"]
                    else ""))
    for name, use in cc["launches"].items():
        if name in trainers:
            lines.append(f"compile cache {name}: took {use['taken']} file(s) ({use['taken_tuned']} tuned), made "
                         f"{use['made']} ({use['made_tuned']} tuned), rewrote {use['changed']}; tuned picks "
                         f"{use['tuned_sha256'][:12]}")
    lines += [f"compile cache diagnosis: {line}" for line in cc["diagnosis"]]
    lines += [f"compile cache: not reached by the prime: {line}" for line in cc.get("unprimed", [])]
    return lines


def _span(steps: Sequence[int]) -> str:
    return f"{min(steps)}-{max(steps)}" if steps else "none"


def memory_rows(doc: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for r in doc["memory"]["ranks"]:
        rows.append(
            [str(r["rank"])]
            + [f"{_peak(r[label]['allocated'])} / {_peak(r[label]['reserved'])}" for label in ROLES]
            + [f"{_bytes(r['delta_allocated'])} / {_bytes(r['delta_reserved'])}"]
        )
    return rows


MEMORY_HEADER = ["rank", "A alloc/res", "C alloc/res", "B alloc/res", "C - max(A,B) alloc/res"]


def attribution_line(doc: Mapping[str, Any]) -> str:
    at = doc["attribution"]
    parts = [f"headline label: {at['label']}"]
    if at["sources_differ"]:
        roots = at["commitment_roots"]
        parts.append(f"sources differ ({str(roots['baseline'])[:12]} -> {str(roots['candidate'])[:12]})")
    if at["switches"]:
        parts.append("switches differ: " + ", ".join(at["switches"]))
    if at["config"]:
        parts.append("external configuration differs: " + ", ".join(at["config"]))
    return "; ".join(parts)


PROBE_COST_HEADER = ["launch", "rank", "no digests: median", "max", "digests: median", "max", "digest", "rest"]


def probe_cost_rows(doc: Mapping[str, Any]) -> list[list[str]]:
    """Per launch and rank: the probe's seconds / the step's seconds over the timed steps (ledger/probe_cost.py)."""

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.2f}%"

    rows = []
    for r in doc["probe_cost"]["rows"]:
        no, yes = r["without_digests"] or {}, r["with_digests"] or {}
        rows.append([r["launch"], str(r["rank"]), pct(no.get("median")), pct(no.get("max")), pct(yes.get("median")),
                     pct(yes.get("max")), pct(yes.get("digest_median")), pct(yes.get("rest_median"))])  # fmt: skip
    return rows


def probe_cost_markdown(doc: Mapping[str, Any]) -> list[str]:
    if not doc.get("probe_cost"):
        return []
    return ["## Probe cost", "", doc["probe_cost"]["words"] + ".", "", _md_table(PROBE_COST_HEADER,
            probe_cost_rows(doc)), ""]  # fmt: skip


def render_terminal(result: AuditResult, console: Console) -> None:
    """Verdict first, then windows, exactness, memory, cost, versions; the DEV score last, informational."""
    doc = result.document
    sp = doc["speedup"]
    verdict = doc["verdict"]
    direction = f" ({doc['direction']})" if doc.get("direction") else ""
    console.print(
        f"[{VERDICT_STYLE.get(verdict, 'bold')}]verdict: {verdict}{direction}[/]  run {doc['run_id']}  "
        f"headline {sp['headline']:.4f}x ({sp['headline_window']}){interval_text(doc)}, "
        f"max drift {sp['max_drift']:.4f} (bound {sp['drift_bound']})"
    )
    for reason in doc["reasons"]:
        console.print(f"  reason: {reason}", markup=False)
    for line in verdict_lines(doc):
        console.print(f"  {line}", markup=False)
    console.print(f"scope: {doc['scope']}", markup=False)
    for line in isolation_lines(doc):
        console.print(line, markup=False)
    if (aa := aa_line(doc)) is not None:
        console.print(aa, markup=False)
    console.print(attribution_line(doc), markup=False)
    for arm, command in (doc.get("commands") or {}).items():
        console.print(f"command ({arm}): {' '.join(command)}", markup=False)
    print_whole(whole_table(WINDOW_HEADER, window_rows(doc), left=2,
                            title="step-time windows: mean ms per step (max over ranks, probe work excluded)"),
                console)
    for w in sp["windows"]:
        console.print(f"  {w['words']}", markup=False)
    console.print(f"  {sp['words']}", markup=False)
    if doc.get("gpu_busy"):  # a GPU protocol whose host watch read GPU-busy
        console.print(f"GPU-busy: {doc['gpu_busy']['words']}", markup=False)
    console.print("[bold]exactness[/]")
    for line in exactness_lines(doc):
        console.print(f"  {line}", markup=False)
    print_whole(whole_table(MEMORY_HEADER, memory_rows(doc), title=f"memory peaks ({doc['memory']['device']})"),
                console)
    if doc.get("probe_cost"):  # absent from audits recorded before it existed
        console.print(doc["probe_cost"]["words"], markup=False)
        print_whole(whole_table(PROBE_COST_HEADER, probe_cost_rows(doc), left=2), console)
    cost = doc["cost"]
    console.print(
        f"cost: {cost['total_gpu_seconds']:.1f} GPU-seconds ("
        + ", ".join(f"{k} {v:.1f}" for k, v in cost["gpu_seconds"].items())
        + f"); ledger head size {doc['ledger_head']['size']} root {doc['ledger_head']['root'][:16]}",
        markup=False,
    )
    if "lock_held_s" in cost:  # absent from audits recorded before the hold was
        console.print(lock_line(cost), markup=False)
    console.print("versions: " + ", ".join(f"{k} {v}" for k, v in sorted(doc["versions"].items())), markup=False)
    for note in result.notes:
        console.print(f"note: {note}", markup=False)
    console.print(
        f"written: {result.audit_path.name}, {result.markdown_path.name}, {result.plot_path.name}"
        + ("" if result.written else " (already recorded)")
        + (f"; ledger seq {result.ledger_seq}" if result.ledger_seq is not None else ""),
        markup=False,
    )
    score = result.score
    if score is not None:
        if score.verified:
            console.print(
                "[dim]DEV score (informational; not part of the verdict, never published): "
                f"{json.dumps(score.metrics, sort_keys=True)}[/]",
                markup=True,
            )
        else:
            console.print(f"DEV score: {score.detail}", markup=False)


def lock_line(cost: dict[str, Any]) -> str:
    """The lock's hold, and the part of it no package ran in (in GPU-seconds too, on GPUs)."""
    held, between = cost["lock_held_s"], cost["between_packages_s"]
    gpu = (f"; {cost['lock_held_gpu_seconds']:.1f} GPU-seconds held, {cost['between_packages_gpu_seconds']:.1f} "
           "of them beyond the packages'" if cost["lock_held_gpu_seconds"] else "")
    return (f"lock: held {held:.1f} s, {between:.1f} s of it ({between / held if held else 0.0:.1%}) between packages "
            f"(orch's seals, checks and cleanup, no package running){gpu}")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def aa_line(doc: Mapping[str, Any]) -> str | None:
    """What an A/A launch of `orch calibrate` is, and what its plan left out (None for any other run)."""
    of = doc.get("calibration_of")
    if not of:
        return None
    line = (f"A/A launch of `orch calibrate` for protocol {of['protocol_name']} ({of['protocol_id'][:12]}): the "
            "baseline in both arms")
    if (doc.get("exactness") or {}).get("replay_equal") is None:
        line += "; its plan ends after the triplet (no watched replay, no DEV score)"
    return line


def render_markdown(doc: Mapping[str, Any]) -> str:
    """audit.md: the same content as the terminal report, without the DEV score (written before unsealing)."""
    sp = doc["speedup"]
    cost = doc["cost"]
    parts = [
        f"# Audit of run {doc['run_id']}",
        "",
        f"**Verdict: {doc['verdict']}{' (' + doc['direction'] + ')' if doc.get('direction') else ''}** — "
        f"headline {sp['headline']:.4f}x ({sp['headline_window']}){interval_text(doc)}, "
        f"max A/B drift {sp['max_drift']:.4f} (bound {sp['drift_bound']}).",
        "",
        *[f"- reason: {r}" for r in doc["reasons"]],
        *[f"- {line}" for line in verdict_lines(doc)],
        "",
        f"Protocol `{doc['protocol_name']}` id `{doc['protocol_id']}`, precision {doc['precision']}.",
        "",
        f"Scope: {doc['scope']}.",
        "",
        *[f"- {line}" for line in isolation_lines(doc)],
        *([""] if isolation_lines(doc) else []),
        *([] if (aa := aa_line(doc)) is None else [aa + ".", ""]),
        attribution_line(doc) + ".",
        "",
        "## Step-time windows",
        "",
        "Step time = max over ranks of the step's duration, probe work excluded; A, C, B = the window's time "
        "divided by its steps (ms per step); ratio = mean(A, B) / C of the window times; "
        "drift = |A - B| / mean(A, B); headline = minimum ratio.",
        "",
        _md_table(WINDOW_HEADER, window_rows(doc)),
        "",
        "![step times per arm: every step, and the measured windows with their spread](step_times.png)",
        "",
        *[f"- {w['words']}" for w in sp["windows"]],
        f"- {sp['words']}",
        *([f"- GPU-busy: {doc['gpu_busy']['words']}"] if doc.get("gpu_busy") else []),
        "",
        "## Exactness",
        "",
        *[f"- {line}" for line in exactness_lines(doc)],
        "",
        f"## Memory peaks ({doc['memory']['device']})",
        "",
        _md_table(MEMORY_HEADER, memory_rows(doc)),
        "",
        *probe_cost_markdown(doc),
        "## Cost",
        "",
        _md_table(
            ["package", "GPU-seconds", "wall s"],
            [[k, f"{v:.1f}", f"{cost['wall_s'][k]:.1f}"] for k, v in cost["gpu_seconds"].items()]
            + [["total", f"{cost['total_gpu_seconds']:.1f}", f"{cost['total_wall_s']:.1f}"]],
        ),
        "",
        *([f"- {lock_line(cost)}", ""] if "lock_held_s" in cost else []),
        f"Ledger head at audit time: size {doc['ledger_head']['size']}, root `{doc['ledger_head']['root']}`.",
        "",
        "## Versions",
        "",
        *[f"- {k}: {v}" for k, v in sorted(doc["versions"].items())],
        "",
        "The DEV score is not part of this audit; it is shown, informational, only by `orch audit`.",
        "",
    ]
    return "\n".join(parts)


def plot_paired(ax: Any, iv: Mapping[str, Any]) -> None:
    """Each triplet's paired speedup exp(d) and the owner's headline, with the interval of the verdict (a band)."""
    k = list(range(1, len(iv["paired_speedups"]) + 1))
    ax.axhline(1.0, color="0.4", ls="--", lw=1, label="no difference (1)")
    if iv["bounded"]:
        high = iv["high"] if iv["high"] is not None else max(iv["paired_speedups"]) * 2
        ax.axhspan(iv["low"], high, color="#ff7f0e", alpha=0.2,
                   label=f"{iv['level']:.0%} interval [{iv['low']:.3f}, {high:.3f}]")
    else:
        ax.text(0.5, 0.05, "not bounded yet: one triplet, no calibration", transform=ax.transAxes, ha="center",
                fontsize=8)
    ax.axhline(iv["estimate"], color="#ff7f0e", lw=1.5, label=f"estimate {iv['estimate']:.3f}x")
    ax.plot(k, iv["paired_speedups"], "o", ms=7, color="#d62728", label="paired speedup exp(d)")
    ax.plot(k, iv["headlines"], "x", ms=7, color="0.2", label="owner's headline (min window)")
    ax.set_xticks(k)
    ax.set_xlim(0.5, len(k) + 0.5)
    ax.set_xlabel("triplet")
    ax.set_ylabel("speedup (baseline / candidate)")
    source = iv["variance_source"] + (f", df {iv['df']}" if iv["bounded"] else "")
    ax.set_title(f"per triplet, with the verdict's interval ({source})", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.margins(y=0.2)


def plot_step_times(doc: Mapping[str, Any], path: Path) -> None:
    """Two panels (PNG, CPU backend): every step of each arm (log scale: the first steps are slow), and the
    measured windows alone, each window's mean step time per arm with its spread (min-max of its steps); a paired
    audit (orch.audit/2) adds a third: each triplet's paired speedup and headline with the verdict's interval."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a server; must precede pyplot
    import matplotlib.pyplot as plt

    sp = doc["speedup"]
    iv = doc.get("interval")
    paired = isinstance(iv, dict) and "paired_speedups" in iv
    ratios = [1, 1.3, 0.9] if paired else [1, 1.3]
    fig, axes = plt.subplots(1, len(ratios), figsize=(16 if paired else 11, 4.5), dpi=100,
                             gridspec_kw={"width_ratios": ratios})
    full, zoom = axes[0], axes[1]
    try:
        if paired:
            plot_paired(axes[2], iv)  # type: ignore[arg-type]
        first = sp["windows"][0]["steps"][0] if sp["windows"] else 0
        for label in ROLES:  # launch order
            times = [t * 1000 for t in sp["step_times"][label]]
            full.plot(range(len(times)), times, marker="o", ms=3, label=label, color=ARM_COLORS.get(label))
            zoom.plot(range(first, len(times)), times[first:], marker="o", ms=3, lw=0.8, alpha=0.5,
                      color=ARM_COLORS.get(label))
        full.axvspan(first - 0.5, len(sp["step_times"]["A"]) - 0.5, color="0.9", zorder=0)
        full.set_yscale("log")
        full.set_xlabel("step")
        full.set_ylabel("step time, max over ranks (ms, log scale)")
        full.set_title("every step (warm-up, then the measured windows, shaded)", fontsize=9)
        full.legend(title="arm", loc="upper right")
        offsets = {"A": -0.2, "C": 0.0, "B": 0.2}
        for i, w in enumerate(sp["windows"]):
            lo, hi = w["steps"][0] - 0.5, w["steps"][-1] + 0.5
            zoom.axvspan(lo, hi, color="0.88" if i % 2 == 0 else "0.95", zorder=0)
            zoom.text((lo + hi) / 2, 0.98, f"{w['name']}  {w['ratio']:.3f}x\ndrift {w['drift']:.3f}",
                      transform=zoom.get_xaxis_transform(), ha="center", va="top", fontsize=8)
            for label in ROLES:
                steps = [t * 1000 for t in w["step_times"][label]]
                mean = sum(steps) / len(steps)
                zoom.errorbar((lo + hi) / 2 + offsets[label], mean, yerr=[[mean - min(steps)], [max(steps) - mean]],
                              fmt="s", ms=6, capsize=4, color=ARM_COLORS.get(label),
                              label=label if i == 0 else None)
        zoom.set_xlabel("step (measured windows only)")
        zoom.set_ylabel("ms per step (window mean; bar: min-max)")
        zoom.set_title(f"headline {sp['headline']:.4f}x ({sp['headline_window']}), verdict {doc['verdict']}",
                       fontsize=9)
        zoom.legend(title="arm", loc="lower right", fontsize=8)
        zoom.margins(y=0.25)
        fig.suptitle(f"run {doc['run_id']}", fontsize=10)
        fig.tight_layout()
        tmp = path.with_name(f".{path.name}.tmp")
        fig.savefig(tmp, format="png", metadata={"Software": None})
        tmp.replace(path)
    finally:
        plt.close(fig)
