"""`make bench-null`: null runs of r3-mini (candidate = baseline) and a known slowdown (the candidate sleeps a
quarter of the baseline step inside every step), each a real `orch launch` with repeats; prints per run the
per-triplet headlines, the interval and the verdict; writes the figures (JSON, PNG) under $OUT or .orch/bench/.

Usage: python bench/bench_null.py [--device cpu|cuda] [--nulls N] [--repeats K] [--slowdown-repeats K]
       [--slowdown 0.25] [--small] [--budget-s S] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
ANCHOR = "        scheduler.step()\n"
SLEEP_LINE = '        time.sleep(float(os.environ.get("R3_BENCH_SLEEP_S", "0")))  # bench-null: a known slowdown\n'
# shorter rollouts (decode tokens, denoise steps): the model, its initial state and the recipe are unchanged
SMALL = ["--max_output_token_n_gen", "8", "--max_output_token_n_edit", "8",
         "--num_timesteps_gen", "4", "--num_timesteps_edit", "4"]
GIT = ["git", "-c", "user.name=orch-bench", "-c", "user.email=orch-bench@example.invalid", "-c", "commit.gpgsign=false"]


def project(work: Path) -> Path:
    """A committed copy of the reference workload: baseline = git HEAD, the slowdown edits only the working tree."""
    proj = work / "proj"
    shutil.copytree(REPO / "examples" / "r3_mini", proj / "examples" / "r3_mini",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (proj / "protocol").mkdir()
    shutil.copytree(REPO / "manifests", proj / "manifests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "recipes", proj / "recipes")  # the frozen recipe file the protocols name
    for name in ("r3_mini_null.yaml", "r3_mini_cuda1_null.yaml"):
        shutil.copy(REPO / "protocol" / name, proj / "protocol" / name)
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=proj, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "bench-null baseline"], cwd=proj, check=True)
    return proj


def env() -> dict[str, str]:
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def orch(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli.orch", *args]


def null_protocol(proj: Path, device: str, repeats: int, small: bool) -> Path:
    src = "r3_mini_cuda1_null.yaml" if device == "cuda" else "r3_mini_null.yaml"
    data = yaml.safe_load((proj / "protocol" / src).read_text())
    data["measurement"]["repeats"] = repeats
    if small:
        data["launcher"]["args"] += SMALL
        data["scorer"]["command"] += SMALL
    path = proj / "protocol" / f"null_k{repeats}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def git_head_baseline(switches: dict[str, str]) -> dict[str, Any]:
    """The baseline arm of a slowdown's protocol: git HEAD (untouched) under the published commitment."""
    return {"commitment": "manifests/r3_mini.json", "source": {"git": "HEAD"}, "switches": dict(switches)}


def slowdown_protocol(proj: Path, null: Path, repeats: int, sleep_s: float) -> Path:
    """Baseline from git HEAD (untouched); candidate = the tree whose trainer sleeps R3_BENCH_SLEEP_S per step."""
    trainer = proj / "examples" / "r3_mini" / "train" / "online_rl.py"
    text = trainer.read_text()
    if SLEEP_LINE not in text:
        assert text.count(ANCHOR) == 1, "the trainer's scheduler.step() anchor moved"
        trainer.write_text(text.replace(ANCHOR, ANCHOR + SLEEP_LINE))
    data = yaml.safe_load(null.read_text())
    switches = dict(data["arms"]["baseline"]["switches"])
    data["arms"] = {
        "baseline": git_head_baseline(switches),
        "candidate": {"commitment": "manifests/bench_slow.json", "source": "tree", "under_evaluation": True,
                      "switches": {**switches, "R3_BENCH_SLEEP_S": f"{sleep_s:.6f}"}},
    }
    data["name"] = f"{data['name']}-slowdown"
    data["measurement"]["repeats"] = repeats
    path = proj / "protocol" / f"slowdown_k{repeats}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    frozen = subprocess.run(orch("freeze", "--protocol", str(path), "--arm", "candidate", "-o",
                                 "manifests/bench_slow.json"), cwd=proj, env=env(), capture_output=True, text=True)
    if frozen.returncode != 0:
        raise SystemExit(f"orch freeze failed: {frozen.stderr[-2000:]}")
    return path


