"""Issue 27's attacks: what a candidate leaves behind for baseline B (a `.pth` in the interpreter's site-packages,
a poisoned compile cache, a double-forked process in a new session with a cleared environment), and issue 49's (a
shipped workers/ package, links and a FIFO planted where orch's post-package step reads and moves), each launched for
real on r3-mini from rank 0 of train-C; orch must make it impossible or fail the package naming it.
"""

from __future__ import annotations

import os
import secrets
import site
from pathlib import Path
from typing import Any

import psutil
import yaml
from cheats import INIT, _in_package
from common import TRAINER, Check, Launch, Row, Work, candidate_project, closes, lines, records


def _launch(work: Work, tag: str, edits: list[Any], cache: bool = False,
            base: Path | None = None) -> tuple[Path, Launch, int]:
    base = work.fresh(tag) if base is None else base
    proj, protocol = candidate_project(base, edits)
    if cache:  # a declared compile cache folder, kept after the run, as `orch rehearse --compile-cache DIR` declares
        data = yaml.safe_load(protocol.read_text())
        (base / "cache").mkdir(exist_ok=True)
        data["launcher"]["env"] = {**(data["launcher"].get("env") or {}), "TRITON_CACHE_DIR": str(base / "cache")}
        protocol.write_text(yaml.safe_dump(data, sort_keys=False))
    launch = Launch(proj, protocol, base / "home", tag)
    return base / "home", launch, launch.wait(timeout=1500)


def _said(home: Path, run_id: str, tag: str) -> str:
    seen = home / "runs" / run_id / "packages" / "train-C" / "trainer" / f"{tag}.txt"
    return seen.read_text() if seen.exists() else "nothing"


def leave_behind(work: Work) -> list[Row]:
    """One launch: train-C writes a .pth into site-packages (first trying to make / writable again) and writes a
    kernel into its own compile cache copy, the declared cache folder, every folder in it (the baseline's sealed
    cache) and a new one; the run goes on (the candidate swallows the errors)."""
    pth = Path(site.getsitepackages()[0]) / f"orch-attack-{secrets.token_hex(6)}.pth"
    base = work.fresh("leave")
    cache_root = base / "cache"
    body = ("import subprocess as _sp\n"
            "_seen.append('remount ' + str(_sp.run(['mount', '-o', 'remount,rw', '/'], capture_output=True)"
            ".returncode))\n"
            "try:\n"
            f"    open({str(pth)!r}, 'w').write('# orch attack: a later Python would run an import line here\\n')\n"
            "    _seen.append('pth written')\n"
            "except OSError as exc:\n"
            "    _seen.append(f'pth: {exc.strerror}')\n"
            "_cache = os.environ['TRITON_CACHE_DIR']\n"
            f"_root = {str(cache_root)!r}\n"
            "for _t in [_cache, _root, *[os.path.join(_root, _d) for _d in os.listdir(_root)],"
            " os.path.join(_root, 'baseline-next')]:\n"
            "    _name = 'own copy' if _t == _cache else os.path.relpath(_t, _root)\n"
            "    try:\n"
            "        os.makedirs(_t, exist_ok=True)\n"
            "        open(os.path.join(_t, 'poisoned_kernel.so'), 'w').write('slow')\n"
            "        _seen.append('cache ' + _name + ' written')\n"
            "    except OSError as exc:\n"
            "        _seen.append('cache ' + _name + f': {exc.strerror}')\n")
    who = "root" if os.geteuid() == 0 else "a non-root user"
    pth_row = Row("isolation", f"candidate writes a .pth into the interpreter's site-packages at step 0 (as {who}, "
                  "after trying to remount / writable)",
                  "impossible: Read-only file system; site-packages unchanged after the run")
    cache_row = Row("isolation", "candidate writes a kernel into its own compile cache copy, the declared cache "
                    "folder and every folder in it, the prime's sealed baseline cache included",
                    "only its own copy writable; the baseline's sealed cache unchanged; B runs")
    try:
        home, launch, rc = _launch(work, "leave", [_in_package("leave", body)], cache=True, base=base)
        run_id = launch.run_id()
        said = _said(home, run_id, "leave")
        status = closes(home, run_id)
        poisoned = sorted(str(p.parent.relative_to(cache_root)) for p in cache_root.rglob("poisoned_kernel.so"))
        c = Check()
        c.saw(f"in-package: {said}; launch exit {rc}; train-B {status.get('train-B')}")
        c.that("pth: Read-only file system" in said, "the .pth write failed (read-only)")
        c.that("remount 0" not in said, "root in the package could not remount /")
        c.that(not pth.exists(), "site-packages unchanged (no .pth)")
        c.that(status.get("train-B") == "ok", "baseline B ran")
        pth_row.ok, pth_row.observed = not c.failed, work.scrub(c.observed())
        c = Check()
        c.saw(f"in-package: {'; '.join(s for s in said.split('; ') if s.startswith('cache'))}; "
              f"poisoned folders left in the declared cache folder: {poisoned or 'none'}; "
              f"train-B {status.get('train-B')}")
        c.that(said.count(": Read-only file system") >= 3,
               "the declared folder, the baseline's and a new one read-only")
        c.that(not poisoned, "nothing of the candidate's in the declared folder")
        c.that(any(d.name.startswith("baseline-") for d in cache_root.iterdir()), "the prime made the baseline's cache")
        c.that("cache own copy written" in said, "its own copy writable")
        c.that(status.get("train-B") == "ok", "baseline B ran (the sealed cache was unchanged after train-C)")
        cache_row.ok, cache_row.observed = not c.failed, work.scrub(c.observed())
    finally:
        pth.unlink(missing_ok=True)
    return [pth_row, cache_row]


