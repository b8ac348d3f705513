"""The audit on synthetic but structurally real runs: run.json, sealed trees, results, step lines, the real ledger.

A factory fabricates step lines with chosen durations and digests, so each verdict is reached without a trainer.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cliutil import orch

from ledger.cost.store import Ledger
from ledger.verdict.decide.calibration import CALIBRATION_FILE, Calibration
from ledger.verdict.decide.evidence import IncompleteRunError
from ledger.verdict.documents.audit import audit_run
from ledger.verdict.documents.document import AUDIT_SCHEMA, canonical_bytes
from manifests.core import hash_tree
from protocol.errors import FailedError
from protocol.home import resolve_home
from protocol.plan import arm_of, package_names, replay_label
from protocol.recipe import RUN_COPY as RECIPE_RUN_COPY
from protocol.recipe import UPSTREAM_RECIPE
from protocol.results import (
    ChecksResult,
    ForbiddenOp,
    ObservedRecipe,
    ParamGroup,
    RankSummary,
    ReloadRank,
    ReloadResult,
    RngFingerprint,
    ScoreResult,
    StepRecord,
    TrainResult,
)
from protocol.schema import Protocol, canonical_json

TENSORS = ("w.param", "w.exp_avg", "w.exp_avg_sq", "w.step")
SCORE = {"dev_geneval": 0.7312}
TS = "2025-01-01T00:00:00Z"
HOST = hashlib.sha256(b"a salted host name").hexdigest()
# make_run's host fingerprint, as run.json records it
HOST_FINGERPRINT = {"gpu_model": "none", "gpu_count": 0, "driver": "none", "cuda": "none", "torch": "2.13.0",
                    "triton": "3.5.1", "python": "3.11.7", "host_hash": HOST}


def _h(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class RunSpec:
    """What to fabricate; defaults give a complete, exact, quiet run with a 2x faster candidate."""

    durations: dict[str, list[float]] = field(
        default_factory=lambda: {"A": [0.2] * 16, "C": [0.1] * 16, "B": [0.2] * 16}
    )
    ranks: int = 2
    diverge: tuple[str, int, int, str] | None = None  # (label, step, rank, tensor): digests differ from there on
    rng_extra_draw: tuple[str, int] | None = None  # (label, step): RNG state differs from that step on
    forbidden: tuple[str, int, str, str] | None = None  # (label, step, op, dtype)
    observed_lr: float = UPSTREAM_RECIPE["lr"]
    candidate_config: dict[str, str] = field(default_factory=dict)
    candidate_switches: dict[str, str] = field(default_factory=lambda: {"R3_FUSION": "1"})
    stop_at: str | None = None  # package that was killed; later ones are not run
    crash_open: bool = False  # with stop_at: the killed package has only its open record (kill -9)
    versions: dict[str, str] = field(default_factory=dict)  # extra entries of the checks' versions
    reload_differs: str | None = None  # label whose reload recomputes other final digests
    watch: bool = False  # steps 0-9 watched, each letting a compiled region through
    scalar_differs: tuple[str, int, int] | None = None  # (label, step, rank): the trainer's loss differs there
    silent: str | None = None  # labels whose trainer logs nothing ("B", or "ACB" for every arm)
    structure: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> observed recipe fields to override
    watch_forbidden: tuple[int, str, str] | None = None  # (step, op, dtype) seen by watch-C only
    watch_differs: int | None = None  # step from which watch-C's digests differ from train-C's
    primed: bool = False  # a run with the prime package (else recorded as before it existed)
    repeats: int = 1  # measurement.repeats: labels A1, C1, B1, B2, C2, A2, ... when >= 2
    calibrated: bool = False  # a usable A/A calibration of the protocol (SD 0.05, df 4) recorded before the run
    calibration_of: bool = False  # run.json names the protocol it calibrates: an A/A launch of `orch calibrate`
    ends_after_triplets: bool = False  # the plan stops after the last reload (no watch-C, no score)
    trailing_reload: bool | None = None  # with ends_after_triplets: the reload after the last launch (before issue 51)
    calibration_max_age_days: float | None = None  # measurement.calibration_max_age_days (None: the default, 7)
    # a sequential run of `repeats` triplets: "protocol" (repeats: auto) or "--until-decided" (a fixed protocol of one
    # triplet launched with the flag); run.json records the rule either way, and labels are numbered from A1
    sequential: str | None = None
    ledger_omits: tuple[str, ...] = ()  # packages run.json lists whose ledger records are missing
    run_json_omits: tuple[str, ...] = ()  # packages the ledger records that run.json leaves out
    watch_arm: str | None = None  # the arm watch-C's result names (default: the launch it replays)
    recipe_file: bytes | None = None  # an orch.protocol/2 run whose frozen recipe file (its run copy) is these bytes
    lock_held_s: float | None = None  # run.json's lock record: how long the lock was held (None: before it was)
    diagnosed_by: str | None = None  # the checks result leaves its diagnostics to this run (a later A/A launch)
    names_diagnosed_by: str | None = None  # with calibration_of: the run its record names for the diagnostics

    def times(self, label: str) -> list[float]:
        """Step durations of a launch: its own entry, else its arm letter's (A1 -> A)."""
        return self.durations.get(label) or self.durations[label[0]]


def _protocol(repeats: int | str = 1, max_age_days: float | None = None, recipe_file: bytes | None = None) -> Protocol:
    fields: dict[str, Any] = {"repeats": repeats} if repeats != 1 else {}
    if max_age_days is not None:
        fields["calibration_max_age_days"] = max_age_days
    measurement = {"measurement": fields} if fields else {}
    recipe: dict[str, Any] = {"schema": "orch.protocol/1", "recipe": dict(UPSTREAM_RECIPE)}
    if recipe_file is not None:
        recipe = {"schema": "orch.protocol/2", "recipe_file": {"path": "recipes/synthetic.yaml",
                                                               "sha256": _sha(recipe_file)}}
    return Protocol.model_validate(
        {
            **recipe,
            "name": "synthetic",
            "precision": "fp32",
            "sources": {"root": "src", "include": ["train/**/*.py"]},
            "arms": {
                "baseline": {"commitment": "manifests/base.json"},
                "candidate": {"commitment": "manifests/cand.json", "switches": {"R3_FUSION": "1"}},
            },
            "launcher": {"nproc": 2, "backend": "gloo", "device": "cpu", "script": "train/online_rl.py"},
            "scorer": {"command": ["python", "score.py"]},
            **measurement,
        }
    )