def launch(proj: Path, protocol: Path, home: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = subprocess.run(orch("launch", str(protocol), "--home", str(home), "--json", "--lock-dir",
                               str(home / "locks")), cwd=proj, env=env(), capture_output=True, text=True)
    wall = time.monotonic() - t0
    try:
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise SystemExit(f"orch launch gave no JSON (exit {proc.returncode}): {proc.stderr[-2000:]}") from None
    audit_path = home / "runs" / summary["run_id"] / "audit.json"
    if not audit_path.is_file():
        raise SystemExit(f"run {summary['run_id']} has no audit (exit {proc.returncode}): {proc.stderr[-1500:]}")
    return {"audit": json.loads(audit_path.read_text()), "wall_s": wall, "exit_code": proc.returncode}


def baseline_step_s(audit: dict[str, Any]) -> float:
    """Median baseline step time in the measured windows (A and B of the first triplet: the audit's "speedup"
    block holds the first triplet's windows)."""
    steps = [s for w in audit["speedup"]["windows"] for label in ("A", "B") for s in w["step_times"][label]]
    return float(statistics.median(steps))


def row(kind: str, res: dict[str, Any]) -> dict[str, Any]:
    a = res["audit"]
    iv = a["interval"]
    return {
        "kind": kind, "run_id": a["run_id"], "protocol_id": a["protocol_id"], "repeats": a["replication"]["repeats"],
        "headlines": a["replication"]["headlines"], "estimate": iv["estimate"], "low": iv["low"], "high": iv["high"],
        "level": iv["level"], "half_width": iv["half_width"], "df": iv["df"],
        "paired_speedups": iv["paired_speedups"], "bounded": iv["bounded"], "sd": iv["sd"],
        "variance_source": iv["variance_source"], "calibration_used": iv["calibration_used"],
        "window_sd": (iv["window_spread"] or {}).get("sd"),
        "triplets_for_5pct": iv["triplets_for_5pct"], "verdict": a["verdict"], "direction": a["direction"],
        "exact": a["exact"], "max_drift": max(t["max_drift"] for t in a["replication"]["triplets"]),
        "covers_one": iv["covers_one"], "wall_s": round(res["wall_s"], 1), "exit_code": res["exit_code"],
        "quiet_host": a.get("quiet_host", {}).get("words"), "clock": a.get("clock", {}).get("words"),
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    head = ["run", "K", "headlines (owner's, per triplet)", "speedup [95% interval]", "half-width", "verdict",
            "max drift", "wall s"]
    lines = [" | ".join(head)]
    for r in rows:
        low = "0" if r["low"] is None else f"{r['low']:.4f}"
        high = "inf" if r["high"] is None else f"{r['high']:.4f}"
        hw = "inf" if r["half_width"] is None else f"{r['half_width']:.1%}"
        verdict = r["verdict"] + (f" ({r['direction']})" if r["direction"] else "")
        lines.append(" | ".join([
            r["kind"], str(r["repeats"]), " / ".join(f"{h:.4f}" for h in r["headlines"]),
            f"{r['estimate']:.4f} [{low}, {high}]", hw, verdict, f"{r['max_drift']:.3f}", f"{r['wall_s']:.0f}",
        ]))  # fmt: skip
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.6 * len(rows) + 1.5), dpi=100)
    for i, r in enumerate(rows):
        low = r["low"] or 0.0
        high = r["high"] if r["high"] is not None else max(2.0, r["estimate"] * 2)
        ax.plot([low, high], [i, i], color="#1f77b4", lw=3)
        ax.plot([r["estimate"]], [i], "o", color="#1f77b4")
        ax.plot(r["headlines"], [i] * len(r["headlines"]), "x", color="#d62728")
    ax.axvline(1.0, color="0.4", ls="--", lw=1)
    if any(r["kind"].startswith("slowdown") for r in rows):
        ax.axvline(0.8, color="0.7", ls=":", lw=1)
    ax.set_yticks(range(len(rows)), [f"{r['kind']} (K={r['repeats']})" for r in rows])
    ax.set_xlabel("speedup: interval (line), estimate (dot), owner's headline per triplet (x)")
    ax.set_xscale("log")
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--nulls", type=int, default=1, help="null runs (candidate = baseline)")
    ap.add_argument("--repeats", type=int, default=2, help="triplets per null run")
    ap.add_argument("--slowdown-repeats", type=int, default=2, help="triplets of the slowdown run (0: none)")
    ap.add_argument("--slowdown", type=float, default=0.25, help="candidate sleep, fraction of the baseline step")
    ap.add_argument("--sleep-s", type=float, default=None, help="candidate sleep in s (default: from the null run)")
    ap.add_argument("--small", action="store_true", help="shorter rollouts (decode tokens, denoise steps)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="skip a run that would not end within this")
    ap.add_argument("--out", type=Path, default=None, help="figures folder (default $OUT, else .orch/bench)")
    opts = ap.parse_args()
    device = opts.device
    if device is None:
        import importlib.util

        device = "cpu"
        if importlib.util.find_spec("torch") is not None:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
    out = opts.out or Path(os.environ.get("OUT") or REPO / ".orch" / "bench")
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    per_launch: float | None = None  # wall seconds per train launch, from the runs so far

    def fits(launches: int) -> bool:
        if per_launch is None:
            return True
        return time.monotonic() - t_start + per_launch * (launches + 2) <= opts.budget_s

    with tempfile.TemporaryDirectory(prefix="orch-bench-null-") as tmp:
        proj = project(Path(tmp))
        home = Path(tmp) / "home"
        null = null_protocol(proj, device, opts.repeats, opts.small)
        sleep_s = opts.sleep_s
        for i in range(opts.nulls):
            if not fits(3 * opts.repeats):
                skipped.append(f"null {i + 1} (K={opts.repeats}): over the {opts.budget_s:.0f} s budget")
                continue
            res = launch(proj, null, home)
            per_launch = res["wall_s"] / (3 * opts.repeats + 2)  # train+reload pairs, plus checks and score
            rows.append(row(f"null {i + 1}", res))
            print(table(rows[-1:]), flush=True)
            if sleep_s is None:
                sleep_s = opts.slowdown * baseline_step_s(res["audit"])
        if opts.slowdown_repeats:
            if sleep_s is None:
                skipped.append("slowdown: no null run measured the baseline step (pass --sleep-s)")
            elif not fits(3 * opts.slowdown_repeats):
                skipped.append(f"slowdown (K={opts.slowdown_repeats}): over the {opts.budget_s:.0f} s budget")
            else:
                slow = slowdown_protocol(proj, null, opts.slowdown_repeats, sleep_s)
                res = launch(proj, slow, home)
                rows.append(row(f"slowdown {opts.slowdown:.0%}", res) | {"sleep_s": sleep_s})
    print()
    print(table(rows))
    for s in skipped:
        print(f"skipped: {s}")
    figures = {
        "schema": "orch.bench-null/1", "device": device, "small": opts.small, "nulls": opts.nulls,
        "repeats": opts.repeats, "slowdown": opts.slowdown, "slowdown_repeats": opts.slowdown_repeats,
        "sleep_s": sleep_s, "runs": rows, "skipped": skipped, "wall_s": round(time.monotonic() - t_start, 1),
        "goals": {
            "nulls_cover_one": all(r["covers_one"] for r in rows if r["kind"].startswith("null")),
            "slowdown_excludes_one_covers_0_8": [
                r["high"] is not None and r["high"] < 1.0 and (r["low"] or 0.0) <= 1 / (1 + opts.slowdown) <= r["high"]
                for r in rows if r["kind"].startswith("slowdown")
            ],
        },
    }  # fmt: skip
    (out / "bench_null.json").write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    if rows:
        plot(rows, out / "bench_null.png")
    print(f"figures: {out / 'bench_null.json'}" + (f", {out / 'bench_null.png'}" if rows else ""))


if __name__ == "__main__":
    main()
