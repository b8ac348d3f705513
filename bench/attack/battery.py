"""`make attack`: the reviewer's attacks of issue 17 re-run for real on r3-mini (CPU, 2 ranks) against this tree.

Cheating candidates (patched files, bent protocols), faults (real signals, a real full disk, a real foreign lock),
ledger and evidence tampers (real byte flips and rewrites, a witnessed head outside the home), bad inputs, and
what a candidate leaves behind for baseline B (issue 27: a .pth, a poisoned compile cache, a double-forked process).
Prints a table (attack, expected, observed, pass/fail) and writes an aggregate JSON summary with provenance.

Usage: python bench/attack/battery.py [--only cheat,fault,tamper,input,isolation] [--out FILE] [--work DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cheats import mix2_cheats, mix_cheats, preflight_cheats, separate_cheats
from common import REPO, Launch, Reference, Row, Work, cli, make_project, orch_argv, remove_tree
from faults import faults
from inputs import inputs
from isolation import isolation_attacks
from tampers import tampers

FAMILIES = ("input", "tamper", "cheat", "fault", "isolation")
SCHEMA = "orch.attack-battery/1"


def reference(work: Work) -> Reference:
    """One complete run of the shipped protocol (rollouts shortened), audited with a head witnessed outside it."""
    base = work.fresh("reference")
    proj = make_project(base)
    witness = base / "published-heads.jsonl"
    home = base / "home"
    launch = Launch(proj, proj / "protocol" / "small.yaml", home, "reference", extra_env={"ORCH_WITNESS": str(witness)})
    rc = launch.wait(timeout=1500)
    run_id = launch.run_id()
    if not (home / "runs" / run_id / "audit.json").exists():
        raise RuntimeError(f"the reference run did not complete (exit {rc}): {launch.stderr.strip()[-1500:]}")
    audit = cli(orch_argv("audit", run_id, "--home", str(home)), cwd=proj, extra_env={"ORCH_WITNESS": str(witness)})
    return Reference(proj, home, run_id, audit.returncode, witness, {"launch_exit": rc})


def table(rows: list[Row]) -> str:
    """Every cell whole: long cells fold onto continuation lines, never cut."""
    widths = (6, 44, 40, 60, 4)
    head = ("family", "attack", "expected", "observed", "pass")
    out = []

    def emit(cells: tuple[str, ...]) -> None:
        wrapped = [textwrap.wrap(c, w, break_long_words=True) or [""] for c, w in zip(cells, widths, strict=True)]
        for i in range(max(len(w) for w in wrapped)):
            out.append(" | ".join((w[i] if i < len(w) else "").ljust(width)
                                  for w, width in zip(wrapped, widths, strict=True)).rstrip())

    emit(head)
    out.append("-+-".join("-" * w for w in widths))
    for r in rows:
        emit((r.family, r.name, r.expected, r.observed, "PASS" if r.ok else "FAIL"))
    return "\n".join(out)


def counts(rows: list[Row]) -> dict[str, dict[str, int]]:
    return {f: {"passed": sum(r.ok for r in rows if r.family == f), "total": sum(r.family == f for r in rows)}
            for f in FAMILIES if any(r.family == f for r in rows)}


def commit() -> dict[str, object]:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True, check=False)
    # None where git did not answer (e.g. a user other than the checkout's owner: git's safe.directory refusal)
    return {"commit": head.stdout.strip() or None,
            "tracked_changes": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None,
            "uid": os.geteuid()}


def document(rows: list[Row], only: list[str], started: float, timings: dict[str, float],
             previous: Path | None) -> dict[str, Any]:
    """The JSON summary: aggregate rows, counts and the provenance of the run (and, with --update, of the runs
    whose families were kept)."""
    run = {**commit(), "families": only,
           "command": f"make attack (nice -n 5 .venv/bin/python bench/attack/battery.py --only {','.join(only)})",
           "python": platform.python_version(),
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
           "wall_s": round(time.time() - started, 1), "step_seconds": timings}
    attacks = [{"family": r.family, "attack": r.name, "expected": r.expected, "observed": r.observed, "pass": r.ok}
               for r in rows]
    runs = [run]
    if previous is not None and previous.exists():
        old = json.loads(previous.read_text())
        kept = [a for a in old["attacks"] if a["family"] not in only]
        attacks = sorted(kept + attacks, key=lambda a: FAMILIES.index(a["family"]))
        old_runs = old["provenance"].get("runs") or [
            {**old["provenance"], "families": sorted({a["family"] for a in old["attacks"]})}]  # a first-version file
        kept_runs = [{**r, "families": [f for f in r["families"] if f not in only]} for r in old_runs]
        runs = [*[r for r in kept_runs if r["families"]], run]  # each run names the families whose rows it gave
    counts = {f: {"passed": sum(a["pass"] for a in attacks if a["family"] == f),
                  "total": sum(a["family"] == f for a in attacks)}
              for f in FAMILIES if any(a["family"] == f for a in attacks)}
    return {
        "schema": SCHEMA,
        "what": "issue 17's attacks re-run for real on r3-mini (2 CPU ranks, gloo): cheating candidates, faults, "
                "ledger/evidence tampers with a witnessed head, bad inputs, and what a candidate leaves behind for "
                "baseline B (issue 27: a .pth, a poisoned compile cache, a double-forked process)",
        "provenance": {"runs": runs},
        "counts": counts,
        "attacks": attacks,
    }


def doc_rows(doc: dict[str, Any]) -> list[Row]:
    return [Row(a["family"], a["attack"], a["expected"], a["observed"], a["pass"]) for a in doc["attacks"]]


def write(out: Path, doc: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(FAMILIES), help="families to run, comma-separated")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "validation" / "attack_battery_cpu.json")
    ap.add_argument("--work", type=Path, default=REPO / ".orch" / "attack")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (homes, runs) for inspection")
    ap.add_argument("--update", action="store_true",
                    help="keep the other families' rows (and their provenance) of an existing --out file")
    opts = ap.parse_args(argv)
    only = [f.strip() for f in opts.only.split(",") if f.strip()]
    unknown = sorted(set(only) - set(FAMILIES))
    if unknown:
        ap.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    remove_tree(opts.work)
    opts.work.mkdir(parents=True)
    work = Work(opts.work.resolve())
    started = time.time()
    rows: list[Row] = []
    timings: dict[str, float] = {}

    def step(name: str, fn: Callable[[], list[Row]]) -> None:
        t0 = time.monotonic()
        try:
            got = fn()
        except Exception as err:  # an attack that could not run is a failed row, never a silent pass
            got = [Row(name.split(":")[0], name, "runs", work.scrub(f"could not run: {type(err).__name__}: {err}"))]
        timings[name] = round(time.monotonic() - t0, 1)
        for r in got:
            r.seconds = timings[name]
            print(f"[{'PASS' if r.ok else 'FAIL'}] {r.family}: {r.name} -- {r.observed}", flush=True)
        rows.extend(got)
        write(progress_file, document(rows, only, started, timings, opts.out if opts.update else None))

    progress_file = work.root / "partial.json"  # the rows so far, should the battery be stopped
    ref: Reference | None = None
    if {"input", "tamper"} & set(only):
        t0 = time.monotonic()
        ref = reference(work)
        timings["reference run"] = round(time.monotonic() - t0, 1)
        print(f"reference run complete, audit exit {ref.audit_exit} ({timings['reference run']} s)", flush=True)
    if "input" in only and ref is not None:
        step("input: bad inputs", lambda: inputs(work, ref))
    if "tamper" in only and ref is not None:
        step("tamper: ledger and evidence", lambda: tampers(work, ref))
    if "cheat" in only:
        step("cheat: pre-flight", lambda: preflight_cheats(work))
        step("cheat: mix launch 1", lambda: mix_cheats(work))
        step("cheat: mix launch 2", lambda: mix2_cheats(work))
        step("cheat: failing launches", lambda: separate_cheats(work))
    if "fault" in only:
        step("fault: faults", lambda: faults(work))
    if "isolation" in only:
        step("isolation: left behind for baseline B", lambda: isolation_attacks(work))
    doc = document(rows, only, started, timings, opts.out if opts.update else None)
    print()
    print(table(doc_rows(doc)))
    print()
    for fam, c in doc["counts"].items():
        print(f"{fam}: {c['passed']}/{c['total']}")
    write(opts.out, doc)
    hygiene = cli(orch_argv("hygiene", str(opts.out)), cwd=REPO, timeout=120)
    print(f"wrote {opts.out.relative_to(REPO) if opts.out.is_relative_to(REPO) else opts.out}; "
          f"hygiene exit {hygiene.returncode}{': ' + hygiene.stdout.strip() if hygiene.returncode else ''}")
    if not opts.keep:
        remove_tree(opts.work)
    return 0 if all(r["pass"] for r in doc["attacks"]) and hygiene.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