def _scalars(spec: RunSpec, label: str, rank: int, step: int) -> dict[str, str]:
    loss = 0.5 + step / 64 + rank / 8 + (1.0 if spec.scalar_differs == (label, step, rank) else 0.0)
    out = {"backward[0]": "float32:" + struct.pack("<f", loss).hex(), "grad_norm[0]": f"float32:{_h(step, rank)[:8]}"}
    if label not in (spec.silent or ""):
        out["log[0] Rank #: Total norm: ##1"] = f"text:{step / 3}"
    return out


def _steps(spec: RunSpec, label: str, rank: int, watch: bool = False) -> list[StepRecord]:
    lines = []
    for step in range(16):
        diverged = spec.diverge is not None and spec.diverge[0] == label and step >= spec.diverge[1]
        replay_bad = watch and spec.watch_differs is not None and step >= spec.watch_differs
        digests = None
        if step <= 13:
            digests = {}
            for t in TENSORS:
                bad = replay_bad or (diverged and (step > spec.diverge[1] or (rank, t) == spec.diverge[2:]))  # type: ignore[index]
                digests[t] = _h(step, rank, t, "bad" if bad else "")
        rng_bad = spec.rng_extra_draw is not None and spec.rng_extra_draw[0] == label and step >= spec.rng_extra_draw[1]
        forbidden = []
        if spec.forbidden and spec.forbidden[0] == label and spec.forbidden[1] == step:
            forbidden = [ForbiddenOp(op=spec.forbidden[2], dtype=spec.forbidden[3], step=step)]
        if watch and spec.watch_forbidden and spec.watch_forbidden[0] == step:
            forbidden = [ForbiddenOp(op=spec.watch_forbidden[1], dtype=spec.watch_forbidden[2], step=step)]
        lines.append(
            StepRecord(
                rank=rank,
                world_size=spec.ranks,
                step=step,
                duration_s=spec.times(label)[step] * (1.0 if rank == 0 else 0.97),
                probe_s=0.001,
                lr=[UPSTREAM_RECIPE["lr"] * min(1.0, step / 10)],
                rng=RngFingerprint(cpu=_h("rng", step, rank, "x" if rng_bad else "")),
                digests=digests,
                combined=_h(sorted(digests.items())) if digests else None,
                forbidden=forbidden,
                watched=spec.watch and step < 10,
                hops={"compiled:m.py:attn": 2, "higher_order.cond": 1} if spec.watch and step < 10 else {},
                uninspected=["compiled:m.py:attn: backend-generated kernels"] if spec.watch and step < 10 else [],
                scalars=_scalars(spec, label, rank, step),
            )
        )
    return lines


def _final(spec: RunSpec, label: str, rank: int) -> dict[str, str]:
    bad = spec.diverge is not None and spec.diverge[0] == label
    return {t: _h("final", rank, t, "bad" if bad else "") for t in TENSORS}


def _write_json(path: Path, obj: Any) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()
    path.write_bytes(data)
    return data


def _result(path: Path, model: Any) -> str:
    return _sha(_write_json(path, model.model_dump(mode="json", by_alias=True)))


def aa_log_speedups(sd: float, df: int) -> list[float]:
    """df + 1 values of mean 0 whose sample SD is exactly sd (+-a alternating, a 0 added when their number is odd)."""
    n = df + 1
    a = sd if n % 2 else sd * ((n - 1) / n) ** 0.5
    return [(a if i % 2 else -a) for i in range(n - n % 2)] + [0.0] * (n % 2)


def record_calibration(home: Path, run_id: str, protocol_id: str, host: dict[str, str] | None = None,
                       sd: float = 0.05, df: int = 4, **over: Any) -> Path:
    """An orch.calibration/2 file and its ledger record, as `orch calibrate` writes them (by default for make_run's
    protocol and host fingerprint)."""
    host = host or {k: str(v) for k, v in HOST_FINGERPRINT.items()}
    d = aa_log_speedups(sd, df)
    cal = Calibration(
        run_id=run_id, of_protocol_id=protocol_id, of_protocol_name="synthetic", aa_protocol_id="0" * 64, host=host,
        repeats=df + 1, headlines=[float(np.exp(x)) for x in d], log_speedups=d, sd=sd, df=df, window_sd=0.02,
        window_df=2 * (df + 1), mean_log_speedup=0.0, estimate=1.0, low=0.95, high=1.05, level=0.95,
        triplets_for_5pct=4, recorded_at=TS,
    ).model_copy(update=over)
    h = resolve_home(home)
    run_dir = h.run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = (cal.model_dump_json(by_alias=True, indent=1) + "\n").encode()
    (run_dir / CALIBRATION_FILE).write_bytes(data)
    h.ledger_dir.mkdir(parents=True, exist_ok=True)
    Ledger(h.ledger_path).append(run_id=run_id, package="calibration", kind="calibration", status="ok", gpus=0,
                                 host=host["host_hash"], protocol_id=protocol_id, result_digest=_sha(data),
                                 note="A/A calibration")
    return run_dir


def synthetic_protocol_id(repeats: int = 1, max_age_days: float | None = None) -> str:
    return _sha(canonical_json(_protocol(repeats, max_age_days)))


