"""The trainer's import path, added only after orch's own modules are in (orch's interpreters start with PYTHONSAFEPATH
and orch's root alone: orchestrator/isolation/packages.py); the commands orch runs for the trainer get it back.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping

from protocol.trainer_path import SAFE_PATH_VAR, TRAINER_PATH_VAR

# third-party modules orch's in-rank code imports lazily: imported before the trainer's folders can shadow them
PRELOAD = ("psutil",)


def trainer_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a command orch runs for the trainer (a check, the scorer, the trainer's own children):
    PYTHONPATH as the protocol declared it after orch's root, no PYTHONSAFEPATH, as before orch's own start."""
    out = dict(os.environ if env is None else env)
    path = out.pop(TRAINER_PATH_VAR, None)
    if path is not None:
        out.pop(SAFE_PATH_VAR, None)
        out["PYTHONPATH"] = path
    return out


def enter_trainer_path(first: str) -> None:
    """In a rank, once the probe's modules are imported: sys.path as `python SCRIPT` / `python -m MODULE` would have
    made it for the trainer (`first`: the script's folder or the cwd, then the protocol's PYTHONPATH, then the rest),
    and the protocol's sitecustomize run as the interpreter would have run it at start-up. Modules already imported
    (workers, protocol, pydantic, psutil) stay orch's: a package of the same name in the trainer's folders is never
    seen by orch's code, which imports through them."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    path = os.environ.get(TRAINER_PATH_VAR)
    if path is None:  # not started by orch (a trainer run by hand under the probe): the interpreter's own path
        if sys.flags.safe_path:
            sys.path.insert(0, first)
        else:
            sys.path[0] = first  # where the interpreter put the probe's own cwd
        return
    entries = [os.path.abspath(p) for p in path.split(os.pathsep) if p]
    rest = [p for p in sys.path if p not in entries and p != first]
    sys.path[:] = [first, *dict.fromkeys(entries), *rest]
    os.environ.update(trainer_env())
    os.environ.pop(TRAINER_PATH_VAR, None)
    os.environ.pop(SAFE_PATH_VAR, None)
    _run_sitecustomize(entries)


def _run_sitecustomize(entries: list[str]) -> None:
    """A sitecustomize in the protocol's PYTHONPATH is the one the interpreter would have imported at start-up (those
    folders come before site-packages): import it now, under its name, once."""
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", entries)
    if spec is None or spec.loader is None:
        return
    if getattr(sys.modules.get("sitecustomize"), "__file__", None) == spec.origin:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)
