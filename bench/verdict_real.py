"""`bench_verdict.py --real`: real `orch calibrate` / `orch launch` runs of r3-mini in parallel streams (each its own
home, gpu-run lock dir and cores), the per-triplet window ratios read back from every run's recorded train results,
and decisions formed from disjoint triplets by the audit's own statistics (ledger/verdict/decide/stats.py,
sequential.py).

Streams: with 3 or more, the first half run nulls and the rest alternate the 25% and 10% slowdowns (with --kinds,
stream i runs the i-th kind of the list, cyclically); with fewer, each stream cycles through --kinds (default
null -> 25% -> 10%) launch by launch, the second one from the second kind. Every stream starts with
`orch calibrate` of the null protocol: its A/A triplets are that stream's calibration (and give the baseline step
the slowdowns sleep against).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from bench_null import ANCHOR, GIT, env, git_head_baseline, null_protocol, orch, project, slowdown_protocol
from verdict_common import no_paths
from verdict_sim import cp

from ledger.verdict.decide.evidence import collect_evidence
from ledger.verdict.decide.sequential import SequentialRule
from ledger.verdict.decide.stats import Spread, paired_interval, triplet_log_speedup
from ledger.verdict.decide.windows import speedup, step_times
from protocol.home import resolve_home
from protocol.plan import triplets

KINDS = {"null": 0.0, "slow25": 0.25, "slow10": 0.10}  # the candidate sleeps this fraction of the baseline step
# --k1 (issue 34): K = 1 nulls, a noisier candidate of the same median step, and known slowdowns (the power)
K1_KINDS = ("null", "noisy", "steadier", "order", "slow25", "slow10")
# issue 52: "steadier" swaps noisy's arms (the baseline sleeps uniform in [0, 2m], the candidate a constant m: same
# median step, the candidate steadier inside its launches); "order" makes the baseline's second launch (B) slower by
# a fixed sleep (ORDER_LINE) that only the baseline arm's switches name, so the candidate cannot set it
MAX_REPEATS = 3  # triplets per launch (fewer when the budget is short)
GRACE_S = 45.0  # a run still going this long past the budget is stopped (its triplets are not used)
SEQ_MAX = 6


@dataclass
class Stream:
    index: int
    kinds: list[str]
    cores: list[int] | None
    work: Path
    triplets: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    per_triplet_s: float | None = None
    overhead_s: float | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)  # --k1: each launch's audit


def read_run(home: Path, run_id: str) -> tuple[list[dict[str, Any]], float, float]:
    """Per-triplet window ratios from the run's recorded train results (the audit's evidence loader and the
    owner's window functions); the seconds its train/reload packages took, and the median baseline step time in
    the windows."""
    ev = collect_evidence(resolve_home(home), run_id)
    m = ev.protocol.measurement
    times = {label: step_times(ranks, m.steps) for label, ranks in ev.steps.items()}
    out, base_steps = [], []
    for t in triplets(getattr(ev, "triplets", m.repeats)):
        sp = speedup({role: times[label] for role, label in t.labels.items()}, steps=m.steps, warmup=m.warmup,
                     window=m.window, drift_bound=m.drift_bound)
        ratios = [w.ratio for w in sp.windows]
        base_steps += [s for w in sp.windows for s in (*w.a_steps, *w.b_steps)]
        out.append({"ratios": ratios, "d": triplet_log_speedup(ratios), "headline": sp.headline,
                    "max_drift": sp.max_drift})
    closes = [r for r in ev.records if r.status != "open" and r.wall_s is not None]
    launches = sum(r.wall_s or 0.0 for r in closes if r.kind in ("train", "reload"))
    return out, launches, float(statistics.median(base_steps))


def _run(cmd: list[str], cwd: Path, s: Stream, timeout: float) -> tuple[str | None, str]:
    """Run an orch command on the stream's cores; its run id (None when it did not complete) and a one-line why."""
    prefix = ["taskset", "-c", ",".join(map(str, s.cores))] if s.cores and shutil.which("taskset") else []
    pre = (lambda: os.sched_setaffinity(0, s.cores)) if s.cores and not prefix else None
    try:
        proc = subprocess.run([*prefix, *cmd], cwd=cwd, env=env(), capture_output=True, text=True,
                              timeout=max(timeout, 1.0), preexec_fn=pre)
    except subprocess.TimeoutExpired:
        return None, "stopped at the budget"
    try:
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
        return str(doc["run_id"]), f"exit {proc.returncode}"
    except (IndexError, ValueError, KeyError):
        return None, f"no JSON (exit {proc.returncode}): {(proc.stderr.strip().splitlines() or [''])[-1]}"


