"""Issue 50's decisions on one GPU in one device call, each step skipped once the deadline is near: GPU-busy and the
floor (plain fresh launches of the GPU-bound r3-mini, no orch), `orch calibrate` with 3 A/A launches (orch's own A/A
noise, against that floor), then K = 1 launches of the null and of a known 5% slowdown, the 2% slowdown under the
sequential stop (K <= 4) and r3-mini's candidate (its fusion switches on). The slowdowns are extra GPU work that
changes no bits: fp32 products of private tensors after each optimizer step, as many as make the fraction of the
calibrated baseline step (R3_BENCH_GPU_WORK, an arm switch of a copy of the trainer; the baseline is git HEAD).

Prints one table; writes the figures (JSON) and the run records (runs/ and ledger/, no scratch) under --out.

Order: the first plain triplet(s) size what follows; after the null and the 5% decision, --floor-after more plain
triplets join the floor (so a short device budget decides first), then the 2% and the candidate. --deadline-file: a
file holding a Unix time; when present it replaces the deadline, so a later device call can move it.

A slowdown that the calibration cannot decide (the K = 1 interval, or the sequential one at its maximum, of a candidate
as steady as the baseline at least as wide as the slowdown) is skipped and named, leaving its time to the rest.

--plain-triplets 0 runs no plain launch first (--aa-launch-s then sizes the calibration); --decisions picks which K = 1
decisions run (a later device call on another card needs its own calibration first).

Usage: python bench/gpu_bound.py [--device cuda|cpu] [--budget-s 480] [--plain-triplets 2] [--floor-after 0]
       [--deadline-file F] [--aa-launch-s 320] [--decisions null,5pct,2pct,candidate] [--small] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from bench_floor import BOUND_NULL, floor_doc, orch_aa, plain_floor, protocol_copy, table
from bench_null import GIT, baseline_step_s, env, orch, project

from ledger.verdict.decide.stats import Position, Spread, expected_half_width

REPO = Path(__file__).resolve().parents[1]
BOUND = "r3_mini_cuda1_bound.yaml"
WORK_VAR = "R3_BENCH_GPU_WORK"
MM_SIZE = 2048
SCORE_S = 45.0  # the DEV scorer of the bound size, seconds (an A/A launch has none to measure it by)
MARGIN = 1.05
AA_PER_PLAIN = 2.6  # an A/A launch's wall time over its three plain launches' (H100, e6776f1: 306 s / 117 s)
DECISIONS = ("null", "5pct", "2pct", "candidate")
SETUP_ANCHOR = "    for curr_step in range(train_step, training_args.total_steps):\n"
SETUP = (
    f'    bench_work = int(os.environ.get("{WORK_VAR}", "0"))  # gpu-bound bench: known extra GPU work, no bits\n'
    f"    bench_a = torch.full(({MM_SIZE}, {MM_SIZE}), 1.0 / {MM_SIZE}, device=device) if bench_work else None\n"
    "    bench_b = torch.empty_like(bench_a) if bench_a is not None else None\n"
)
WORK_ANCHOR = "        scheduler.step()\n"
# the host waits for the products, so they add their own time to the step: without the wait they filled the GPU's
# idle gaps of the next step (89% busy), and the extra time of a window ranged 0.04-0.32 s against the 0.13 s planned
# (docs/validation/gpu_bound_h100x1_1193f02.json), a candidate noisier than the baseline by its own construction
WORK = (
    "        for _ in range(bench_work):  # fp32 products of private tensors: results unused, no RNG drawn\n"
    "            torch.mm(bench_a, bench_a, out=bench_b)\n"
    "        if bench_work and bench_a.is_cuda:\n"
    "            torch.cuda.synchronize()\n"
)
MM_TIMER = f"""
import sys, time, torch
dev = sys.argv[1]
torch.backends.cuda.matmul.allow_tf32 = False
a = torch.full(({MM_SIZE}, {MM_SIZE}), 1.0 / {MM_SIZE}, device=dev)
b = torch.empty_like(a)
def sync():
    if dev == "cuda":
        torch.cuda.synchronize()
for _ in range(10):
    torch.mm(a, a, out=b)
sync()
n = 200 if dev == "cuda" else 5
t = time.perf_counter()
for _ in range(n):
    torch.mm(a, a, out=b)
