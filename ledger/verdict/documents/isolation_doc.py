"""The audit's isolation block: how each package was isolated and what its network was (run.json), and in words what
that left open (docs/THREAT_MODEL.md), so that a verdict from scan mode, Slurm or the host's network says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol.run_record import RunRecord

NAMESPACE_WORDS = ("every package ran in its own namespaces: the file system read-only but its own folders, its own "
                   "PID namespace, its own network (loopback and its declared endpoints only, no socket outside it)")


def isolation_doc(run: RunRecord) -> dict[str, Any] | None:
    """None for a run recorded before run.json kept each package's isolation."""
    packages = {e.name: {"isolation": e.isolation, "network": e.network} for e in run.packages if e.isolation}
    if not packages:
        return None
    scan = sorted(n for n, p in packages.items() if not str(p["isolation"]).startswith("namespace"))
    host = sorted(n for n, p in packages.items() if p["network"] is not None and str(p["network"]).startswith("host"))
    words = []
    if scan:
        words.append(f"scan mode ({', '.join(scan)}): nothing was read-only; orch detected writes in the shared "
                     "folders, the interpreter's startup surface, the sealed copies and caches, and ended what was "
                     "left, but it did not confine: a same-user package can write where no scan looks")
    if host:
        words.append(f"the host's network ({', '.join(host)}): local services and sockets outside the package were "
                     "reachable (a process started through one can outlive the package)")
    if run.slurm is not None:
        words.append("Slurm: the ranks ran under slurmstepd on the nodes, outside orch's namespaces; the step's cgroup "
                     "ended them and the seals were re-hashed on every node")
    return {"packages": packages, "words": words or [NAMESPACE_WORDS]}


def isolation_lines(doc: Mapping[str, Any]) -> list[str]:
    iso = doc.get("isolation")
    return [] if not iso else [f"isolation: {w}" for w in iso["words"]]