def survivor(work: Work) -> Row:
    """train-C's rank 0 double-forks a process into a new session with only PATH, which waits and would burn CPU
    beside baseline B: train-C fails naming it, and no process of it is alive after the launch."""
    tag = f"orch-attack-survivor-{secrets.token_hex(6)}"
    helper = ("import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True, "
              "env={'PATH': '/usr/bin'}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
              "stderr=subprocess.DEVNULL)")
    code = "import time; time.sleep(600)"
    edit = (TRAINER, INIT,
            "    if rank == 0 and 'train-C' in str(training_args.log_dir):\n"
            "        import subprocess as _sp, sys as _sys\n"
            f"        _sp.run([_sys.executable, '-c', {helper!r}, _sys.executable, '-c', {code!r}, {tag!r}])\n")
    row = Row("isolation", "candidate double-forks a process into a new session with a cleared environment at "
              "step 0 (it would burn CPU beside B)", "train-C fails naming the process; none alive after the launch")
    home, launch, rc = _launch(work, "survivor", [edit])
    run_id = launch.run_id()
    status = closes(home, run_id)
    note = " ".join(str(r["note"]) for r in records(home) if r["run_id"] == run_id and r["package"] == "train-C")
    alive = [p.pid for p in psutil.process_iter(["cmdline"]) if tag in (p.info["cmdline"] or [])]
    for pid in alive:
        psutil.Process(pid).kill()
    c = Check()
    c.saw(f"launch exit {rc}; train-C {status.get('train-C')}; {lines(launch.stderr)[-1] if launch.stderr else ''}")
    c.that(rc == 1 and status.get("train-C") == "failed", "train-C failed, exit 1")
    c.that("running after its main process ended" in note and "python" in note, "the survivor named")
    c.that(status.get("train-B") in (None, "not-run"), "baseline B did not run")
    c.that(not alive, "no process of it alive after the launch")
    row.ok, row.observed = not c.failed, work.scrub(c.observed())
    return row