sync()
print((time.perf_counter() - t) / n)
"""


def product_s(device: str) -> float:
    """Seconds of one fp32 product of the bench's size on this device (tf32 off, as the trainer runs)."""
    out = subprocess.run([sys.executable, "-c", MM_TIMER, device], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def work_tree(proj: Path) -> None:
    """The trainer of the project's working tree with the switch (git HEAD, the baseline, stays as committed)."""
    trainer = proj / "examples" / "r3_mini" / "train" / "online_rl.py"
    text = trainer.read_text()
    if WORK in text:
        return
    if text.count(SETUP_ANCHOR) != 1 or text.count(WORK_ANCHOR) != 1:
        raise SystemExit("gpu-bound: the trainer's anchors moved (the step loop or scheduler.step())")
    trainer.write_text(text.replace(SETUP_ANCHOR, SETUP + SETUP_ANCHOR).replace(WORK_ANCHOR, WORK_ANCHOR + WORK))


def slowdown_protocol(proj: Path, null: Path, products: int, label: str) -> Path:
    """Baseline: git HEAD under the published commitment; candidate: the working tree with R3_BENCH_GPU_WORK set."""
    work_tree(proj)
    data = yaml.safe_load(null.read_text())
    switches = dict(data["arms"]["baseline"]["switches"])
    data["arms"] = {
        "baseline": {"commitment": "manifests/r3_mini.json", "source": {"git": "HEAD"}, "switches": switches},
        "candidate": {"commitment": "manifests/bench_gpu_work.json", "source": "tree", "under_evaluation": True,
                      "switches": {**switches, WORK_VAR: str(products)}},
    }  # fmt: skip
    data["name"] = f"{data['name']}-gpu-work-{label}"
    data["measurement"]["repeats"] = 1
    path = proj / "protocol" / f"slowdown_{label}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    frozen = subprocess.run(orch("freeze", "--protocol", str(path), "--arm", "candidate", "-o",
                                 "manifests/bench_gpu_work.json"), cwd=proj, env=env(), capture_output=True, text=True)
    if frozen.returncode != 0:
        raise SystemExit(f"gpu-bound: orch freeze failed: {frozen.stderr[-2000:]}")
    return path


def launch(proj: Path, home: Path, protocol: Path, *extra: str) -> tuple[int, dict[str, Any] | None, str, float]:
    """exit code, the run's audit (None when there is none), the output's tail, seconds."""
    t0 = time.monotonic()
    proc = subprocess.run(orch("launch", str(protocol), "--json", "--home", str(home), "--lock-dir",
                               str(home / "locks"), *extra), cwd=proj, env=env(), capture_output=True, text=True)
    wall = time.monotonic() - t0
    audit = None
    try:
        run_id = json.loads(proc.stdout.strip().splitlines()[0])["run_id"]
        path = home / "runs" / run_id / "audit.json"
        audit = json.loads(path.read_text()) if path.is_file() else None
    except (IndexError, ValueError, KeyError):
        pass
    return proc.returncode, audit, (proc.stdout[-800:] + proc.stderr[-1500:]), wall


def package_walls(home: Path) -> dict[str, float]:
    """Mean wall seconds of one package of each kind recorded in the home's ledger (`orch ledger --by kind`)."""
    out = subprocess.run(orch("ledger", "--home", str(home), "--by", "kind", "--json"), env=env(), capture_output=True,
                         text=True, check=True)  # fmt: skip
    groups = json.loads(out.stdout)["groups"]
    return {g["kind"]: g["wall_s"] / g["packages"] for g in groups if g["packages"]}


def checks_commands(home: Path) -> dict[str, list[float]]:
    """Each checks command's wall seconds (prepare, diagnostics, static graph), one per run of the home, in run order:
    where a checks package's time goes."""
    out: dict[str, list[float]] = {}
    for result in sorted((home / "runs").glob("*/packages/checks/result.json")):
        doc = json.loads(result.read_text())
        for d in [*doc.get("prepare", []), *doc.get("diagnostics", [])]:
            if d.get("wall_s") is not None:
                out.setdefault(d["name"], []).append(d["wall_s"])
    return out


