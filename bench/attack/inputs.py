"""Bad inputs: each must get ONE line (what is wrong, what to do) and the documented exit code (DESIGN.md
section 4: 2 usage, 3 protocol / manifest / hygiene refused, 1 failed), and a refused launch leaves no run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common import Check, Reference, Row, Work, cli, gpu_run_argv, lines, orch_argv


@dataclass
class Input:
    name: str
    exit_code: int
    argv: Callable[[Path], list[str]]  # given the attack's folder (files written there first)
    says: str = ""  # a word the one line must hold (the line or field it names)
    setup: Callable[[Path], None] | None = None
    launch_home: bool = False  # a launch: its home must hold no run afterwards


def _protocol_text(ref: Reference) -> str:
    return (ref.proj / "protocol" / "small.yaml").read_text()


def _write(name: str, content: Callable[[], str | bytes]) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        data = content()
        (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return setup


def _line_of(text: str, needle: str, nth: int = 1) -> int:
    seen = 0
    for i, ln in enumerate(text.splitlines(), 1):
        if ln.strip().startswith(needle):
            seen += 1
            if seen == nth:
                return i
    raise RuntimeError(f"no line {needle!r}")


def _dup_lr(text: str) -> str:
    out = []
    for ln in text.splitlines():
        out.append(ln)
        if ln.strip().startswith("lr:") and ln.startswith("  "):
            out.append(ln)
    return "\n".join(out) + "\n"


def _bomb() -> str:
    rows = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    rows += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(rows) + "\n"


def inputs(work: Work, ref: Reference) -> list[Row]:
    text = _protocol_text(ref)
    dup_lr = _dup_lr(text)
    launch = lambda name: (lambda d: orch_argv("launch", str(d / name), "--home", str(d / "home"),  # noqa: E731
                                               "--lock-dir", str(d / "locks")))
    home = ["--home", str(ref.home)]
    cases = [
        Input("launch: protocol file missing", 3, launch("missing.yaml"), "missing.yaml", launch_home=True),
        Input("launch: binary protocol (not UTF-8)", 3, launch("bin.yaml"), "UTF-8",
              _write("bin.yaml", lambda: b"\xff\xfe\x00\x01binary"), True),
        Input("launch: a 50 MB protocol (the reviewer's was parsed for minutes)", 3, launch("big.yaml"), "1 MiB",
              _write("big.yaml", lambda: text + "steps: [" + "1, " * 16_000_000 + "1]\n"), True),
        Input("launch: a key given twice (YAML would keep the last)", 3, launch("dup.yaml"),
              f":{len(text.splitlines()) + 1}", _write("dup.yaml", lambda: text + "name: again\n"), True),
        Input("launch: recipe lr given twice, named at the repeat", 3, launch("duplr.yaml"),
              f":{_line_of(dup_lr, 'lr:', 2)}", _write("duplr.yaml", lambda: dup_lr), True),
        Input("launch: negative timeout", 3, launch("neg.yaml"), "timeouts",
              _write("neg.yaml", lambda: text.replace("train: 600", "train: -5")), True),
        Input("launch: YAML syntax error", 3, launch("syntax.yaml"), "syntax.yaml",
              _write("syntax.yaml", lambda: text + "recipe: [unclosed\n"), True),
        Input("launch: alias bomb (9^9 nodes)", 3, launch("bomb.yaml"), "bomb.yaml",
              _write("bomb.yaml", _bomb), True),
        Input("launch: empty protocol file", 3, launch("empty.yaml"), "empty.yaml", _write("empty.yaml", lambda: ""),
              True),
        Input("launch: protocol is a list, not a mapping", 3, launch("list.yaml"), "list.yaml",
              _write("list.yaml", lambda: "- a\n- b\n"), True),
        Input("launch: unknown field (extra=forbid)", 3, launch("extra.yaml"), "surprise",
              _write("extra.yaml", lambda: text + "surprise: 1\n"), True),
        Input("launch: negative --lock-timeout", 2,
              lambda d: [*launch("ok.yaml")(d), "--lock-timeout", "-1"], "lock-timeout",
              _write("ok.yaml", lambda: text), True),
        Input("audit: run id made of ../ segments", 2, lambda d: orch_argv("audit", "../../..", *home), "run id"),
        Input("audit: unknown run id", 2, lambda d: orch_argv("audit", "no-such-run", *home), "no-such-run"),
        Input("audit: two run ids", 2, lambda d: orch_argv("audit", ref.run_id, ref.run_id, *home), "one RUN_ID"),
        Input("publish --to outside docs/validation/", 2,
              lambda d: orch_argv("publish", ref.run_id, "--to", str(d / "x.json"), *home), "docs/validation"),
        Input("gpu-run with no command", 2, lambda d: gpu_run_argv(), "--"),
        Input("unknown command", 2, lambda d: orch_argv("no-such-command"), "no-such-command"),
        Input("ledger verify --against a malformed head", 2,
              lambda d: orch_argv("ledger", "verify", "--against", "garbage", *home), "garbage"),
        Input("verify: commitment file missing", 3, lambda d: orch_argv("verify", str(d / "none.json")), "none.json"),
        Input("verify: malformed commitment", 3, lambda d: orch_argv("verify", str(d / "bad.json")), "bad.json",
              _write("bad.json", lambda: "{not json")),
        Input("freeze: a glob that matches nothing", 3,
              lambda d: orch_argv("freeze", str(d), "--include", "nothing/**/*.py"), "nothing/**/*.py"),
    ]
    rows = []
    for case in cases:
        d = work.fresh("input")
        if case.setup is not None:
            case.setup(d)
        t0 = time.monotonic()
        done = cli(case.argv(d), cwd=ref.proj, timeout=300)
        took = time.monotonic() - t0
        out = lines(done.stdout + done.stderr)
        c = Check()
        c.saw(f"exit {done.returncode} in {took:.1f} s: {out[0] if len(out) == 1 else ' | '.join(out)[:300]}")
        c.that(done.returncode == case.exit_code, f"exit {case.exit_code}")
        c.that(len(out) == 1, f"one line (got {len(out)})")
        c.that("Traceback" not in done.stderr, "no traceback")
        c.that(case.says in done.stdout + done.stderr, f"names {case.says!r}")
        if case.launch_home:
            runs = d / "home" / "runs"
            c.that(not runs.exists() or not any(runs.iterdir()), "no run folder")
        rows.append(Row("input", case.name, f"one line, exit {case.exit_code}", work.scrub(c.observed()),
                        not c.failed))
    return rows
