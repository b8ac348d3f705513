"""Ledger and evidence tampers on the sealed reference run, with a witnessed head kept outside the home
($ORCH_WITNESS): real byte flips, cuts, splices, rewrites with orch's own code. Each tamper starts from a byte copy
of the home and witness and is undone after; detected = `orch ledger verify` or `orch audit RUN` refuses it.

The 15th, a well-formed record appended after the last witnessed head, is expected to pass: unsigned records
cannot tell it from an honest append (the README says so).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
from common import (
    REPO,
    Check,
    Reference,
    Row,
    Work,
    checks_only,
    cli,
    lines,
    orch_argv,
    records,
    restore,
    snapshot,
)

ASSIGNED = ("seq", "prev_hash", "prev_message_sha256", "record_hash", "canonical")


def offsets(path: Path) -> list[int]:
    """Byte offset of every Arrow message of the stream (0: the schema; i + 1: record i), read with pyarrow."""
    stream = pa.BufferReader(pa.py_buffer(path.read_bytes()))
    reader = ipc.MessageReader.open_stream(stream)
    out = []
    while True:
        pos = stream.tell()
        try:
            reader.read_next_message()
        except StopIteration:
            break
        out.append(pos)
    return out


def _ledger(ref: Reference) -> Path:
    return ref.home / "ledger" / "ledger.arrows"


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _cut(path: Path, size: int) -> None:
    with path.open("r+b") as f:
        f.truncate(size)


def _ledger_api() -> Any:
    from ledger.cost.store import Ledger  # orch's own code, as a forger would use it

    return Ledger


def _reappend(path: Path, recs: list[dict[str, Any]]) -> None:
    """Rewrite the ledger from these records with orch's own append: every hash chains."""
    for name in ("ledger.arrows", "ledger.arrows.idx", "ledger.arrows.tail"):
        (path.parent / name).unlink(missing_ok=True)
    ledger = _ledger_api()(path)
    for rec in recs:
        ledger.append(**{k: v for k, v in rec.items() if k not in ASSIGNED})


def _honest_append(path: Path) -> str:
    try:
        _ledger_api()(path).append(run_id="later-run", package="checks", kind="checks", status="not-run",
                                   protocol_id="0" * 64)
    except Exception as err:  # what orch's append says is part of the observation
        return f"append refused: {getattr(err, 'message', err)}"
    return "append accepted"


def _edit_json(path: Path, change: Callable[[Any], None]) -> None:
    path.chmod(0o644)
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=1))


