"""`python -m orchestrator.cli.orch ARGS` run inside the test process (issue 32: the unit suite's cost).

The same entry point as the console script (orchestrator.cli.orch.main, so orchestrator.cli.entry.run_app's one-line
usage errors and exit codes), with the given arguments, working directory and environment, its stdout and stderr
captured as text. What it saves is a fresh interpreter and its imports per call (about 2-3 s for a command that reaches
scipy and matplotlib). Tests about the process boundary itself (signals, a console script, what a fresh interpreter
imports, a process killed or interrupted) keep a real subprocess.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path


@contextlib.contextmanager
def _process_state(args: list[str], cwd: Path | None, env: Mapping[str, str] | None) -> Iterator[None]:
    saved_argv, saved_cwd, saved_env = sys.argv, os.getcwd(), dict(os.environ)
    sys.argv = args
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(saved_env)


def orch(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs `orch ARGS` as its console script would, in this process; the result as subprocess.run would give it.

    env, when given, replaces the whole environment for the call (as subprocess.run's env does). An exception that
    escapes main() is printed to stderr as a traceback with exit status 1, as the interpreter would.
    """
    from orchestrator.cli.orch import main

    out, err = io.StringIO(), io.StringIO()
    code: int
    with _process_state(["orch", *args], cwd, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as exit_:
            if exit_.code is None:
                code = 0
            elif isinstance(exit_.code, int):
                code = exit_.code
            else:  # sys.exit("message"): the message on stderr, status 1
                print(exit_.code, file=sys.stderr)
                code = 1
        except Exception:
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(["orch", *args], code, out.getvalue(), err.getvalue())