# the draw is a hash of the run id, the launch (its package folder, in the trainer's --log_dir) and the step: every
# rank of a launch sleeps the same (the ranks meet in every step's collectives, so independent draws per rank would
# pace the step by the longest of them, and make the arm slower, not only noisier), each launch draws anew (A and B
# of one run too: with the run id alone they slept alike, and a drawing baseline looked steady in its A/B contrast),
# and no RNG of the trainer is drawn
NOISY_LINE = ('        time.sleep(float(os.environ.get("R3_BENCH_SLEEP_S", "0")) * (1.0 + float(os.environ.get('
              '"R3_BENCH_SLEEP_SPREAD", "0")) * (2.0 * int(__import__("hashlib").sha256(f"{os.environ.get('
              '\'ORCH_RUN_ID\', \'\')}:{training_args.log_dir}:{curr_step}".encode()).hexdigest()[:8], 16) / '
              '4294967296.0 - 1.0)))'
              '  # bench-verdict: uniform sleep, median m, one draw per step for every rank\n')


# the baseline's second launch only: its package folder is train-B (the trainer's --log_dir is {package_dir}/trainer)
ORDER_LINE = ('        time.sleep(float(os.environ.get("R3_BENCH_B_SLEEP_S", "0")) if "/train-B/" in '
              'training_args.log_dir.replace(os.sep, "/") + "/" else 0.0)  # bench-verdict: B slower (order)\n')