def make_run(home: Path, run_id: str = "run1", spec: RunSpec | None = None) -> Path:
    """Fabricate one run directory and its ledger records under `home`; returns the run directory."""
    spec = spec or RunSpec()
    h = resolve_home(home)
    h.ledger_dir.mkdir(parents=True, exist_ok=True)
    real_ledger = Ledger(h.ledger_path)
    run_dir = h.run_dir(run_id)
    auto = spec.sequential == "protocol"
    protocol = _protocol("auto" if auto else spec.repeats if spec.sequential is None else 1,
                         spec.calibration_max_age_days, spec.recipe_file)
    proto_bytes = canonical_json(protocol)
    common = {"host": HOST, "protocol_id": _sha(proto_bytes)}
    if spec.calibrated:
        record_calibration(home, f"cal-{run_id}", _sha(proto_bytes))
    (run_dir / "packages").mkdir(parents=True)
    (run_dir / "protocol.json").write_bytes(proto_bytes)
    if spec.recipe_file is not None:
        (run_dir / RECIPE_RUN_COPY).write_bytes(spec.recipe_file)
    arms: dict[str, Any] = {}
    for arm in ("baseline", "candidate"):
        tree = run_dir / "sealed" / arm
        (tree / "train").mkdir(parents=True)
        (tree / "train" / "online_rl.py").write_text(f"# trainer of the {arm}\n")
        (tree / "README.md").write_text("not a runtime source\n")
        manifest = hash_tree(tree, ["**"])  # the seal covers the whole copy, the commitment the sources
        sources = hash_tree(tree, ["train/**/*.py"])
        (run_dir / "sealed" / f"{arm}.manifest.json").write_text(manifest.to_json())
        arms[arm] = {
            "commitment": f"manifests/{arm}.json",
            "commitment_root": sources.root,
            "sources_root": sources.root,
            "sealed_root": manifest.root,
            "switches": spec.candidate_switches if arm == "candidate" else {},
            "config": spec.candidate_config if arm == "candidate" else {},
            "source": "tree",
            "under_evaluation": False,
            "note": None,
        }
    listed: list[dict[str, Any]] = []  # run.json's packages
    reached = True
    for name in package_names(spec.repeats, spec.sequential is not None, prime=spec.primed,
                              calibration=spec.ends_after_triplets, trailing_reload=spec.trailing_reload):
        kind = "replay" if name == "watch-C" else name.split("-")[0]
        label = name.split("-")[1] if "-" in name else None
        arm = arm_of(label) if label else None
        pkg_dir = run_dir / "packages" / name
        ledger = real_ledger if name not in spec.ledger_omits else _NoLedger()
        packages = listed if name not in spec.run_json_omits else []
        if not reached:
            ledger.append(
                **common, run_id=run_id, package=name, kind=kind, arm=arm, status="not-run", note="not reached"
            )
            continue  # orch records a package in run.json when it starts
        ledger.append(**common, run_id=run_id, package=name, kind=kind, arm=arm, status="open", started=TS)
        if name == spec.stop_at:
            reached = False
            pkg_dir.mkdir(parents=True)
            (pkg_dir / "steps.rank0.jsonl").write_text(_steps(spec, "B", 0)[0].model_dump_json(by_alias=True) + "\n")
            if not spec.crash_open:
                ledger.append(
                    **common, run_id=run_id, package=name, kind=kind, arm=arm, status="interrupted", exit_code=-15
                )
            packages.append({"name": name, "kind": kind, "arm_label": label, "arm": arm, "env": {},
                             "status": "interrupted", "exit_code": -15})
            continue
        digest = _write_package(run_dir, pkg_dir, name, spec)
        sha = _sha((pkg_dir / "result.json").read_bytes())
        gpu_s = 2 * spec.ranks * 1.0 if kind in ("train", "reload", "replay") else 1.0
        ledger.append(
            **common,
            run_id=run_id,
            package=name,
            kind=kind,
            arm=arm,
            status="ok",
            started=TS,
            ended=TS,
            wall_s=2.0,
            gpus=spec.ranks,
            gpu_seconds=gpu_s,
            result_digest=digest,
            exit_code=0,
        )
        packages.append(
            {
                "name": name,
                "kind": kind,
                "arm_label": label,
                "arm": arm,
                "env": {},
                "status": "ok",
                "exit_code": 0,
                "result_sha256": sha,
                "gpu_seconds": gpu_s,
                "wall_s": 2.0,
            }
        )
    _write_json(
        run_dir / "run.json",
        {
            "schema": "orch.run/2",
            "run_id": run_id,
            "protocol_id": _sha(proto_bytes),
            "protocol_name": protocol.name,
            "started": TS,
            "ended": TS,
            "status": "complete" if reached else "interrupted",
            "host": HOST_FINGERPRINT,
            "arms": arms,
            "lock": {"kind": "cpu-slot", "devices": [0, 1], "wait_s": 0.0,
                     **({"held_s": spec.lock_held_s} if spec.lock_held_s is not None else {})},
            "packages": listed,
            **({"sequential": {"asked": spec.sequential, "max_triplets": max(spec.repeats, 2),
                               "target_half_width": 0.05 if auto else None, "level": 0.95,
                               "triplets": spec.repeats, "stop": "maximum"}} if spec.sequential else {}),
            **({"calibration_of": {"protocol_id": _sha(proto_bytes), "protocol_name": protocol.name,
                                   **({"diagnosed_by": spec.names_diagnosed_by} if spec.names_diagnosed_by else {})}}
               if spec.calibration_of else {}),
        },
    )
    return run_dir


class _NoLedger:
    """Where make_run's records of a package in RunSpec.ledger_omits go: nowhere."""

    def append(self, **_: Any) -> None:
        return None