def _tampers(ref: Reference) -> list[tuple[str, Callable[[], str]]]:
    led = _ledger(ref)
    run = ref.run_dir

    def t_flip_record() -> str:
        off = offsets(led)
        k = len(off) // 2
        _flip(led, (off[k] + off[k + 1]) // 2)
        # the reviewer's launch appended 9 records onto such a ledger: it must refuse before any lock or record
        before = led.read_bytes()
        fail = checks_only(ref.proj, "fail.yaml", ["python", "-c", "raise SystemExit(3)"])
        done = cli(orch_argv("launch", str(fail), "--home", str(ref.home), "--lock-dir", str(ref.home.parent /
                                                                                                 "locks-t")),
                   cwd=ref.proj, timeout=300)
        out = lines(done.stdout + done.stderr)
        same = led.read_bytes() == before
        return (f"flipped a byte of record {k - 1}; then orch launch: exit {done.returncode}, {len(out)} line(s), "
                f"ledger {'unchanged' if same else 'APPENDED TO'}: {out[-1][:120] if out else ''}"
                + ("" if done.returncode == 1 and len(out) == 1 and same else " [launch NOT refused]"))

    def t_flip_schema() -> str:
        _flip(led, offsets(led)[1] // 2)
        return "flipped a byte of the schema message"

    def t_flip_last_pad() -> str:
        _flip(led, led.stat().st_size - 1)
        return "flipped the last byte of the file (the last record's padding)"

    def t_cut_boundary() -> str:
        _cut(led, offsets(led)[-1])
        return "cut the last record at its boundary"

    def t_cut_append() -> str:
        _cut(led, offsets(led)[-2])
        return f"cut the last two records at a boundary; {_honest_append(led)}"

    def t_torn() -> str:
        off = offsets(led)
        _cut(led, (off[-1] + led.stat().st_size) // 2)
        return "cut in the middle of the last record (torn tail)"

    def t_splice() -> str:
        off = offsets(led)
        data = led.read_bytes()
        k = len(off) // 2
        led.write_bytes(data[: off[k]] + data[off[k + 1]:])
        (led.parent / "ledger.arrows.idx").unlink(missing_ok=True)
        return f"spliced record {k - 1} out"

    def t_forge() -> str:
        """The reviewer's forgery: C's timed steps halved, every digest recomputed, the ledger re-appended with
        orch's own code, audit.json deleted and the home's witness rewritten to the forged head."""
        recs = records(ref.home)
        pkg = run / "packages" / "train-C"
        result = pkg / "result.json"
        doc = json.loads(result.read_text())
        for rank in doc["ranks"]:
            steps = pkg / rank["steps_file"]
            steps.chmod(0o644)
            rows = [json.loads(ln) for ln in steps.read_text().splitlines()]
            for r in rows:
                if r["step"] >= 10:
                    r["duration_s"] = r["duration_s"] / 2
            steps.write_text("".join(json.dumps(r) + "\n" for r in rows))
            rank["steps_sha256"] = hashlib.sha256(steps.read_bytes()).hexdigest()
        result.chmod(0o644)
        result.write_text(json.dumps(doc, indent=1))
        digest = hashlib.sha256(result.read_bytes()).hexdigest()
        run_json = run / "run.json"
        _edit_json(run_json, lambda d: [p.update(result_sha256=digest) for p in d["packages"]
                                        if p["name"] == "train-C"])
        recs = [r for r in recs if not (r["run_id"] == ref.run_id and r["kind"] == "audit")]
        for rec in recs:
            if rec["run_id"] == ref.run_id and rec["package"] == "train-C" and rec["status"] == "ok":
                rec["result_digest"] = digest
        _reappend(led, recs)
        (run / "audit.json").unlink()
        head = _ledger_api()(led).head()
        witness = ref.home / "witness" / "heads.jsonl"
        kept = [json.loads(ln) for ln in witness.read_text().splitlines()][:1]
        for w in kept:
            w.update(size=head.size, root=head.root)
        witness.write_text("".join(json.dumps(w, sort_keys=True) + "\n" for w in kept))
        return ("C's timed steps halved, digests, run.json and ledger re-appended with orch's code, audit.json "
                "deleted, home witness rewritten")

    def t_replace() -> str:
        recs = records(ref.home)
        shutil.rmtree(led.parent / ".." / "witness", ignore_errors=True)
        for p in led.parent.iterdir():
            if p.name != "ledger.arrows.lock":
                p.unlink()
        _reappend(led, recs)  # a new salt: another ledger id
        return "ledger, its salt and the home's witness replaced by a re-appended copy"

    def t_result() -> str:
        _edit_json(run / "packages" / "train-C" / "result.json",
                   lambda d: d["observed_recipe"].update(trainable_params=d["observed_recipe"]["trainable_params"] + 1))
        return "train-C result.json: trainable_params + 1"

    def t_steps() -> str:
        path = run / "packages" / "train-C" / "steps.rank0.jsonl"
        path.chmod(0o644)
        rows = [json.loads(ln) for ln in path.read_text().splitlines()]
        for r in rows:
            if r["step"] >= 10:
                r["duration_s"] = r["duration_s"] / 2
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return "train-C steps.rank0.jsonl: timed steps halved"

    def t_score() -> str:
        _edit_json(run / "score.sealed.json", lambda d: d.update(forged=True))
        return "score.sealed.json edited"

    def t_audit() -> str:
        recorded = json.loads((run / "audit.json").read_text())["verdict"]
        forged = "no difference shown" if recorded == "accepted" else "accepted"  # always another verdict
        _edit_json(run / "audit.json", lambda d: d.update(verdict=forged))
        return f"audit.json: verdict {recorded!r} set to {forged!r}"

    def t_sealed() -> str:
        path = run / "sealed" / "candidate" / "train" / "online_rl.py"
        path.chmod(0o644)
        with path.open("a") as f:
            f.write("\n# edited after the run\n")
        return "sealed/candidate/train/online_rl.py edited after the run"

    def t_append() -> str:
        return f"a well-formed record appended with orch's code; {_honest_append(led)}"

    return [
        ("flip a byte inside a record", t_flip_record),
        ("flip a byte of the schema message", t_flip_schema),
        ("flip the last byte of the file (last record's padding)", t_flip_last_pad),
        ("truncate at a record boundary", t_cut_boundary),
        ("truncate at a record boundary, then an honest append", t_cut_append),
        ("torn tail (cut mid-record)", t_torn),
        ("splice a record out of the middle", t_splice),
        ("full forgery: result rewritten, ledger re-appended, audit.json deleted", t_forge),
        ("ledger replaced with its salt and the home's witness", t_replace),
        ("result.json of train-C edited", t_result),
        ("step times of train-C edited (C faster)", t_steps),
        ("sealed DEV score edited", t_score),
        ("audit.json edited (verdict)", t_audit),
        ("sealed copy edited after the run", t_sealed),
        ("well-formed record appended after the last witnessed head", t_append),
    ]


def tampers(work: Work, ref: Reference) -> list[Row]:
    backup = work.fresh("backup")
    snapshot(ref.home, backup / "home")
    shutil.copy(ref.witness, backup / "witness.jsonl")
    witness_env = {"ORCH_WITNESS": str(ref.witness)}
    rows = []
    readme = (REPO / "README.md").read_text()
    try:
        for i, (name, tamper) in enumerate(_tampers(ref)):
            last = i == 14
            expected = ("passes (unsigned records; the README says so)" if last
                        else "detected: ledger verify or audit refuses")
            row = Row("tamper", name, expected)
            done = tamper()
            verify = cli(orch_argv("ledger", "verify", "--home", str(ref.home)), cwd=ref.proj, timeout=300)
            audit = cli(orch_argv("audit", ref.run_id, "--home", str(ref.home)), cwd=ref.proj,
                        extra_env=witness_env, timeout=300)
            v_line = (lines(verify.stdout + verify.stderr) or [""])[0]
            a_err = [ln for ln in lines(audit.stderr) if ln.startswith("orch:") or "refus" in ln or "missing" in ln]
            detected = verify.returncode != 0 or audit.returncode != ref.audit_exit
            c = Check()
            c.saw(done)
            c.saw(f"verify exit {verify.returncode}: {v_line[:160]}")
            c.saw(f"audit exit {audit.returncode}: {(a_err or [''])[0][:200]}")
            if last:
                c.that(not detected, "passes as an honest append")
                c.that("indistinguishable from an honest append" in " ".join(readme.split()),
                       "the README says an unsigned append after the last witnessed head passes")
            else:
                c.that(detected, "detected")
                c.that("NOT refused" not in done, "a launch onto the damaged ledger refused, nothing appended")
            row.ok, row.observed = not c.failed, work.scrub(c.observed())
            rows.append(row)
            restore(ref.home, backup / "home")
            shutil.copy(backup / "witness.jsonl", ref.witness)
    finally:
        restore(ref.home, backup / "home")
        shutil.copy(backup / "witness.jsonl", ref.witness)
    return rows