def edited_protocol(work: Path, device: str, small: bool, kind: str,
                    switches_of: dict[str, dict[str, str]]) -> tuple[Path, Path]:
    """A project whose committed trainer has the kind's line after each scheduler.step() (NOISY_LINE for noisy and
    steadier, ORDER_LINE for order); both arms run the same committed sources (manifests/bench_KIND.json) with their
    own switches added to the null protocol's."""
    proj = project(work)
    trainer = proj / "examples" / "r3_mini" / "train" / "online_rl.py"
    text = trainer.read_text()
    assert text.count(ANCHOR) == 1, "the trainer's scheduler.step() anchor moved"
    trainer.write_text(text.replace(ANCHOR, ANCHOR + (ORDER_LINE if kind == "order" else NOISY_LINE)))
    subprocess.run([*GIT, "commit", "-q", "-am", f"bench-verdict {kind} trainer"], cwd=proj, check=True)
    path = null_protocol(proj, device, 1, small)
    data = yaml.safe_load(path.read_text())
    base = dict(data["arms"]["baseline"]["switches"])
    manifest = f"manifests/bench_{kind}.json"
    data["arms"] = {arm: {"commitment": manifest, "source": "tree", "switches": base | switches_of[arm]}
                    for arm in ("baseline", "candidate")}
    data["name"] = f"{data['name']}-{kind}"
    path = path.with_name(f"{kind}_k1.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    frozen = subprocess.run(orch("freeze", "--protocol", str(path), "--arm", "baseline", "-o", manifest), cwd=proj,
                            env=env(), capture_output=True, text=True)
    if frozen.returncode != 0:
        raise SystemExit(f"orch freeze failed: {frozen.stderr[-2000:]}")
    subprocess.run([*GIT, "add", "-A"], cwd=proj, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", f"bench-verdict {kind} manifest"], cwd=proj, check=True)
    return proj, path


def noisy_protocol(work: Path, device: str, small: bool, sleep_s: float, steadier: bool = False) -> tuple[Path, Path]:
    """Both arms sleep after each scheduler.step(): one a constant m, the other uniform in [0, 2m], the same draw on
    every rank (NOISY_LINE), so the median step is the same. noisy (issue 34): the candidate draws; steadier (issue
    52): the baseline draws, the candidate is steadier inside its launches."""
    sleep = {"R3_BENCH_SLEEP_S": f"{sleep_s:.6f}"}
    spread = ("1", "0") if steadier else ("0", "1")
    return edited_protocol(work, device, small, "steadier" if steadier else "noisy",
                           {"baseline": sleep | {"R3_BENCH_SLEEP_SPREAD": spread[0]},
                            "candidate": sleep | {"R3_BENCH_SLEEP_SPREAD": spread[1]}})


def order_protocol(work: Path, device: str, small: bool, sleep_s: float) -> tuple[Path, Path]:
    """Issue 52's order effect: the baseline arm's switch R3_BENCH_B_SLEEP_S makes its second launch (B) sleep that
    long after each step; the candidate's switches do not name it. A/A calibrations see it too (their B runs the
    baseline), so the calibration's A/A mean carries the launch positions' effect."""
    return edited_protocol(work, device, small, "order",
                           {"baseline": {"R3_BENCH_B_SLEEP_S": f"{sleep_s:.6f}"}, "candidate": {}})


def audit_row(s: Stream, kind: str, home: Path, run_id: str, wall: float) -> dict[str, Any]:
    """One K = 1 decision as the audit made it (its calibration: the stream's own `orch calibrate`)."""
    a = json.loads((home / "runs" / run_id / "audit.json").read_text())
    iv = a["interval"]
    return {"stream": s.index, "kind": kind, "run_id": run_id, "estimate": iv["estimate"], "low": iv["low"],
            "high": iv["high"], "verdict": a["verdict"], "direction": a["direction"],
            "variance_source": iv["variance_source"], "calibration_run": (iv.get("calibration_used") or {}).get(
                "run_id"), "noise_ratio": (iv.get("noise") or {}).get("ratio"),
            "window_check": (iv.get("window_check") or {}).get("words"), "exact": a["exact"],
            "ab_log_ratio": [t["ab_log_ratio"] for t in (a.get("positions") or {}).get("triplets", [])],
            "calibration_position": (a.get("positions") or {}).get("calibration"),
            "words": a["verdict_words"], "wall_s": round(wall, 1)}


def git_baseline(null: Path) -> Path:
    """The null protocol with the baseline arm a slowdown's protocol has (bench_null.git_head_baseline), both arms
    that baseline: its `orch calibrate` then has the slowdown's baseline
    workload (protocol.schema.baseline_workload_id), so the slowdown's K = 1 audit finds it, as a user's candidate
    finds the calibration of its own baseline."""
    data = yaml.safe_load(null.read_text())
    base = git_head_baseline(data["arms"]["baseline"]["switches"])
    data["arms"] = {"baseline": base, "candidate": dict(base)}
    data["name"] = f"{data['name']}-git-baseline"
    path = null.with_name("git_baseline_k1.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def stream_k1(s: Stream, opts: argparse.Namespace, deadline: float, save: threading.Event) -> None:
    """Issue 34: `orch calibrate --repeats N` (N separate A/A launches) of the stream's protocol, then K = 1
    launches until the budget, each decided by its own audit with that calibration."""
    kind = s.kinds[0]
    home, locks = s.work / "home", s.work / "locks"
    common = ["--home", str(home), "--lock-dir", str(locks), "--json"]
    if kind in ("noisy", "steadier"):
        proj, proto = noisy_protocol(s.work / kind, opts.device, opts.small, opts.noise_sleep_s, kind == "steadier")
    elif kind == "order":
        proj, proto = order_protocol(s.work / kind, opts.device, opts.small, opts.order_sleep_s)
    else:
        proj = project(s.work / kind)
        proto = null_protocol(proj, opts.device, 1, opts.small)
    slowdown = kind in KINDS and KINDS[kind] > 0
    calibrated = git_baseline(proto) if slowdown else proto
    t0 = time.monotonic()
    run_id, why = _run(orch("calibrate", str(calibrated), "--repeats", str(opts.calibration_repeats), *common), proj,
                       s, deadline + GRACE_S - time.monotonic())
    s.runs.append({"kind": "calibration", "run_id": run_id, "wall_s": round(time.monotonic() - t0, 1), "why": why})
    save.set()
    if run_id is None:
        return
    if slowdown:  # the candidate sleeps this fraction of the calibration's median A/A step
        cal = json.loads((home / "runs" / run_id / "calibration.json").read_text())
        base_steps = [read_run(home, aa)[2] for aa in (cal.get("run_ids") or [run_id])]
        path = slowdown_protocol(proj, proto, 1, KINDS[kind] * statistics.median(base_steps))
        proto = path.rename(path.with_name(f"{kind}_k1.yaml"))
    per_run = (time.monotonic() - t0) / opts.calibration_repeats
    while deadline - time.monotonic() >= 1.1 * per_run:
        t1 = time.monotonic()
        run_id, why = _run(orch("launch", str(proto), *common), proj, s, deadline + GRACE_S - time.monotonic())
        row: dict[str, Any] = {"kind": kind, "run_id": run_id, "wall_s": round(time.monotonic() - t1, 1), "why": why}
        if run_id is not None:
            try:
                s.decisions.append(audit_row(s, kind, home, run_id, time.monotonic() - t1))
            except (OSError, ValueError, KeyError) as err:
                row["why"] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
        per_run = max(per_run, time.monotonic() - t1)
        s.runs.append(row)
        save.set()


def stream_main(s: Stream, opts: argparse.Namespace, deadline: float, save: threading.Event) -> None:
    try:
        if opts.k1:
            stream_k1(s, opts, deadline, save)
            return
        stream_work(s, opts, deadline, save)
    except BaseException as err:  # a stream that fails says why in the figures; the others go on
        last = (str(err).strip().splitlines() or [""])[-1]
        s.notes.append(f"stream stopped: {type(err).__name__}: {last}")
        save.set()


def stream_work(s: Stream, opts: argparse.Namespace, deadline: float, save: threading.Event) -> None:
    # the slowdown edits its copy's trainer: the nulls keep a copy of their own, whose tree matches the manifest
    proj = project(s.work / "null")
    slow_proj: Path | None = None
    home, locks = s.work / "home", s.work / "locks"
    common = ["--home", str(home), "--lock-dir", str(locks), "--json"]
    null = null_protocol(proj, opts.device, 1, opts.small)
    t0 = time.monotonic()
    run_id, why = _run(orch("calibrate", str(null), "--repeats", str(opts.calibration_repeats), *common), proj, s,
                       deadline + GRACE_S - time.monotonic())
    if run_id is None:
        s.notes.append(f"calibration: {why}")
        return
    try:  # every A/A launch the calibration names (one triplet each; older calibrations: one run of K)
        cal = json.loads((home / "runs" / run_id / "calibration.json").read_text())
        trips, launches = [], 0.0
        aa_runs = cal.get("run_ids") or [run_id]
        for aa_id in aa_runs:
            t, w, base_step = read_run(home, aa_id)
            trips += t
            launches += w
    except Exception as err:  # an incomplete run: named, not used
        s.notes.append(f"calibration: {type(err).__name__}: {str(err).splitlines()[0]}")
        return
    s.per_triplet_s = launches / len(trips)
    s.overhead_s = max(0.0, time.monotonic() - t0 - launches) / len(aa_runs)  # per run: checks, prime, reloads
    s.runs.append({"kind": "calibration", "triplets": len(trips), "wall_s": round(time.monotonic() - t0, 1),
                   "why": why})
    s.triplets += [{"kind": "calibration", "run": 0, **t} for t in trips]
    save.set()
    protocols: dict[tuple[str, int], Path] = {}
    n = 0
    while True:
        kind = s.kinds[n % len(s.kinds)]
        left = deadline - time.monotonic()
        fits = [k for k in range(MAX_REPEATS, 0, -1) if s.overhead_s + 1.1 * k * s.per_triplet_s <= left]
        if not fits:
            break
        k = fits[0]
        if kind != "null" and slow_proj is None:
            slow_proj = project(s.work / "slow")
        where = proj if kind == "null" else slow_proj
        assert where is not None
        if (kind, k) not in protocols:
            base = null_protocol(where, opts.device, k, opts.small)
            if kind == "null":
                protocols[(kind, k)] = base
            else:
                path = slowdown_protocol(where, base, k, KINDS[kind] * base_step)
                protocols[(kind, k)] = path.rename(path.with_name(f"{kind}_k{k}.yaml"))
        t1 = time.monotonic()
        n += 1
        run_id, why = _run(orch("launch", str(protocols[(kind, k)]), *common), where, s,
                           deadline + GRACE_S - time.monotonic())
        row = {"kind": kind, "triplets": k, "wall_s": round(time.monotonic() - t1, 1), "why": why}
        if run_id is not None:
            try:
                trips, launches, _ = read_run(home, run_id)
            except Exception as err:
                row["why"] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
            else:
                s.triplets += [{"kind": kind, "run": n, **t} for t in trips]
                s.per_triplet_s = launches / len(trips)
                s.overhead_s = max(0.0, time.monotonic() - t1 - launches)
        s.runs.append(row)
        save.set()


# Decisions from disjoint triplets


def decide(d: list[float], cal: Spread | None, rule: str) -> dict[str, Any]:
    if rule == "seq":
        seq = SequentialRule(SEQ_MAX)
        iv = seq.interval(d, cal)
        stop = seq.stop(iv)
    else:
        iv, stop = paired_interval(d, cal), "fixed"
    verdict = "faster" if iv.low > 1.0 else "slower" if iv.high < 1.0 else "no difference"
    return {"rule": rule, "triplets": len(d), "estimate": iv.estimate, "low": iv.low,
            "high": iv.high if math.isfinite(iv.high) else None, "verdict": verdict, "stop": stop,
            "variance_source": iv.variance_source}


CALIBRATIONS = ("own", "others")


def decisions(streams: list[Stream], calibration: str = "own") -> list[dict[str, Any]]:
    """Per stream and kind, its triplets in launch order consumed by rules in turn, none used twice: nulls by
    K=1, K=2, K=3 and the sequential rule (<= 6), the 25% slowdown by K=1 and K=2, the 10% by the sequential rule.
    calibration "own": the stream's `orch calibrate` triplets; "others": every A/A and null triplet of the other
    streams (for the slowdowns, of every stream), and the stream's own A/A triplets become null decisions too.
    A sequential trial the data end before is `incomplete`."""
    turns = {"null": ["K=1", "K=2", "K=3", "seq"], "slow25": ["K=1", "K=2"], "slow10": ["seq"]}
    nullish = ("calibration", "null")
    out = []
    for s in streams:
        for kind, rules in turns.items():
            if calibration == "own":
                cal = Spread.of([t["d"] for t in s.triplets if t["kind"] == "calibration"])
                pool = [t["d"] for t in s.triplets if t["kind"] == kind]
            else:
                cal = Spread.of([t["d"] for o in streams if o is not s or kind != "null"
                                 for t in o.triplets if t["kind"] in nullish])
                pool = [t["d"] for t in s.triplets if t["kind"] in ((kind,) if kind != "null" else nullish)]
            i, turn = 0, s.index
            while i < len(pool):
                rule = rules[turn % len(rules)]
                turn += 1
                if rule == "seq":
                    for j in range(i + 1, min(i + SEQ_MAX, len(pool)) + 1):
                        dec = decide(pool[i:j], cal, "seq")
                        if dec["stop"] is not None:
                            break
                    if dec["stop"] is None:
                        dec["stop"] = "incomplete"
                    i = j
                else:
                    k = int(rule[2])
                    if i + k > len(pool):
                        continue
                    dec, i = decide(pool[i:i + k], cal, rule), i + k
                out.append({"stream": s.index, "kind": kind, "calibration": calibration,
                            "calibration_df": cal.df if cal else 0, **dec})
    return out


def tally(decs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in KINDS:
        truth = 1.0 / (1.0 + KINDS[kind])
        for rule in ("K=1", "K=2", "K=3", "seq"):
            rows = [d for d in decs if d["kind"] == kind and d["rule"] == rule and d["stop"] != "incomplete"]
            if not rows:
                continue
            n = len(rows)
            accepted = sum(d["verdict"] != "no difference" for d in rows)
            covers = sum(d["low"] <= truth <= (d["high"] if d["high"] is not None else math.inf) for d in rows)
            fig: dict[str, Any] = {"decisions": n, "covers_true_ratio": covers,
                                   "mean_triplets": statistics.fmean(d["triplets"] for d in rows),
                                   "incomplete": sum(d["kind"] == kind and d["rule"] == rule
                                                     and d["stop"] == "incomplete" for d in decs)}
            if kind == "null":
                fig |= {"false_accepts": accepted, "false_accept_ci95": cp(accepted, n)}
            else:
                slower = sum(d["verdict"] == "slower" for d in rows)
                fig |= {"accepted_slower": slower, "power_ci95": cp(slower, n), "wrong_direction": accepted - slower}
            out[f"{kind} {rule} + cal"] = fig
    nulls = [d for d in decs if d["kind"] == "null" and d["stop"] != "incomplete"]
    if nulls:
        fa = sum(d["verdict"] != "no difference" for d in nulls)
        out["null, all rules"] = {"decisions": len(nulls), "false_accepts": fa, "false_accept_ci95": cp(fa, len(nulls))}
    return out


def k1_tally(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind: K = 1 decisions (exact ones), accepted (a false accept: both kinds are nulls), 95% Clopper-Pearson."""
    out: dict[str, Any] = {}
    for kind in K1_KINDS:
        got = [r for r in rows if r["kind"] == kind and r["exact"]]
        if not got:
            continue
        if kind in KINDS and KINDS[kind] > 0:  # a known slowdown: power, and the wrong-way accepts
            slower = sum(r["verdict"] == "accepted" and r["direction"] == "slower" for r in got)
            faster = sum(r["verdict"] == "accepted" and r["direction"] == "faster" for r in got)
            out[kind] = {"decisions": len(got), "accepted_slower": slower, "power_ci95": cp(slower, len(got)),
                         "accepted_faster": faster, "mean_triplets": 1.0}
            continue
        fa = sum(r["verdict"] == "accepted" for r in got)
        out[kind] = {"decisions": len(got), "false_accepts": fa, "false_accept_ci95": cp(fa, len(got)),
                     "mean_triplets": 1.0}
    return out


def k1_table(rows: list[dict[str, Any]]) -> str:
    lines = ["stream | kind | run id | estimate | 95% interval | verdict | variance", "--- | --- | --- | --- | --- | "
             "--- | ---"]
    for r in rows:
        high = "inf" if r["high"] is None else f"{r['high']:.4f}"
        low = "0" if r["low"] is None else f"{r['low']:.4f}"
        noise = "" if r["noise_ratio"] is None else f", R = {r['noise_ratio']:.3g}"
        lines.append(f"{r['stream']} | {r['kind']} | {r['run_id']} | {r['estimate']:.4f} | [{low}, {high}] | "
                     f"{r['verdict']}{' (' + r['direction'] + ')' if r['direction'] else ''} | "
                     f"{r['variance_source']}{noise}")
    return "\n".join(lines)


def assign(opts: argparse.Namespace) -> list[tuple[list[str], list[int] | None]]:
    n = opts.streams
    cpus = sorted(os.sched_getaffinity(0))
    cores: list[list[int] | None] = [None] * n
    if n > 1:
        c = opts.cores_per_stream
        if n * c > len(cpus):
            raise SystemExit(f"--streams {n} x --cores-per-stream {c} needs {n * c} cores; this host gives "
                             f"{len(cpus)}: give fewer streams")
        cores = [cpus[i * c:(i + 1) * c] for i in range(n)]
    order = (opts.kinds or "null,slow25,slow10").split(",")
    if any(k not in (K1_KINDS if opts.k1 else KINDS) for k in order):
        raise SystemExit(f"--kinds {opts.kinds}: give a comma list of "
                         f"{', '.join(K1_KINDS if opts.k1 else KINDS)}")
    if n >= 3 and opts.kinds:
        kinds = [[order[i % len(order)]] for i in range(n)]
    elif n >= 3:
        half = (n + 1) // 2
        kinds = [["null"] if i < half else [("slow25", "slow10")[(i - half) % 2]] for i in range(n)]
    else:
        kinds = [order[i:] + order[:i] for i in range(n)]
    return list(zip(kinds, cores, strict=True))


def table(figs: dict[str, Any]) -> str:
    lines = ["calibration | rule | decisions | false accepts / accepted slower (95% CP) | covers true ratio | "
             "mean triplets", "--- | --- | --- | --- | --- | ---"]
    for cal, fig in figs.items():
        for name, f in fig.items():
            if "false_accepts" in f:
                got = f"{f['false_accepts']} [{f['false_accept_ci95'][0]:.3f}, {f['false_accept_ci95'][1]:.3f}]"
            else:
                got = f"{f['accepted_slower']} [{f['power_ci95'][0]:.3f}, {f['power_ci95'][1]:.3f}]"
            cover = f.get("covers_true_ratio", "")
            mean = f"{f['mean_triplets']:.2f}" if "mean_triplets" in f else ""
            lines.append(f"{cal} | {name} | {f['decisions']} | {got} | {cover} | {mean}")
    return "\n".join(lines)


def run_real(opts: argparse.Namespace, prov: dict[str, Any]) -> None:
    out = opts.out or Path(os.environ.get("OUT") or ".orch/bench") / "bench_verdict_real.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    deadline = t0 + opts.budget_s
    save = threading.Event()
    with tempfile.TemporaryDirectory(prefix="orch-bench-verdict-") as tmp:
        streams = [Stream(i, kinds, cores, Path(tmp) / f"s{i}") for i, (kinds, cores) in enumerate(assign(opts))]
        for s in streams:
            s.work.mkdir()
        threads = [threading.Thread(target=stream_main, args=(s, opts, deadline, save), daemon=True)
                   for s in streams]
        for t in threads:
            t.start()

        def write() -> dict[str, Any]:
            decs = [d for c in CALIBRATIONS for d in decisions(streams, c)]
            fig = {c: tally([d for d in decs if d["calibration"] == c]) for c in CALIBRATIONS}
            doc = {"schema": "orch.bench-verdict-real/1", **prov, "device": opts.device, "streams": opts.streams,
                   "cores_per_stream": opts.cores_per_stream if opts.streams > 1 else None,
                   "budget_s": opts.budget_s, "small": opts.small, "calibration_repeats": opts.calibration_repeats,
                   "wall_s": round(time.monotonic() - t0, 1), "figures": fig, "decisions": decs,
                   "streams_detail": [{"index": s.index, "kinds": s.kinds, "runs": s.runs, "notes": s.notes,
                                       "triplets": s.triplets} for s in streams]}
            if opts.k1:
                rows = [r for s in streams for r in s.decisions]
                doc |= {"k1": True, "noise_sleep_s": opts.noise_sleep_s, "k1_decisions": rows,
                        "k1_figures": k1_tally(rows)}
                fig = {"k1": doc["k1_figures"]}
            out.write_text(json.dumps(doc, indent=1) + "\n")
            return fig

        while any(t.is_alive() for t in threads):
            if save.wait(5.0):
                save.clear()
                write()
        fig = write()
    if opts.k1:
        print(k1_table([r for s in streams for r in s.decisions]))
    for s in streams:
        runs = ", ".join(f"{r['kind']} K={r.get('triplets', 1)} {r['wall_s']:.0f}s ({r['why']})" for r in s.runs)
        print(f"stream {s.index} {'/'.join(s.kinds)}: {runs or 'no run'}" + "".join(f"; {n}" for n in s.notes))
    print(table(fig))
    print(f"figures: {out}")


def merge(files: list[Path], out: Path, prov: dict[str, Any]) -> None:
    """Decisions over the streams of several --real calls on one host kind (each stream keeps its own calibration)."""
    docs = [json.loads(f.read_text()) for f in files]
    devices = {d["device"] for d in docs}
    if len(devices) != 1:
        raise SystemExit(f"--merge: the files come from devices {sorted(devices)}; merge one device's calls only")
    streams: list[Stream] = []
    for doc in docs:
        for sd in doc["streams_detail"]:
            s = Stream(len(streams), sd["kinds"], None, Path("."), triplets=sd["triplets"], runs=sd["runs"],
                       notes=sd["notes"])
            streams.append(s)
    if all(d.get("k1") for d in docs):  # issue 34: the K = 1 rows of every call, streams renumbered
        rows, base = [], 0
        for d in docs:
            rows += [r | {"stream": r["stream"] + base} for r in d["k1_decisions"]]
            base += len(d["streams_detail"])
        k1 = {"schema": "orch.bench-verdict-real/1", **prov, "device": devices.pop(), "k1": True,
              "merged": [{k: d.get(k) for k in ("commit", "files_differ_from_commit", "streams", "budget_s", "wall_s",
                                                "noise_sleep_s", "calibration_repeats")}
                         | {"command": " ".join(no_paths(a) for a in str(d.get("command", "")).split(" "))}
                         for d in docs],
              "k1_figures": k1_tally(rows), "k1_decisions": rows,
              "streams_detail": [sd for d in docs for sd in d["streams_detail"]]}
        out.write_text(json.dumps(k1, indent=1) + "\n")
        print(k1_table(rows))
        print(json.dumps(k1["k1_figures"], indent=1))
        print(f"figures: {out}")
        return
    decs = [d for c in CALIBRATIONS for d in decisions(streams, c)]
    fig = {c: tally([d for d in decs if d["calibration"] == c]) for c in CALIBRATIONS}
    doc = {"schema": "orch.bench-verdict-real/1", **prov, "device": devices.pop(), "merged": [
        {k: d.get(k) for k in ("commit", "files_differ_from_commit", "streams", "budget_s", "wall_s")}
        | {"command": " ".join(no_paths(a) for a in str(d.get("command", "")).split(" "))} for d in docs],
        "figures": fig, "decisions": decs,
        "streams_detail": [{"index": s.index, "kinds": s.kinds, "runs": s.runs, "notes": s.notes,
                            "triplets": s.triplets} for s in streams]}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(fig))
    print(f"figures: {out}")