def _write_package(run_dir: Path, pkg_dir: Path, name: str, spec: RunSpec) -> str:
    """Write one package's outputs; returns the ledger's result digest."""
    ranks = range(spec.ranks)
    if name == "checks":
        versions = {"python": "3.11", "torch": "2.13.0", "triton": "n/a", "gpu_count": "0", **spec.versions}
        return _result(pkg_dir / "result.json", ChecksResult(versions=versions, diagnostics=[], precision_ok=True,
                                                             diagnosed_by=spec.diagnosed_by))
    if name == "prime":
        return _result(pkg_dir / "result.json", ChecksResult(versions={}, diagnostics=[], precision_ok=True))
    if name == "score":
        sealed = run_dir / "score.sealed.json"
        data = _write_json(sealed, SCORE)
        os.chmod(sealed, 0o400)
        _result(pkg_dir / "result.json", ScoreResult(sealed_file="score.sealed.json", sealed_sha256=_sha(data)))
        return _sha(data)
    kind, label = name.split("-")
    if kind == "watch":
        label = replay_label(spec.repeats, spec.sequential is not None)  # the first triplet's candidate launch
    if kind in ("train", "watch"):
        watch = kind == "watch"
        summaries = []
        for r in ranks:
            text = "".join(s.model_dump_json(by_alias=True) + "\n" for s in _steps(spec, label, r, watch))
            (pkg_dir / f"steps.rank{r}.jsonl").parent.mkdir(parents=True, exist_ok=True)
            (pkg_dir / f"steps.rank{r}.jsonl").write_text(text)
            final = _final(spec, label, r)
            summaries.append(
                RankSummary(
                    rank=r,
                    steps_file=f"steps.rank{r}.jsonl",
                    steps_sha256=_sha(text.encode()),
                    steps=16,
                    final_combined=_h(sorted(final.items())),
                    final_digests=final,
                    checkpoint_file=None if watch else f"ckpt/{label}/rank{r}.pt",
                    checkpoint_sha256=None if watch else _h("ckpt", label, r),
                )
            )
        group = ParamGroup(tensors=4, numel=100, hyper={"lr": "5e-06", "betas": "(0.9, 0.95)", "eps": "1e-08"})
        fields: dict[str, Any] = {
            "optimizer": "AdamW", "lr": spec.observed_lr, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0,
            "max_grad_norm": 1.0, "warmup_steps": 10, "frozen": ["vit.w"], "trainable_params": 100,
            "frozen_params": 10, "trainable": ["body"], "optimizer_params": 100, "param_groups": [group],
            **spec.structure.get(label, {}),
        }
        recipe = ObservedRecipe.model_validate(fields)
        return _result(
            pkg_dir / "result.json",
            TrainResult(
                arm=spec.watch_arm if watch and spec.watch_arm else label,
                world_size=spec.ranks,
                steps=16,
                digest_steps=list(range(14)),
                device="cpu",
                observed_recipe=recipe,
                ranks=summaries,
                stopped_cleanly=True,
                watched_steps=list(range(16)) if watch else list(range(10)),
            ),
        )
    reload_ranks = []
    for r in ranks:
        final = _final(spec, label, r)
        if spec.reload_differs == label and r == 1:
            final = {**final, "w.step": _h("another checkpoint")}
        reload_ranks.append(
            ReloadRank(
                rank=r, checkpoint_sha256=_h("ckpt", label, r), combined=_h(sorted(final.items())), digests=final
            )
        )
    return _result(pkg_dir / "result.json", ReloadResult(arm=label, world_size=spec.ranks, ranks=reload_ranks))


def _orch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return orch(*args, cwd=cwd)  # in this process (tests/cliutil.py): same entry point, no new interpreter


WRITTEN = ("audit.json", "audit.md", "step_times.png")


def test_complete_exact_run_is_accepted_written_recorded_then_unsealed(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, spec=RunSpec(calibrated=True))  # one triplet, bounded by the host's calibration
    before = len(Ledger(resolve_home(tmp_path).ledger_path).records())
    result = audit_run(tmp_path, "run1")
    doc = result.document
    assert doc["schema"] == AUDIT_SCHEMA and doc["verdict"] == "accepted" and doc["exact"] and not doc["noisy"]
    sp = doc["speedup"]
    assert [w["steps"] for w in sp["windows"]] == [[10, 11], [12, 13], [14, 15]]
    assert sp["headline"] == pytest.approx(2.0) and sp["max_drift"] == 0.0
    assert sp["windows"][0]["A"] == pytest.approx(0.4)  # max over ranks: rank 0 is the slower one
    assert doc["scope"] == (
        "deterministic steps 0-13 on 2 ranks; final parameter/Adam digests; "
        "not a measurement of full-training time or quality"
    )
    assert doc["exactness"]["tensors_compared"] == 14 * 2 * len(TENSORS)
    assert doc["attribution"]["label"] == "training-code-only"
    assert doc["attribution"]["differs"] == ["sources", "switches"]
    assert doc["cost"]["total_gpu_seconds"] == pytest.approx(7 * 4.0 + 2 * 1.0)  # watch-C is accounted too
    assert doc["cost"]["gpu_seconds"]["watch-C"] == pytest.approx(4.0)
    assert "lock_held_s" not in doc["cost"]  # a run recorded before the lock's hold was: its audit is unchanged
    pc = doc["probe_cost"]  # 1 ms of probe work per boundary; C's rank 1 has the shortest steps (97 ms)
    assert [(r["launch"], r["rank"]) for r in pc["rows"]] == [("A", 0), ("A", 1), ("B", 0), ("B", 1), ("C", 0),
                                                                ("C", 1)]  # fmt: skip
    assert pc["worst_median_with_digests"] == pytest.approx(0.001 / 0.097)
    assert "lower bound" in pc["words"]  # these lines carry no prev_boundary_s
    assert pc["goal_met"] is False and "without digests 1.03%" in pc["words"]  # 1 ms of a 97 ms step: over 1%
    # d = ln 2 exactly; the calibration's SD 0.05 (df 4) alone: ln 2 +- t(0.975, 4) x 0.05 / sqrt(1)
    iv = doc["interval"]
    half = 2.7764451051977987 * 0.05 * 1.2**0.5  # issue 52: the A/A mean's variance 0.05^2 / 5 carried
    assert (iv["variance_source"], iv["df"], iv["triplets"], iv["bounded"]) == ("calibration", 4, 1, True)
    assert iv["low"] == pytest.approx(2 * np.exp(-half)) and iv["high"] == pytest.approx(2 * np.exp(half))
    assert iv["paired_speedups"] == [pytest.approx(2.0)] and iv["headlines"] == [pytest.approx(2.0)]
    assert iv["calibration_used"] == {"run_id": "cal-run1", "sd": 0.05, "df": 4} and doc["calibration"]["usable"]
    assert doc["ledger_head"]["size"] == before
    data = (run_dir / "audit.json").read_bytes()
    assert json.loads(data) == doc
    assert (run_dir / "step_times.png").read_bytes().startswith(b"\x89PNG")
    assert "accepted" in (run_dir / "audit.md").read_text() and "0.7312" not in (run_dir / "audit.md").read_text()
    assert "A/A launch" not in (run_dir / "audit.md").read_text()
    records = Ledger(resolve_home(tmp_path).ledger_path).records()
    assert len(records) == before + 1
    assert records[-1].kind == "audit" and records[-1].status == "accepted" and records[-1].result_digest == _sha(data)
    assert result.score is not None and result.score.verified and result.score.metrics == SCORE
    assert "0.7312" not in data.decode()  # the DEV score never enters the audit document

    again = audit_run(tmp_path, "run1")  # re-audit: recomputed, equal, shown unchanged, not re-recorded
    assert not again.written and (run_dir / "audit.json").read_bytes() == data
    assert len(Ledger(resolve_home(tmp_path).ledger_path).records()) == before + 1