def out_of_reach(calibration: dict[str, Any] | None, frac: float | None, triplets: int) -> str | None:
    """Why a known slowdown of `frac` cannot be decided with `triplets` on this host's calibration (the interval a
    candidate as steady as the baseline gets is at least as wide as the effect: under an even chance), or None."""
    if frac is None or not calibration or not calibration.get("df"):
        return None
    cal = Spread(float(calibration["sd"]), int(calibration["df"]),
                 Position(float(calibration["mean_log_speedup"]), 0.0, int(calibration["repeats"])))
    width = math.log1p(expected_half_width(cal, triplets))
    if width < math.log1p(frac):  # the slowdown's |log speedup|: C takes 1 + frac of the step
        return None
    return (f"this host's calibration (SD {cal.sd:.4f}, df {cal.df}) gives +-{math.expm1(width):.1%} at K = "
            f"{triplets} for a steady candidate, as wide as the {frac:.0%} slowdown: a launch would not decide it")


def launch_need(per_aa: float, walls: dict[str, float], triplets: int) -> float:
    """Seconds a K = `triplets` launch should take, from what the calibration's A/A launches took: one A/A launch
    (checks, the triplet, the reloads between its launches), then the trailing reload, the watched replay (a train
    launch) and the scorer, and 3 train launches and 3 reloads for each further triplet."""
    train, reload = walls.get("train", 0.0), walls.get("reload", 0.0)
    return MARGIN * (per_aa + reload + train + SCORE_S + (triplets - 1) * 3 * (train + reload))


def row(kind: str, audit: dict[str, Any], wall: float, code: int, planned: float | None) -> dict[str, Any]:
    iv = audit["interval"]
    busy = audit.get("gpu_busy") or {}
    return {
        "kind": kind, "run_id": audit["run_id"], "exit_code": code, "wall_s": round(wall, 1),
        "planned_speedup": planned, "triplets": iv["triplets"], "headlines": iv["headlines"],
        "estimate": iv["estimate"], "low": iv["low"], "high": iv["high"], "half_width": iv.get("half_width"),
        "df": iv["df"], "variance_source": iv["variance_source"], "verdict": audit["verdict"],
        "direction": audit.get("direction"), "exact": audit.get("exact"),
        "max_drift": max(t["max_drift"] for t in audit["replication"]["triplets"]),
        "positions": [t["levels"] for t in (audit.get("positions") or {}).get("triplets", [])],
        "gpu_busy": busy.get("timed_busy"), "gpu_busy_words": busy.get("words"), "reasons": audit["reasons"][:3],
    }  # fmt: skip


