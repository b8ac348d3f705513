"""The integrity of a run's evidence: seals, commitments, protocol id, result digests and step files, against
run.json and the ledger. Each problem is one line; an empty list means the evidence verifies.
"""

from __future__ import annotations

from ledger.cost.store import Ledger
from ledger.verdict.decide.evidence import RunEvidence
from ledger.verdict.decide.host_watch import host_watch_problems
from manifests.core import diff_manifests, hash_tree, load_manifest
from protocol.errors import OrchError
from protocol.hashing import sha256_file
from protocol.plan import ARMS


def verify_integrity(ev: RunEvidence, ledger: Ledger) -> list[str]:
    """Seals, commitments, protocol id, result digests and steps files against run.json and the ledger."""
    problems: list[str] = []
    report = ledger.verify()
    if not report.ok:
        problems.append(f"{report.message}; run `orch ledger verify` for details")
    if ev.protocol_sha256 != ev.run.protocol_id:
        problems.append("protocol.json: its sha256 is not run.json's protocol_id (the protocol copy was altered)")
    for arm in ARMS:
        info = ev.run.arms.get(arm)
        if info is None:
            problems.append(f"run.json: no arms.{arm}")
            continue
        sealed = ev.run_dir / "sealed" / arm
        try:
            # the seal covers the whole copy; the commitment covers the protocol's included sources
            manifest = load_manifest(ev.run_dir / "sealed" / f"{arm}.manifest.json")
            actual = hash_tree(sealed, manifest.include)
            sources = hash_tree(sealed, list(ev.protocol.sources.include))
        except OrchError as err:
            problems.append(f"seal of {arm}: {err.message}")
            continue
        if actual.root != manifest.root:
            diff = diff_manifests(manifest, actual)
            problems.append(f"seal of {arm}: sealed/{arm}/ no longer matches its manifest: {diff.summary()}")
        if info.sealed_root != manifest.root:
            problems.append(f"seal of {arm}: sealed/{arm}.manifest.json is not the seal recorded in run.json")
        if info.sources_root != sources.root:
            problems.append(f"seal of {arm}: the sealed sources do not hash to run.json's sources_root")
        under_evaluation = getattr(ev.protocol.arms, arm).under_evaluation
        if info.commitment_root != sources.root and not under_evaluation:
            problems.append(
                f"seal of {arm}: sealed sources {sources.root[:16]} are not the commitment "
                f"{info.commitment_root[:16]} and the arm is not declared under evaluation"
            )
    for name in ev.names:
        close = ev.closes[name]
        actual_sha = ev.result_sha256.get(name)
        if name == "score":
            sealed_file = ev.run_dir / "score.sealed.json"
            # hashing the sealed bytes is not reading the metric: blinding holds
            sealed_sha = sha256_file(sealed_file) if sealed_file.is_file() else None
            if sealed_sha is None:
                problems.append("score.sealed.json: missing")
            elif sealed_sha != close.result_digest or ev.score is None or ev.score.sealed_sha256 != close.result_digest:
                problems.append("score.sealed.json: its sha256 is not the ledger's result digest of score")
            allowed = {actual_sha, close.result_digest}
        else:
            if actual_sha != close.result_digest:
                problems.append(f"packages/{name}/result.json: sha256 is not the ledger's result digest")
            allowed = {actual_sha}
        entry = ev.run.package(name)
        declared_sha = None if entry is None else entry.result_sha256
        if declared_sha is not None and declared_sha not in allowed:
            problems.append(f"run.json: result_sha256 of {name} is not the digest of its result")
    step_files = [(f"train-{label}", train) for label, train in ev.trains.items()]
    if ev.watch is not None:  # an A/A launch of `orch calibrate` has no watched replay
        step_files.append(("watch-C", ev.watch))
    for name, train in step_files:
        for rank in train.ranks:
            path = ev.run_dir / "packages" / name / rank.steps_file
            if sha256_file(path) != rank.steps_sha256:
                problems.append(f"packages/{name}/{rank.steps_file}: sha256 is not the one {name} reported")
    problems += host_watch_problems(ev, list(ev.trains))  # orch's samples of the host during each train launch
    return problems