def test_run_killed_during_train_b_writes_nothing_and_shows_no_score(tmp_path: Path, repo: Path) -> None:
    run_dir = make_run(tmp_path, spec=RunSpec(stop_at="train-B"))
    before = len(Ledger(resolve_home(tmp_path).ledger_path).records())
    with pytest.raises(IncompleteRunError) as err:
        audit_run(tmp_path, "run1")
    assert err.value.problems == [
        "run status is 'interrupted', not 'complete'",
        "package train-B: interrupted (exit -15)",
        "package reload-B: not-run: not reached",
        "package watch-C: not-run: not reached",
        "package score: not-run: not reached",
    ]
    proc = _orch("audit", "run1", "--home", str(tmp_path), cwd=repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "missing or failed: package train-B: interrupted (exit -15)" in proc.stdout
    assert "0.7312" not in proc.stdout + proc.stderr and "dev_geneval" not in proc.stdout + proc.stderr
    assert not any((run_dir / name).exists() for name in WRITTEN)
    assert len(Ledger(resolve_home(tmp_path).ledger_path).records()) == before


@pytest.mark.parametrize("ends_after_triplets", [True, False], ids=["as-run-now", "recorded-with-watch-and-score"])
def test_an_aa_launch_is_audited_with_the_packages_its_plan_ran(tmp_path: Path, ends_after_triplets: bool) -> None:
    """`orch calibrate`'s A/A launches end after the triplet: no watched replay of a candidate that is the baseline,
    no scorer for a calibration that reads no quality. One recorded before that change is read with both."""
    spec = RunSpec(calibration_of=True, ends_after_triplets=ends_after_triplets, candidate_switches={})
    run_dir = make_run(tmp_path, spec=spec)
    result = audit_run(tmp_path, "run1")
    doc = result.document
    assert doc["exact"] is True and doc["calibration_of"]["protocol_name"] == "synthetic", doc["reasons"]
    names = [p["name"] for p in json.loads((run_dir / "run.json").read_text())["packages"]]
    assert names[-1] == ("train-B" if ends_after_triplets else "score")  # no reload after the last launch (issue 51)
    assert ("watch-C" in doc["cost"]["gpu_seconds"]) is not ends_after_triplets
    if ends_after_triplets:
        assert doc["exactness"]["replay_equal"] is None and result.score is None
        assert doc["cost"]["total_gpu_seconds"] == pytest.approx(5 * 4.0 + 1.0)  # checks, 3 trains, 2 reloads
    else:
        assert doc["exactness"]["replay_equal"] is True and result.score is not None and result.score.verified
    md = (run_dir / "audit.md").read_text()
    assert "A/A launch of `orch calibrate` for protocol synthetic" in md  # the report says what the run is
    assert ("its plan ends after the triplet (no watched replay, no DEV score)" in md) is ends_after_triplets
    assert not audit_run(tmp_path, "run1").written  # recomputed equal


def test_an_aa_launch_recorded_with_its_last_reload_is_read_with_it(tmp_path: Path) -> None:
    """An A/A launch recorded before issue 51 ran a reload after its last timed launch: it is audited with that
    reload, which is compared like the others (its final digests equal train-B's)."""
    spec = RunSpec(calibration_of=True, ends_after_triplets=True, trailing_reload=True, candidate_switches={})
    run_dir = make_run(tmp_path, spec=spec)
    names = [p["name"] for p in json.loads((run_dir / "run.json").read_text())["packages"]]
    assert names[-2:] == ["train-B", "reload-B"]
    doc = audit_run(tmp_path, "run1").document
    assert doc["exact"] is True, doc["reasons"]
    assert doc["cost"]["total_gpu_seconds"] == pytest.approx(6 * 4.0 + 1.0)  # checks, 3 trains, 3 reloads
    assert doc["exactness"]["reload_equal"] == {"A": True, "C": True, "B": True}
    differs = RunSpec(calibration_of=True, ends_after_triplets=True, trailing_reload=True, candidate_switches={},
                      reload_differs="B")
    make_run(tmp_path, "run2", differs)
    assert audit_run(tmp_path, "run2").document["exact"] is False  # that reload is judged, not skipped


def test_only_an_aa_launch_may_end_after_its_triplet(tmp_path: Path) -> None:
    """The owner's run without its watched replay and scorer is not complete: the short plan is an A/A launch's."""
    make_run(tmp_path, spec=RunSpec(ends_after_triplets=True))
    with pytest.raises(IncompleteRunError) as err:
        audit_run(tmp_path, "run1")
    assert err.value.problems == ["package reload-B: no ledger record", "package watch-C: no ledger record",
                                  "package score: no ledger record"]


def test_diagnostics_are_left_to_an_earlier_run_only_by_the_a_a_launch_that_names_it(tmp_path: Path) -> None:
    """A later A/A launch of a calibration may leave the GPU diagnostics to the first launch its record names (same
    versions); the owner's run, or an A/A launch naming another run, is not complete without its own."""
    aa = {"calibration_of": True, "ends_after_triplets": True, "candidate_switches": {}}
    make_run(tmp_path, "run1", RunSpec(**aa, diagnosed_by="first", names_diagnosed_by="first"))
    assert audit_run(tmp_path, "run1").document["exact"] is True
    why = ("packages/checks/result.json: the diagnostics were left to run first, which this run's record does not "
           "name (only a later A/A launch of a calibration may)")
    for run_id, spec in (("run2", RunSpec(diagnosed_by="first")),
                         ("run3", RunSpec(**aa, diagnosed_by="first", names_diagnosed_by="other")),
                         ("run4", RunSpec(**aa, diagnosed_by="first"))):
        make_run(tmp_path, run_id, spec)
        with pytest.raises(IncompleteRunError) as err:
            audit_run(tmp_path, run_id)
        assert err.value.problems == [why], run_id


def test_crash_leaves_an_open_record_that_blocks_the_audit(tmp_path: Path) -> None:
    make_run(tmp_path, spec=RunSpec(stop_at="reload-C", crash_open=True))
    with pytest.raises(IncompleteRunError) as err:
        audit_run(tmp_path, "run1")
    assert "package reload-C: open ledger record without a close (the run crashed or is still running)" in (
        err.value.problems
    )


def test_extra_rng_draw_is_not_exact_naming_the_first_step(tmp_path: Path, repo: Path) -> None:
    make_run(tmp_path, spec=RunSpec(rng_extra_draw=("C", 3)))
    proc = _orch("audit", "run1", "--home", str(tmp_path), "--json", cwd=repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    doc = out["audit"]
    assert doc["verdict"] == "not exact"
    rng = doc["exactness"]["rng_first_mismatch"]
    assert (rng["step"], rng["rank"], rng["tensor"]) == (3, 0, "rng.cpu")
    assert "step 3" in proc.stderr and "verdict not exact" in proc.stderr
    assert out["dev_score"]["informational"] is True  # complete evidence: the score is shown after the audit


def test_digest_divergence_names_step_rank_tensor(tmp_path: Path) -> None:
    make_run(tmp_path, spec=RunSpec(diverge=("C", 5, 1, "w.exp_avg_sq")))
    doc = audit_run(tmp_path, "run1").document
    fm = doc["exactness"]["first_mismatch"]
    assert doc["verdict"] == "not exact"
    assert (fm["check"], fm["step"], fm["rank"], fm["tensor"]) == ("digests", 5, 1, "w.exp_avg_sq")
    assert doc["exactness"]["mismatches"] == 1 + 8 * 2 * len(TENSORS)  # one tensor at step 5, all after it


def test_fp16_op_is_named(tmp_path: Path) -> None:
    make_run(tmp_path, spec=RunSpec(forbidden=("C", 7, "aten::mm", "torch.float16")))
    doc = audit_run(tmp_path, "run1").document
    assert doc["verdict"] == "not exact"
    assert any("aten::mm in torch.float16 at step 7 (arm C" in r for r in doc["reasons"])


def test_what_the_watch_let_through_and_could_not_inspect_is_shown(tmp_path: Path) -> None:
    from ledger.verdict.documents.report import exactness_lines

    make_run(tmp_path, spec=RunSpec(watch=True, calibrated=True))
    doc = audit_run(tmp_path, "run1").document
    watch = doc["exactness"]["watch"]
    assert doc["verdict"] == "accepted"  # letting a region through is reported, not a failure
    assert watch["watched_steps"] == 3 * 2 * 10
    assert watch["passed_through"] == {"compiled:m.py:attn": 3 * 2 * 10 * 2, "higher_order.cond": 3 * 2 * 10}
    assert watch["uninspected"] == ["compiled:m.py:attn: backend-generated kernels"]
    lines = exactness_lines(doc)
    assert "watch: 60 watched step line(s); passed through: compiled:m.py:attn x120, higher_order.cond x60" in lines
    assert "watch could not inspect: compiled:m.py:attn: backend-generated kernels" in lines


def test_recipe_observed_differently_is_not_exact(tmp_path: Path) -> None:
    make_run(tmp_path, spec=RunSpec(observed_lr=1e-5))
    doc = audit_run(tmp_path, "run1").document
    assert doc["verdict"] == "not exact" and not doc["exactness"]["recipe_equal"]
    assert "arm A: lr observed 1e-05, frozen 5e-06" in doc["exactness"]["recipe_differences"]


def test_one_triplet_without_a_calibration_cannot_be_bounded_and_says_what_to_run(tmp_path: Path) -> None:
    spec = RunSpec()
    spec.durations["B"] = [0.2] * 12 + [0.3] * 4
    make_run(tmp_path, spec=spec)
    doc = audit_run(tmp_path, "run1").document
    # every window shows the candidate faster (2x, 2.5x, 2.5x) but one triplet has no spread to bound it with
    assert doc["verdict"] == "no difference shown" and doc["noisy"] and doc["exact"] and doc["direction"] is None
    assert doc["speedup"]["windows"][1]["drift"] == pytest.approx(0.2 / 0.5)
    iv = doc["interval"]
    assert (iv["bounded"], iv["low"], iv["high"], iv["sd"], iv["df"], iv["variance_source"]) == (
        False, None, None, None, 0, "none")
    assert iv["estimate"] == pytest.approx(np.exp((np.log(2.0) + 2 * np.log(2.5)) / 3))
    assert doc["reasons"] == [
        "the speedup cannot be bounded yet: 1 triplet and no usable A/A calibration of this protocol on this host; "
        "run `orch calibrate PROTOCOL` on this host (A/A launches measure the spread between launches), or set "
        "measurement.repeats >= 2 (or auto)"]
    assert doc["diagnostics"] == [
        "drift above the protocol's bound: window w2 A/B drift 0.4000 > 0.02 (the two baseline launches "
        "disagree; the paired ratio uses their mean, and drift that differs between triplets widens the interval)"
    ]
    assert doc["calibration"]["found"] is False
    md = (tmp_path / "runs" / "run1" / "audit.md").read_text()
    assert "no difference shown" in md and "not bounded yet" in md and "orch calibrate PROTOCOL" in md
    assert Ledger(resolve_home(tmp_path).ledger_path).records()[-1].note == (
        "verdict: no difference shown; speedup 2.3208x not bounded (1 triplet, no calibration)")


def _noisy(base: float, seed: int, sd: float = 0.03) -> list[float]:
    import random

    rng = random.Random(seed)
    launch = rng.gauss(0.0, sd)
    return [base * float(np.exp(launch + rng.gauss(0.0, sd))) for _ in range(16)]


@pytest.mark.parametrize(("factor", "direction"), [(0.5, "faster"), (1.5, "slower")])
def test_repeats_give_per_triplet_headlines_and_a_direction_a_calibration_must_confirm(
    tmp_path: Path, repo: Path, factor: float, direction: str
) -> None:
    labels = ["A1", "C1", "B1", "B2", "C2", "A2", "A3", "C3", "B3"]
    durations = {lab: _noisy(0.2 * (factor if lab[0] == "C" else 1.0), i) for i, lab in enumerate(labels)}
    make_run(tmp_path, spec=RunSpec(repeats=3, durations=durations))
    proc = _orch("audit", "run1", "--home", str(tmp_path), "--json", cwd=repo)
    doc = json.loads(proc.stdout.strip().splitlines()[-1])["audit"]
    # the interval excludes 1, but no A/A calibration of this host measured the launch positions (issue 52)
    assert doc["verdict"] == "no difference shown" and doc["direction"] is None, proc.stderr
    assert "no usable A/A calibration of this protocol on this host" in doc["reasons"][0]
    assert doc["measurement"]["repeats"] == 3
    rep = doc["replication"]
    assert [t["order"] for t in rep["triplets"]] == [["A1", "C1", "B1"], ["B2", "C2", "A2"], ["A3", "C3", "B3"]]
    for t in rep["triplets"]:  # each triplet's headline is the owner's: min over its windows of mean(A, B) / C
        a, c, b = (durations[t["labels"][role]] for role in ("A", "C", "B"))
        ratios = [((sum(a[s:s + 2]) + sum(b[s:s + 2])) / 2) / sum(c[s:s + 2]) for s in (10, 12, 14)]
        assert t["headline"] == pytest.approx(min(ratios)) and t["ratios"] == pytest.approx(ratios)
    assert doc["speedup"]["headline"] == rep["headlines"][0]  # the first triplet is launched A -> C -> B
    iv = doc["interval"]  # paired over the 3 triplets, the run's own spread: df 2
    assert iv["df"] == 2 and iv["variance_source"] == "run" and (iv["low"] > 1.0 if direction == "faster"
                                                                 else iv["high"] < 1.0)
    assert iv["low"] < iv["estimate"] < iv["high"] and iv["estimate"] == pytest.approx(1 / factor, rel=0.1)
    d = [float(np.mean(np.log(t["ratios"]))) for t in rep["triplets"]]
    assert iv["log_speedups"] == pytest.approx(d) and iv["sd"] == pytest.approx(float(np.std(d, ddof=1)))
    assert iv["estimate"] == pytest.approx(float(np.exp(np.mean(d))))
    assert set(doc["cost"]["gpu_seconds"]) == set(package_names(3, prime=False))
    assert len(doc["cost"]["gpu_seconds"]) == 21
    # with --json the human report is on stderr
    assert "verdict: no difference shown" in proc.stderr and "triplet 2 (B2 C2 A2): paired speedup" in proc.stderr


def test_configuration_change_is_named_not_training_code_only(tmp_path: Path) -> None:
    make_run(tmp_path, spec=RunSpec(candidate_config={"reward_server_port": "9009"}))
    at = audit_run(tmp_path, "run1").document["attribution"]
    assert not at["training_code_only"]
    assert at["label"] == "includes external configuration change: reward_server_port"
    assert at["config"] == {"reward_server_port": {"baseline": None, "candidate": "9009"}}


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        (
            lambda d: (d / "sealed" / "candidate" / "train" / "online_rl.py").write_text("# edited\n"),
            "seal of candidate: sealed/candidate/ no longer matches its manifest: 1 changed (train/online_rl.py)",
        ),
        (
            lambda d: (d / "sealed" / "baseline" / "README.md").write_text("# edited\n"),
            "seal of baseline: sealed/baseline/ no longer matches its manifest: 1 changed (README.md)",
        ),
        (
            lambda d: (d / "packages" / "reload-A" / "result.json").write_text(
                (d / "packages" / "reload-A" / "result.json").read_text() + " "
            ),
            "packages/reload-A/result.json: sha256 is not the ledger's result digest",
        ),
        (
            lambda d: (d / "packages" / "train-C" / "steps.rank1.jsonl").write_text(
                (d / "packages" / "train-C" / "steps.rank1.jsonl").read_text() + "\n"
            ),
            "packages/train-C/steps.rank1.jsonl: sha256 is not the one train-C reported",
        ),
    ],
)
def test_altered_evidence_is_not_audited(tmp_path: Path, tamper: Callable[[Path], Any], expected: str) -> None:
    run_dir = make_run(tmp_path)
    tamper(run_dir)
    with pytest.raises(IncompleteRunError) as err:
        audit_run(tmp_path, "run1")
    assert any(expected in p for p in err.value.problems), err.value.problems
    assert not any((run_dir / name).exists() for name in WRITTEN)


