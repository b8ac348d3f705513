"""The interpreter's startup surface (scan mode): what a later Python process reads as it starts and imports.

The listing of the interpreter's standard library, site-packages and user site and of each PYTHONPATH folder, with
the bytes of every `.pth` file and of sitecustomize / usercustomize: a new hook, module or package that shadows
another, or a changed hook, changes it. An in-place edit of a module already installed is not seen (THREAT_MODEL).
"""

from __future__ import annotations

import hashlib
import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Mapping, Sequence

Snapshot = dict[str, str]
_HOOKS = ("sitecustomize", "usercustomize")


def interpreter_dirs() -> list[str]:
    """The interpreter's own import folders: standard library, its extension modules, site-packages, user site."""
    paths = sysconfig.get_paths()
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                                     "installed_base": sys.base_prefix, "installed_platbase": sys.base_exec_prefix})
    dirs = [base["stdlib"], base["platstdlib"], os.path.join(base["platstdlib"], "lib-dynload"),
            paths["purelib"], paths["platlib"], *site.getsitepackages(), site.getusersitepackages()]
    return _existing(dirs)


def surface_dirs(env: Mapping[str, str], skip: Sequence[str] = ()) -> list[str]:
    """The interpreter's folders and the absolute PYTHONPATH entries of a package's environment."""
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    return [d for d in _existing([*interpreter_dirs(), *extra]) if not any(_under(d, s) for s in skip)]


def _existing(dirs: Iterable[str]) -> list[str]:
    out: list[str] = []
    for d in dirs:
        real = os.path.realpath(d)
        if os.path.isdir(real) and real not in out:
            out.append(real)
    return out


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _digest(path: str) -> str:
    """SHA256 of a hook's bytes (a package's __init__.py for a hook that is a folder); '' where unreadable."""
    target = os.path.join(path, "__init__.py") if os.path.isdir(path) else path
    try:
        with open(target, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""


def snapshot(dirs: Sequence[str]) -> Snapshot:
    """Every entry directly in `dirs`, by kind (and by content for .pth files and the customize hooks)."""
    out: Snapshot = {}
    for d in dirs:
        try:
            entries = list(os.scandir(d))
        except OSError:
            out[d] = "unreadable"
            continue
        for e in entries:
            if e.name == "__pycache__":
                continue
            kind = "link" if e.is_symlink() else "dir" if e.is_dir() else "file"
            hook = e.name.endswith(".pth") or e.name.split(".", 1)[0] in _HOOKS
            out[e.path] = f"{kind} {_digest(e.path)}" if hook else kind
    return out


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """'PATH (added|removed|changed)', sorted."""
    out = []
    for path in sorted(set(before) | set(after)):
        if path not in before:
            out.append(f"{path} (added)")
        elif path not in after:
            out.append(f"{path} (removed)")
        elif before[path] != after[path]:
            out.append(f"{path} (changed)")
    return out