def ships_workers(work: Work) -> Row:
    """Issue 49, hole 1: the candidate's tree ships orch's own package name, `workers/`, outside the include globs
    (so not in its commitment): orch's workers would have imported it. Refused before the lock, the path named."""
    base = work.fresh("workers")
    proj, protocol = candidate_project(base, [])
    planted = proj / "examples" / "r3_mini" / "workers"
    planted.mkdir()
    (planted / "__init__.py").write_text("import sys\nsys.stderr.write('PLANTED WORKERS RAN\\n')\n")
    row = Row("isolation", "candidate ships a workers/ package beside its sources (outside include: not in its "
              "commitment), which orch's workers imported before", "refused before the lock (exit 3), path named")
    launch = Launch(proj, protocol, base / "home", "workers")
    rc = launch.wait(timeout=600)
    c = Check()
    c.saw(f"launch exit {rc}; {lines(launch.stderr)[-1] if launch.stderr else ''}")
    c.that(rc == 3, "exit 3 (refused)")
    c.that("candidate sources hold workers/" in launch.stderr, "the planted folder named")
    c.that("PLANTED WORKERS RAN" not in launch.stderr, "the planted package never ran")
    c.that(not (base / "home" / "runs").exists() or not any((base / "home" / "runs").iterdir()), "no run opened")
    row.ok, row.observed = not c.failed, work.scrub(c.observed())
    return row


def planted_links(work: Work) -> Row:
    """Issue 49, hole 2: train-C plants links where orch's post-package step used to write (a folder of its run
    folder pointing at site-packages, beside a checkpoint-like file under it) and replaces its own step file with a
    FIFO. Before the fix orch moved the file into site-packages, and a FIFO at a step file hung orch."""
    victim = Path(site.getsitepackages()[0])
    tag = f"orch-attack-{secrets.token_hex(6)}"
    body = ("_pkg = _run / 'packages' / 'train-C'\n"
            f"_v = _pl.Path({str(victim)!r})\n"
            "(_pkg / 'linked').symlink_to(_v)\n"
            f"(_pkg / 'sub').mkdir(exist_ok=True)\n"
            f"open(_pkg / 'sub' / {tag + '.pth'!r}, 'wb').write(b'PK\\x03\\x04')\n"
            "_seen.append('planted')\n"
            "_steps = _pkg / 'steps.rank0.jsonl'\n"
            "_steps.unlink(missing_ok=True)\n"
            "os.mkfifo(_steps)\n"
            "_seen.append('fifo')\n")
    row = Row("isolation", "candidate plants a link to site-packages in its run folder and a FIFO at its step file "
              "(orch moved files through such links, and waited on the FIFO)",
              "train-C fails naming the link and the FIFO; nothing lands outside; orch never hangs; B does not run")
    home, launch, rc = _launch(work, "links", [_in_package("links", body)])
    run_id = launch.run_id()
    status = closes(home, run_id)
    note = " ".join(str(r["note"]) for r in records(home)
                    if r["run_id"] == run_id and r["package"] == "train-C" and r["note"] is not None)
    landed = sorted(p.name for p in victim.iterdir() if tag in p.name)
    for name in landed:
        (victim / name).unlink()
    c = Check()
    c.saw(f"launch exit {rc}; train-C {status.get('train-C')}: {note[:300]}")
    c.that(rc is not None, "orch ended (no hang on the FIFO)")
    # before 103fc87 the FIFO blocked the candidate's own rank (its probe hashed its step file by path) until the
    # timeout; the probe now refuses it at once, but either way train-C must not pass
    c.that(status.get("train-C") in ("failed", "timeout"), "train-C did not pass")
    c.that("linked (link)" in note, "the link named")
    c.that(not landed, "nothing landed in site-packages")
    c.that(status.get("train-B") in (None, "not-run"), "baseline B did not run")
    row.ok, row.observed = not c.failed, work.scrub(c.observed())
    return row


def isolation_attacks(work: Work) -> list[Row]:
    return [*leave_behind(work), survivor(work), ships_workers(work), planted_links(work)]
