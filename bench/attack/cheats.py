"""Cheating candidates: real patched files in a candidate (or a protocol that bends the recipe), each launched
for real on r3-mini; orch must refuse each naming its cause.

Pre-flight cheats must be refused before any GPU time (exit 3, no run); the others run to their end and the
audit (or the failed package) must name the cheat. Independent audit-level cheats share one launch ("mix"),
each checked by its own named cause; a cheat that fails a package gets a launch of its own.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    ANCHOR,
    REPO,
    SCORER,
    TRAINER,
    UTILS,
    Check,
    Edit,
    Launch,
    Row,
    Work,
    candidate_project,
    cli,
    closes,
    edit_file,
    lines,
    make_project,
    orch_argv,
    read_json,
    records,
    write_protocol,
)

INIT = "    train_step = 0\n"  # after the optimizer is built, before step 0
LOGGER = "    logger = RunLogger(training_args.log_dir, rank)\n"


def _preflight(work: Work, name: str, change: Callable[[Path], Path], expect: str) -> Row:
    """A protocol or tree that bends the recipe or the sources: exit 3, one line naming `expect`, no run."""
    row = Row("cheat", name, f"refused before any GPU time: exit 3, one line naming {expect!r}, no run")
    base = work.fresh("pre")
    proj = make_project(base)
    protocol = change(proj)
    home = base / "home"
    done = cli(orch_argv("launch", str(protocol), "--home", str(home), "--lock-dir", str(base / "locks")), cwd=proj,
               timeout=300)
    out = lines(done.stdout + done.stderr)
    c = Check()
    c.saw(f"exit {done.returncode}: {out[-1] if out else ''}")
    c.that(done.returncode == 3, "exit 3")
    c.that(len(out) == 1, f"one line (got {len(out)})")
    c.that(expect in done.stderr, f"names {expect!r}")
    c.that(not (home / "runs").exists() or not any((home / "runs").iterdir()), "no run folder")
    c.that(not records(home), "no ledger record")
    row.ok, row.observed = not c.failed, work.scrub(c.observed())
    return row


def _set_recipe(key: str, value: Any) -> Callable[[Path], Path]:
    return lambda proj: write_protocol(proj, "p.yaml", lambda d: d["recipe"].update({key: value}))


def _append_args(extra: list[str]) -> Callable[[Path], Path]:
    return lambda proj: write_protocol(proj, "p.yaml", lambda d: d["launcher"].update(args=[*d["launcher"]["args"],
                                                                                            *extra]))


def _config(arms: tuple[str, ...], config: dict[str, str]) -> Callable[[Path], Path]:
    def change(d: dict[str, Any]) -> None:
        for arm in arms:
            d["arms"][arm]["config"] = dict(config)
    return lambda proj: write_protocol(proj, "p.yaml", change)


def _edited_tree(proj: Path) -> Path:
    edit_file(proj / UTILS, "    def log(self, stream: str, record: dict) -> None:\n", "        pass  # undeclared\n")
    return proj / "protocol" / "small.yaml"


def preflight_cheats(work: Work) -> list[Row]:
    return [
        _preflight(work, "recipe changed in the protocol (lr 1e-5)", _set_recipe("lr", 1.0e-5),
                   "recipe.lr = 1e-05 (upstream 5e-06)"),
        _preflight(work, "precision fp16 in the protocol", lambda p: write_protocol(
            p, "p.yaml", lambda d: d.update(precision="fp16")), "fp16"),
        _preflight(work, "ViT unfrozen in the protocol (freeze_vit false)", _set_recipe("freeze_vit", False),
                   "freeze_vit"),
        _preflight(work, "undeclared source change (tree differs from the commitment)", _edited_tree,
                   "1 changed (train/train_utils.py)"),
        _preflight(work, "recipe flag given twice in the launcher (last --lr wins)", _append_args(["--lr", "1e-5"]),
                   "--lr"),
        _preflight(work, "recipe flag in --key=value form after the checked one", _append_args(["--eps=1e-6"]),
                   "--eps"),
        _preflight(work, "candidate config overrides a recipe flag (lr)", _config(("candidate",), {"lr": "1e-5"}),
                   "lr"),
        _preflight(work, "both arms' config override a recipe flag the probe cannot observe (KL weight 0)",
                   _config(("baseline", "candidate"), {"kl_weight_text": "0"}), "kl_weight_text"),
    ]


def audit_json(proj: Path, home: Path, run_id: str) -> tuple[int, dict[str, Any], str]:
    shown = cli(orch_argv("audit", run_id, "--home", str(home), "--json"), cwd=proj, timeout=300)
    try:
        doc = json.loads(shown.stdout)
    except json.JSONDecodeError:
        doc = {}
    return shown.returncode, doc, shown.stderr


def _launch_candidate(work: Work, tag: str, edits: list[Edit]) -> tuple[Path, Path, Launch, int]:
    base = work.fresh(tag)
    proj, protocol = candidate_project(base, edits)
    launch = Launch(proj, protocol, base / "home", tag)
    rc = launch.wait(timeout=1500)
    return proj, base / "home", launch, rc


def mix_cheats(work: Work) -> list[Row]:
    """One launch, independent cheats (as the reviewer ran them), each checked by its own cause."""
    cache = f"/tmp/orch-attack-{secrets.token_hex(6)}"
    edits: list[Edit] = [
        (TRAINER, ANCHOR, "        if curr_step == 0:  # in step 1's window, watched in every launch\n"
                          "            h = torch.ones(4, 4, dtype=torch.float16)\n"
                          "            _ = h @ h\n"
                          "        if curr_step == 11:  # first in step 12's window: a timed step\n"
                          "            _ = torch.ones(3, dtype=torch.float16) + 1\n"),
        (TRAINER, INIT, "    model.vit_model.requires_grad_(True)  # the optimizer was built without it\n"),
        (TRAINER, "                    loss = loss + kl_img_loss * training_args.kl_weight_image\n",
         "            loss = loss + 1.0  # the same gradients, another number\n"),
        (UTILS, "    def log(self, stream: str, record: dict) -> None:\n", "        return  # logs nothing\n"),
        (SCORER, "        json.dump(result, fh, sort_keys=True)\n",
         '    with open(score_args.out, "w", encoding="utf-8") as fh:  # scores itself\n'
         '        json.dump({"dev_mean_reward": 1.0, "cheat": True}, fh)\n'),
        (TRAINER, LOGGER, "    try:  # work cached for the next launch in the shared /tmp\n"
                          f"        open({cache!r}, 'w').write('cached')\n"
                          "        cheat = 'written'\n"
                          "    except OSError as exc:\n"
                          "        cheat = exc.strerror\n"
                          "    if training_args.log_dir:\n"
                          "        os.makedirs(training_args.log_dir, exist_ok=True)\n"
                          "        open(os.path.join(training_args.log_dir, f'cheat.{rank}.txt'), 'w').write(cheat)\n"),
    ]
    proj, home, launch, rc = _launch_candidate(work, "mix1", edits)
    run_id = launch.run_id()
    arc, doc, _err = audit_json(proj, home, run_id)
    audit = doc.get("audit") or {}
    ex = audit.get("exactness") or {}
    reasons = [str(r) for r in audit.get("reasons") or []]
    head = f"launch exit {rc}, audit exit {arc}, verdict {audit.get('verdict')!r}"
    forbidden = {(f.get("package"), f.get("step"), f.get("dtype")) for f in ex.get("forbidden") or []}
    diffs = [str(d) for d in ex.get("recipe_differences") or []]
    first = ex.get("scalars_first_mismatch") or {}
    run_dir = home / "runs" / run_id
    rows = []

    def row(name: str, expected: str, cond: bool, seen: str) -> None:
        c = Check()
        c.saw(head)
        c.saw(seen)
        c.that(audit.get("verdict") == "not exact" and arc == 1 and rc == 1, "run refused as not exact")
        c.that(cond, expected)
        rows.append(Row("cheat", name, expected, work.scrub(c.observed()), not c.failed))

    row("fp16 op in a warm-up step (step 1)", "forbidden dtype named at step 1 of train-C",
        ("train-C", 1, "float16") in forbidden, f"forbidden {sorted(map(str, forbidden))}")
    row("fp16 op first in a timed step (step 12)", "named by the watched replay at step 12",
        ("watch-C", 12, "float16") in forbidden, f"coverage {ex.get('watch_coverage')}")
    vit = [d for d in diffs if "vit" in d]
    row("ViT unfrozen in code (requires_grad, optimizer excludes it)", "recipe violation naming the ViT",
        bool(vit) and any("freeze_vit" in d for d in vit), "; ".join(vit[:2]))
    row("loss offset before backward (same gradients, other trainer numbers)",
        "trainer numbers differ, named by step/rank/quantity",
        str(first.get("tensor", "")).startswith("backward"),
        f"first scalar mismatch: step {first.get('step')} rank {first.get('rank')} {first.get('tensor')}")
    silent = [r for r in reasons if "logged no training step" in r]
    row("trainer logs nothing (its numbers cannot be compared)", "arm C refused: logged no training step",
        any(r.startswith("arm C:") for r in silent), silent[0] if silent else "no such reason")
    spec_path = run_dir / "packages" / "score" / "package.json"
    spec = read_json(spec_path) if spec_path.exists() else {}
    sealed = {t.get("arm_label"): Path(str(t.get("sealed_dir"))).name for t in spec.get("score_targets") or []}
    targets = {t.get("arm_label"): t.get("metrics") for t in ((doc.get("dev_score") or {}).get("metrics") or {})
               .get("targets") or []}
    row("scorer of its own in the candidate", "arm C scored by the baseline's sealed scorer",
        sealed == {"A": "baseline", "C": "baseline"} and "cheat" not in (targets.get("C") or {}),
        f"scorer sealed dirs {sealed}")
    notes = sorted({p.read_text() for p in run_dir.glob("packages/*-C/trainer/cheat.*.txt")})
    row("cache written to the shared /tmp for the next launch", "the write is impossible (read-only) or detected",
        notes == ["Read-only file system"] and not Path(cache).exists(), f"in-package result {notes}")
    return rows


def mix2_cheats(work: Work) -> list[Row]:
    edits: list[Edit] = [
        (TRAINER, ANCHOR, "        torch.rand(1)  # one extra RNG draw per step\n"
                          "        from torch.utils._python_dispatch import _get_current_dispatch_mode as _mode\n"
                          "        if curr_step == 11 and _mode() is None:  # fp16 in a timed step, unless watched\n"
                          "            _ = torch.ones(3, dtype=torch.float16) + 1\n"
                          "            open(os.path.join(training_args.log_dir, f'fp16.{rank}'), 'w').write('x')\n"),
        (TRAINER, INIT, "    for g in optimizer.param_groups:\n        g['eps'] = 1e-6  # the recipe bent in code\n"),
    ]
    proj, home, launch, rc = _launch_candidate(work, "mix2", edits)
    arc, doc, _ = audit_json(proj, home, launch.run_id())
    audit = doc.get("audit") or {}
    ex = audit.get("exactness") or {}
    head = f"launch exit {rc}, audit exit {arc}, verdict {audit.get('verdict')!r}"
    rng = ex.get("rng_first_mismatch") or {}
    eps = [str(d) for d in ex.get("recipe_differences") or [] if "eps" in str(d)]
    forbidden = ex.get("forbidden") or []
    readme = " ".join((REPO / "README.md").read_text().split())
    c = Check()
    c.saw(head)
    fired = sorted(p.parent.parent.name for p in (home / "runs" / launch.run_id()).glob("packages/*/trainer/fp16.*"))
    c.saw(f"fp16 op ran in {fired}; forbidden dtypes seen: {len(forbidden)}; replay equal {ex.get('replay_equal')}")
    c.that(bool(fired), "the cheat ran in a timed launch")
    c.that(not forbidden, "the fp16 op is not seen (the limit)")
    c.that("a candidate that detects the watch" in readme, "the README states the limit")
    out = [Row("cheat", "fp16 in a timed step only when no dispatch mode is active (detects the watch)",
               "documented limit: not seen by the watch (README)", work.scrub(c.observed()), not c.failed)]
    for name, expected, cond, seen in (
        ("extra RNG draw per step", "RNG mismatch named at step 1", rng.get("step") == 1,
         f"rng first mismatch: step {rng.get('step')} rank {rng.get('rank')} {rng.get('tensor')}"),
        ("optimizer eps changed in code (1e-6)", "observed recipe differs: eps named", bool(eps),
         eps[0] if eps else "no eps difference"),
    ):
        c = Check()
        c.saw(head)
        c.saw(seen)
        c.that(audit.get("verdict") == "not exact" and arc == 1, "run refused as not exact")
        c.that(cond, expected)
        out.append(Row("cheat", name, expected, work.scrub(c.observed()), not c.failed))
    return out


def _failing(work: Work, tag: str, name: str, edits: list[Edit], expect: str, package: str = "train-C") -> Row:
    """A cheat that must fail its package: the run stops, the failure names `expect`, no audit."""
    row = Row("cheat", name, f"{package} fails naming {expect!r}; no audit")
    _proj, home, launch, rc = _launch_candidate(work, tag, edits)
    run_id = launch.run_id()
    status = closes(home, run_id)
    note = " ".join(str(r["note"]) for r in records(home) if r["run_id"] == run_id and r["package"] == package)
    c = Check()
    c.saw(f"launch exit {rc}; {package} {status.get(package)}; {lines(launch.stderr)[-1] if launch.stderr else ''}")
    c.that(rc == 1, "exit 1")
    c.that(status.get(package) == "failed", f"{package} failed")
    c.that(expect in launch.stderr + note, f"names {expect!r}")
    c.that(not (home / "runs" / run_id / "audit.json").exists(), "no audit")
    row.ok, row.observed = not c.failed, work.scrub(c.observed())
    return row


def _in_package(tag: str, body: str) -> Edit:
    """Code run by rank 0 of train-C only (the trainer's log dir names its package), before step 0; what it saw
    goes to a file in the package's trainer folder."""
    indented = "".join(f"            {ln}\n" for ln in body.strip("\n").splitlines())
    return (TRAINER, INIT,
            f"    if rank == 0 and 'train-C' in str(training_args.log_dir):\n"
            f"        import pathlib as _pl\n"
            f"        _run = _pl.Path.cwd().parents[1]\n"
            f"        _seen = []\n"
            f"        try:\n{indented}"
            f"        except OSError as exc:\n"
            f"            _seen.append(f'{{type(exc).__name__}}: {{exc.strerror}}')\n"
            f"        os.makedirs(training_args.log_dir, exist_ok=True)\n"
            f"        open(os.path.join(training_args.log_dir, '{tag}.txt'), 'w').write('; '.join(_seen))\n")


def _launch_in_package(work: Work, tag: str, body: str) -> tuple[Path, Path, Launch, int, str]:
    """A candidate launched with `body` run in train-C (_in_package), and what that code saw ('nothing' if it wrote
    no line)."""
    proj, home, launch, rc = _launch_candidate(work, tag, [_in_package(tag, body)])
    seen = home / "runs" / launch.run_id() / "packages" / "train-C" / "trainer" / f"{tag}.txt"
    return proj, home, launch, rc, seen.read_text() if seen.exists() else "nothing"


def separate_cheats(work: Work) -> list[Row]:
    rows = [
        _failing(work, "clock1", "time.perf_counter replaced by the trainer (0.8x)", [
            (TRAINER, INIT, "    import time as _t\n    _real = _t.perf_counter\n"
                            "    _t.perf_counter = lambda: _real() * 0.8\n")], "perf_counter"),
        _failing(work, "clock2", "the probe's own bound clock patched through sys.modules (0.8x)", [
            (TRAINER, INIT, "    import sys as _s\n    for _m in list(_s.modules.values()):\n"
                            "        if hasattr(_m, '_perf_counter'):\n"
                            "            _r = _m._perf_counter\n"
                            "            _m._perf_counter = lambda _r=_r: _r() * 0.8\n")], "clock disagreement"),
    ]
    rows.append(_sealed_write(work))
    rows.append(_steps_forgery(work))
    rows.append(_home_write(work))
    return rows


def _impossible_or_refused(c: Check, said: str, rc: int, arc: int, doc: dict[str, Any], refusal: bool,
                           refused: str) -> None:
    """A cheat that writes another package's evidence from inside train-C holds one of two ways: the write is
    impossible (the package sees that folder read-only: namespace mode, issue 49) and the run is exact and never
    accepted; or the write happened and orch refused the run, naming what was written (scan mode)."""
    blocked = said != "nothing" and "OSError" in said and "written" not in said and "rewrote" not in said
    audit = doc.get("audit") or {}
    c.that(blocked or refusal, f"the write impossible inside the package, or {refused}")
    if blocked:
        c.that(rc == 0 and arc == 0 and audit.get("exact") is True, "the run exact (nothing was written)")
    c.that(audit.get("verdict") != "accepted", "never accepted")


def _sealed_write(work: Work) -> Row:
    """The candidate makes the baseline slower: it appends a sleep to the sealed baseline copy from inside train-C
    (train-B then runs it)."""
    name = "candidate slows the baseline: writes into the sealed baseline copy mid-run"
    row = Row("cheat", name, "impossible (the baseline copy is read-only in train-C), or train-C fails naming "
                             "'sealed copy of baseline was modified'")
    body = ("_f = _run / 'sealed' / 'baseline' / 'train' / 'online_rl.py'\n"
            "_f.chmod(0o644)\n"
            "with open(_f, 'a') as _h:\n"
            "    _h.write('\\nimport time\\ntime.sleep(0.01)\\n')\n"
            "_seen.append('written')")
    proj, home, launch, rc, said = _launch_in_package(work, "sealed", body)
    run_id = launch.run_id()
    audited = (home / "runs" / run_id / "audit.json").exists()
    arc, doc, _err = audit_json(proj, home, run_id) if audited else (1, {}, "")
    status = closes(home, run_id)
    c = Check()
    c.saw(f"in-package: {said}; launch exit {rc}; train-C {status.get('train-C')}; audit exit {arc}")
    refused = (rc == 1 and status.get("train-C") == "failed" and "sealed copy of baseline was modified" in
               launch.stderr and not audited)
    _impossible_or_refused(c, said, rc, arc, doc, refused, "train-C failed naming the modified sealed copy")
    row.ok, row.observed = not c.failed, work.scrub(c.observed())
    return row


def _steps_forgery(work: Work) -> Row:
    """The candidate makes the baseline look slower: it rewrites train-A's step times from inside train-C."""
    name = "candidate rewrites train-A's step times from inside its package (A 1.5x slower)"
    row = Row("cheat", name, "impossible (train-A's folder is read-only in train-C), or the audit refuses: train-A's "
                             "step file is not what train-A reported")
    body = ("import json as _j\n"
            "for _f in sorted((_run / 'packages' / 'train-A').glob('steps.rank*.jsonl')):\n"
            "    _rows = [_j.loads(_l) for _l in _f.read_text().splitlines()]\n"
            "    for _r in _rows:\n"
            "        if _r['step'] >= 10:\n"
            "            _r['duration_s'] = _r['duration_s'] * 1.5\n"
            "    _f.write_text(''.join(_j.dumps(_r) + '\\n' for _r in _rows))\n"
            "    _seen.append('rewrote ' + _f.name)")
    proj, home, launch, rc, said = _launch_in_package(work, "stepsforge", body)
    run_id = launch.run_id()
    arc, doc, err = audit_json(proj, home, run_id)
    c = Check()
    c.saw(f"in-package: {said}")
    c.saw(f"launch exit {rc}, audit exit {arc}: {lines(err)[-1] if err else ''}")
    refused = arc == 1 and rc == 1 and "packages/train-A/steps.rank0.jsonl" in err + launch.stderr
    _impossible_or_refused(c, said, rc, arc, doc, refused, "launch and audit exit 1 naming train-A's step file")
    row.ok, row.observed = not c.failed, work.scrub(c.observed())
    return row


def _home_write(work: Work) -> Row:
    """The candidate writes orch's own home (ledger, witness) from inside its package: the home is in the project
    checkout, as `./.orch` is by default."""
    name = "candidate writes orch's home from inside its package (ledger record, witness file)"
    row = Row("cheat", name, "impossible (read-only outside the run dir and scratch) or the run refused")
    body = ("_home = _run.parent.parent\n"
            "try:\n"
            "    (_home / 'witness').mkdir(exist_ok=True)\n"
            "    (_home / 'witness' / 'heads.jsonl').open('a').write('')\n"
            "    _seen.append('witness writable')\n"
            "except OSError as exc:\n"
            "    _seen.append(f'witness: {exc.strerror}')\n"
            "from ledger.cost.store import Ledger as _L\n"
            "_L(_home / 'ledger' / 'ledger.arrows').append(run_id='forged', package='forged', kind='checks',\n"
            "    status='not-run', protocol_id='forged')\n"
            "_seen.append('ledger record appended')")
    proj, home, launch, rc, said = _launch_in_package(work, "homewrite", body)
    run_id = launch.run_id()
    forged = [r for r in records(home) if r["run_id"] == "forged"]
    arc, _doc, _err = audit_json(proj, home, run_id)
    c = Check()
    c.saw(f"in-package: {said}; forged ledger records {len(forged)}; launch exit {rc}, audit exit {arc}")
    c.that(not forged, "no record of the package's in the ledger")
    c.that("writable" not in said, "the witness file not writable")
    row.ok, row.observed = not c.failed, work.scrub(c.observed())
    return row