def test_a_differing_recorded_audit_is_never_rewritten(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    audit_run(tmp_path, "run1")
    doc = json.loads((run_dir / "audit.json").read_text())
    doc["verdict"] = "noisy"
    (run_dir / "audit.json").write_text(json.dumps(doc))
    with pytest.raises(FailedError, match="never rewritten"):
        audit_run(tmp_path, "run1")
    assert json.loads((run_dir / "audit.json").read_text())["verdict"] == "noisy"


def test_an_audit_recorded_before_the_probe_cost_section_stays_as_recorded(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    audit_run(tmp_path, "run1")
    doc = json.loads((run_dir / "audit.json").read_text())
    del doc["probe_cost"]  # what an audit.json written before the section existed looks like
    (run_dir / "audit.json").write_bytes(canonical_bytes(doc))
    again = audit_run(tmp_path, "run1")
    assert not again.written and "probe_cost" not in again.document
    doc["probe_cost"] = {"rows": []}  # but a recorded section that differs is refused like any other
    (run_dir / "audit.json").write_bytes(canonical_bytes(doc))
    with pytest.raises(FailedError, match="differs from a recomputation in probe_cost"):
        audit_run(tmp_path, "run1")


def test_two_runs_are_never_mixed(tmp_path: Path, repo: Path) -> None:
    make_run(tmp_path, "run1")
    make_run(tmp_path, "run2")
    proc = _orch("audit", "run1", "run2", "--home", str(tmp_path), cwd=repo)
    assert proc.returncode == 2
    assert "never multiplied or mixed" in proc.stderr
    assert not (tmp_path / "runs" / "run1" / "audit.json").exists()


def test_reload_that_recomputes_other_digests_is_not_exact(tmp_path: Path) -> None:
    make_run(tmp_path, spec=RunSpec(reload_differs="B"))
    ex = audit_run(tmp_path, "run1").document["exactness"]
    assert ex["reload_equal"] == {"A": True, "C": True, "B": False}
    fm = ex["first_mismatch"]
    assert (fm["check"], fm["rank"], fm["tensor"]) == ("reload", 1, "w.step")


def test_cli_report_puts_the_verdict_first_and_the_score_after_the_record(tmp_path: Path, repo: Path) -> None:
    make_run(tmp_path, spec=RunSpec(calibrated=True))
    proc = _orch("audit", "run1", "--home", str(tmp_path), "--json", cwd=repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)  # with --json stdout is exactly one JSON document
    assert out["audit"]["verdict"] == "accepted" and out["dev_score"]["metrics"] == SCORE
    lines = proc.stderr.splitlines()  # the human report
    assert lines[0].startswith("verdict: accepted")
    written = next(i for i, line in enumerate(lines) if line.startswith("written: audit.json"))
    score = next(i for i, line in enumerate(lines) if "DEV score (informational" in line)
    assert written < score
    md = (tmp_path / "runs" / "run1" / "audit.md").read_text()
    assert "| w1 | 10-11 | 200.00 | 100.00 | 200.00 |" in md  # ms per step: the 400 ms window has two steps
    assert "A ms/step" in md and "](step_times.png)" in md
    assert "## Probe cost" in md and "probe cost per step" in md
    assert any(line.startswith("probe cost per step (its own time") for line in lines)


def test_the_audit_names_its_frozen_recipe_file_in_json_markdown_and_terminal(tmp_path: Path) -> None:
    """A /1 protocol is read under R3's recipe file: the audit names it, its digest and what the probe observed."""
    from io import StringIO

    from rich.console import Console

    from ledger.verdict.documents.report import render_terminal

    make_run(tmp_path, "run1")
    result = audit_run(tmp_path, "run1")
    recipe = result.document["recipe"]
    assert (recipe["file"], recipe["name"]) == ("recipes/r3_tree_rl_bagel7b.yaml", "r3-tree-rl-bagel7b")
    repo = Path(__file__).resolve().parents[2]
    assert recipe["sha256"] == _sha((repo / "recipes" / "r3_tree_rl_bagel7b.yaml").read_bytes())
    assert set(recipe["observed_keys"]) | set(recipe["flag_only_keys"]) == set(UPSTREAM_RECIPE)
    line = (f"frozen recipe: recipes/r3_tree_rl_bagel7b.yaml (sha256 {recipe['sha256'][:12]}, r3-tree-rl-bagel7b, "
            f"trainer sen-ye/R3 train/online_rl.py): {len(recipe['observed_keys'])} key(s) observed at run time, "
            f"{len(recipe['flag_only_keys'])} checked by their flags only")
    assert f"- {line}" in (tmp_path / "runs" / "run1" / "audit.md").read_text().splitlines()
    out = StringIO()
    render_terminal(result, Console(file=out, width=400, color_system=None))
    assert f"  {line}" in out.getvalue().splitlines()


def test_the_lock_hold_is_accounted_with_what_no_package_ran_in(tmp_path: Path) -> None:
    """run.json's lock record says how long the lock was held; the audit gives the part no package ran in (orch's
    seals, checks, cleanup), in seconds and in GPU-seconds at the packages' GPUs, in the JSON, the console and
    audit.md."""
    run_dir = make_run(tmp_path, spec=RunSpec(calibrated=True, lock_held_s=25.0))
    result = audit_run(tmp_path, "run1")
    cost = result.document["cost"]
    assert cost["total_wall_s"] == pytest.approx(18.0)  # 9 packages of 2.0 s
    assert cost["lock_held_s"] == 25.0 and cost["between_packages_s"] == pytest.approx(7.0)
    assert cost["lock_held_gpu_seconds"] == pytest.approx(50.0)  # charged at 2 GPUs, as the trains were
    assert cost["between_packages_gpu_seconds"] == pytest.approx(14.0)
    line = ("lock: held 25.0 s, 7.0 s of it (28.0%) between packages (orch's seals, checks and cleanup, no package "
            "running); 50.0 GPU-seconds held, 14.0 of them beyond the packages'")
    assert line in (run_dir / "audit.md").read_text()
    proc = _orch("audit", "run1", "--home", str(tmp_path), cwd=tmp_path)
    assert line in " ".join(proc.stdout.split())  # the console may fold the line