def merge_floor(first: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Two batches of plain triplets of one workload as one floor."""
    launches = first["launches"] + [{**x, "triplet": x["triplet"] + len(first["trips"])} for x in more["launches"]]
    return floor_doc(first["trips"] + more["trips"], launches)


def decisions_table(rows: list[dict[str, Any]]) -> str:
    out = ["kind | K | planned | speedup [95%] | half-width | verdict | max drift | GPU-busy | wall s"]
    for r in rows:
        high = "inf" if r["high"] is None else f"{r['high']:.4f}"
        hw = "-" if r["half_width"] is None else f"{r['half_width']:.2%}"
        planned = "-" if r["planned_speedup"] is None else f"{r['planned_speedup']:.4f}"
        busy = "-" if r["gpu_busy"] is None else f"{r['gpu_busy']:.0%}"
        verdict = r["verdict"] + (f" ({r['direction']})" if r["direction"] else "")
        out.append(f"{r['kind']} | {r['triplets']} | {planned} | {r['estimate']:.4f} [{r['low']:.4f}, {high}] | "
                   f"{hw} | {verdict} | {r['max_drift']:.4f} | {busy} | {r['wall_s']:.0f}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--budget-s", type=float, default=480.0, help="no step starts that would end after this")
    ap.add_argument("--plain-triplets", type=int, default=2)
    ap.add_argument("--floor-after", type=int, default=0, help="plain triplets added after the 5%% decision")
    ap.add_argument("--deadline-file", type=Path, default=None, help="a Unix time that replaces the deadline")
    ap.add_argument("--aa-launch-s", type=float, default=320.0, help="seconds of one A/A launch, with no plain ones")
    ap.add_argument("--decisions", default=",".join(DECISIONS), help="K = 1 decisions, run in the order given, of: "
                    + ",".join(DECISIONS))  # fmt: skip
    ap.add_argument("--calibration-repeats", type=int, default=3)
    ap.add_argument("--max-repeats", type=int, default=4, help="the 2%% slowdown's sequential stop")
    ap.add_argument("--small", action="store_true", help="r3-mini's CPU protocols, shorter rollouts: a dry run")
    ap.add_argument("--out", type=Path, default=Path("gpu_bound_out"))
    opts = ap.parse_args()
    unknown = sorted(set(opts.decisions.split(",")) - set(DECISIONS))
    if unknown:
        ap.error(f"--decisions: {', '.join(unknown)} is not one of {', '.join(DECISIONS)}")
    deadline = time.monotonic() + opts.budget_s
    opts.out.mkdir(parents=True, exist_ok=True)
    null_name, cand_name = (BOUND_NULL, BOUND) if opts.device == "cuda" else ("r3_mini_null.yaml", "r3_mini.yaml")
    figures: dict[str, Any] = {"device": opts.device, "null_protocol": null_name, "candidate_protocol": cand_name,
                               "budget_s": opts.budget_s, "skipped": [], "rows": []}  # fmt: skip
    rows: list[dict[str, Any]] = figures["rows"]

    def save() -> None:
        (opts.out / "gpu_bound.json").write_text(json.dumps(figures, indent=1) + "\n")

    def left() -> float:
        if opts.deadline_file is not None and opts.deadline_file.is_file():
            try:
                return float(opts.deadline_file.read_text().strip()) - time.time()
            except ValueError:
                pass
        return deadline - time.monotonic()

    with tempfile.TemporaryDirectory(prefix="orch-gpu-bound-") as tmp:
        proj = project(Path(tmp))
        home = Path(tmp) / "home"
        for name in {null_name, cand_name}:
            (proj / "protocol" / name).write_text((REPO / "protocol" / name).read_text())
        subprocess.run([*GIT, "add", "-A"], cwd=proj, check=True)
        subprocess.run([*GIT, "commit", "-q", "-m", "gpu-bound protocols"], cwd=proj, check=True)
        null = protocol_copy(proj, null_name, opts.small)
        figures["product_s"] = product_s(opts.device)
        print(f"one {MM_SIZE}^2 fp32 product: {figures['product_s'] * 1000:.3f} ms", flush=True)
        # 1. GPU-busy and the floor: plain launches, no orch (they also size what follows); none with 0
        plain: dict[str, Any] = {"triplets": 0, "trips": [], "launches": []}
        if opts.plain_triplets > 0:
            plain = plain_floor(proj, null, opts.plain_triplets, opts.device, Path(tmp) / "plain",
                                deadline=time.monotonic() + left() - 0.6 * opts.budget_s)  # fmt: skip
        figures["plain"] = plain
        save()
        # 2. orch calibrate: 3 A/A launches (orch's own noise against the floor; pooled into every audit below), as
        # many as fit (at least 2, for an SD). One A/A launch (checks, A, C, B, the reloads between them) took 2.6x
        # its three plain launches on an H100 (docs/validation/gpu_bound_h100x1_e6776f1.json); without plain
        # launches, --aa-launch-s says what one takes
        plain_s = max((x["wall_s"] for x in plain["launches"]), default=None)
        aa_s = opts.aa_launch_s if plain_s is None else AA_PER_PLAIN * 3 * plain_s
        fit = min(opts.calibration_repeats, int(left() / aa_s))
        if fit < 2:
            figures["skipped"].append(f"orch calibrate: 2 A/A launches need about {2 * aa_s:.0f} s, {left():.0f} s "
                                      "left")
            save()
            print(f"skipped orch calibrate and every decision: {figures['skipped'][-1]}")
            print(table(plain, {}))
            return 1
        figures["calibration_repeats"] = fit
        t0 = time.monotonic()
        aa = orch_aa(proj, null, fit, home, timeout_s=left())
        figures["orch_aa"] = aa
        save()
        print(table(plain, aa), flush=True)
        if "error" in aa:
            print(f"orch calibrate failed (exit {aa['exit_code']}):\n{aa['error']}", flush=True)
            return 1
        per_aa = (time.monotonic() - t0) / fit
        walls = package_walls(home)
        figures["package_walls_s"] = walls
        cal_audit = json.loads((home / "runs" / aa["run_ids"][-1] / "audit.json").read_text())
        step = baseline_step_s(cal_audit)
        figures["baseline_step_s"] = step
        plan: dict[str, tuple[str, float | None, int]] = {
            "null": ("null", None, 1), "5pct": ("slowdown 5%", 0.05, 1),
            "2pct": ("slowdown 2% sequential", 0.02, opts.max_repeats), "candidate": ("candidate", None, 1)}
        for key in dict.fromkeys(opts.decisions.split(",")):  # in the order asked
            kind, frac, triplets = plan[key]
            if kind.endswith("sequential") and opts.floor_after > 0 and plain_s is not None:
                # the floor's triplets keep time for the next decision only where both fit
                keep = launch_need(per_aa, walls, 1)
                keep = keep if keep + 3.5 * plain_s <= left() else 0.0
                more = plain_floor(proj, null, opts.floor_after, opts.device, Path(tmp) / "plain",
                                   deadline=time.monotonic() + left() - keep, launch_s=plain_s)  # fmt: skip
                figures["plain"] = plain = merge_floor(plain, more)
                save()
                print(table(plain, aa), flush=True)
            # a slowdown this host's calibration cannot tell from nothing spends a launch for no decision: skipped
            # (the null and the candidate always run: the null checks that nothing is accepted)
            undecidable = out_of_reach(aa.get("calibration"), frac, opts.max_repeats if kind.endswith("sequential")
                                       else triplets)
            if undecidable is not None:
                figures["skipped"].append(f"{kind}: {undecidable}")
                print(f"skipped {kind}: {undecidable}", flush=True)
                continue
            # a launch runs its triplet, then the watched replay of C and the scorer, which an A/A launch leaves out
            need = launch_need(per_aa, walls, 1 if kind.endswith("sequential") else triplets)
            if need > left():
                figures["skipped"].append(f"{kind}: needs about {need:.0f} s, {left():.0f} s left")
                print(f"skipped {kind}: needs about {need:.0f} s, {left():.0f} s left", flush=True)
                continue
            extra: tuple[str, ...] = ()
            planned = None
            if kind == "null":
                protocol = null
            elif kind == "candidate":
                protocol = protocol_copy(proj, cand_name, opts.small)
            else:
                assert frac is not None
                products = max(1, round(frac * step / figures["product_s"]))
                planned = 1.0 / (1.0 + products * figures["product_s"] / step)
                protocol = slowdown_protocol(proj, null, products, f"{round(frac * 100)}pct")
                figures[f"products_{kind}"] = products
                if kind.endswith("sequential"):
                    # the sequential stop may take up to max_repeats triplets: as many as the time left allows
                    fits = [k for k in range(1, opts.max_repeats + 1) if launch_need(per_aa, walls, k) <= left()]
                    fit = max(fits, default=1)
                    extra = ("--until-decided", "--max-repeats", str(fit))
            code, audit, tail, wall = launch(proj, home, protocol, *extra)
            print(f"orch launch {kind}: exit {code}, {wall:.0f} s", flush=True)
            if audit is None:
                print(tail, flush=True)
                figures.setdefault("failed", []).append({"kind": kind, "exit_code": code, "tail": tail})
            else:
                rows.append(row(kind, audit, wall, code, planned))
            save()
        figures["checks_commands_s"] = checks_commands(home)
        save()
        with tarfile.open(opts.out / "gpu_bound_home.tgz", "w:gz") as tar:  # the run records, no scratch
            for part in ("runs", "ledger"):
                if (home / part).exists():
                    tar.add(home / part, arcname=part)
    print("\n" + table(figures["plain"], figures["orch_aa"]))
    print(decisions_table(rows))
    for r in rows:
        if r["gpu_busy_words"]:
            print(f"{r['kind']}: {r['gpu_busy_words']}")
    print(f"baseline step {figures['baseline_step_s'] * 1000:.1f} ms; one product {figures['product_s'] * 1000:.3f} "
          f"ms; skipped: {figures['skipped'] or 'none'}; figures: {opts.out / 'gpu_bound.json'}")
    return 0 if all(math.isfinite(r["estimate"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
