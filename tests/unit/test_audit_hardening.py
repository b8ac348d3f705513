"""Issue 17 on fabricated runs: what the recipe fixes about parameters and optimizer, the trainer's own numbers,
the watched replay of arm C, and runs recorded before those became evidence (refused in one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_audit import RunSpec, make_run

from ledger.verdict.decide.evidence import IncompleteRunError
from ledger.verdict.decide.recipe_check import structure_differences
from ledger.verdict.documents.audit import audit_run
from protocol.recipe import ObserveFrozen, v1_recipe
from protocol.results import ObservedRecipe, ParamGroup


def _reasons(tmp_path: Path, spec: RunSpec) -> tuple[dict, list[str]]:
    make_run(tmp_path, spec=spec)
    doc = audit_run(tmp_path, "run1").document
    return doc, doc["reasons"]


def test_unfrozen_vit_outside_the_optimizer_is_a_recipe_violation(tmp_path: Path) -> None:
    # the reviewer's cheat: requires_grad=True on the ViT, the optimizer unchanged (counts as seen on r3-mini)
    cheat = {"frozen": [], "trainable": ["body", "vit.w"], "trainable_params": 213568, "frozen_params": 0}
    spec = RunSpec(structure={"C": cheat, "A": {"trainable_params": 202368}, "B": {"trainable_params": 202368}})
    doc, reasons = _reasons(tmp_path, spec)
    assert doc["verdict"] == "not exact" and doc["exactness"]["recipe_equal"] is False
    diffs = doc["exactness"]["recipe_differences"]
    assert "arm C: freeze_vit is frozen true but vit.w trainable (requires_grad=True)" in diffs
    assert "arm C: trainable_params 213,568, arm A 202,368" in diffs
    assert "arm C: frozen parameters differ from arm A: [] only in arm C, [vit.w] only in arm A" in diffs
    assert any(r.startswith("recipe violation: arm C: freeze_vit") for r in reasons)
    assert not any("arm B" in d for d in diffs)


def test_optimizer_groups_must_be_equal_across_arms(tmp_path: Path) -> None:
    groups = [ParamGroup(tensors=4, numel=100, hyper={"lr": "5e-06", "betas": "(0.9, 0.95)", "eps": "1e-07"})]
    doc, _ = _reasons(tmp_path, RunSpec(structure={"B": {"param_groups": groups}}))
    assert doc["verdict"] == "not exact"
    assert ("arm B: optimizer parameter groups differ from arm A: group 0: eps 1e-07 in arm B, 1e-08 in arm A"
            in doc["exactness"]["recipe_differences"])


def test_structure_differences_name_counts_and_groups() -> None:
    base = ObservedRecipe(optimizer="AdamW", lr=5e-6, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                          frozen=["vit_model"], trainable=["language_model"], trainable_params=10, frozen_params=5,
                          optimizer_params=10, param_groups=[ParamGroup(tensors=2, numel=10, hyper={"lr": "5e-06"})])
    two = base.model_copy(update={"param_groups": [*base.param_groups, ParamGroup(tensors=1, numel=1, hyper={})],
                                  "optimizer_params": 11})
    assert structure_differences({"A": base, "C": base, "B": base}) == []
    assert structure_differences({"A": base, "C": two}) == [
        "arm C: optimizer_params 11, arm A 10",
        "arm C: optimizer parameter groups differ from arm A: 2 group(s) in arm C, 1 in arm A",
    ]
    vit = v1_recipe().recipe.keys["freeze_vit"].observe  # R3's recipe file: the ViT by name
    assert isinstance(vit, ObserveFrozen)
    assert vit.matches("vit_model.encoder.layers.0.mlp.fc1.weight") and vit.matches("Bagel#0:vit_pos_embed.pos_embed")
    assert not vit.matches("language_model.model.layers.0.self_attn.q_proj.weight")
    assert not vit.matches("connector.fc1") and not vit.matches("navit.x") and vit.matches("a.VIT2.b")


def test_a_differing_trainer_loss_is_named_by_step_rank_and_quantity(tmp_path: Path) -> None:
    doc, reasons = _reasons(tmp_path, RunSpec(scalar_differs=("C", 3, 1)))
    ex = doc["exactness"]
    assert doc["verdict"] == "not exact" and ex["scalars_equal"] is False
    first = ex["scalars_first_mismatch"]
    assert (first["check"], first["step"], first["rank"], first["tensor"]) == ("scalars", 3, 1, "backward[0]")
    assert first["values"]["A"] == first["values"]["B"] != first["values"]["C"]
    assert "scalars mismatch at step 3, rank 1, quantity backward[0]: the trainer's backward[0] differs " \
           "(A=0.671875, C=1.671875, B=0.671875)" in reasons
    assert ex["scalar_steps"] == [0, 14] and ex["digest_steps"] == [0, 13]  # the values logged after step 13 too


def test_equal_trainer_numbers_are_reported_compared(tmp_path: Path) -> None:
    doc, _ = _reasons(tmp_path, RunSpec(calibrated=True))
    ex = doc["exactness"]
    assert doc["verdict"] == "accepted" and ex["scalars_equal"] is True
    assert ex["scalars_compared"] == 15 * 2 * 3  # steps 0-14, 2 ranks, loss + grad norm + one logged number


def test_an_arm_whose_trainer_logged_nothing_is_refused(tmp_path: Path) -> None:
    doc, reasons = _reasons(tmp_path, RunSpec(silent="B"))
    assert doc["verdict"] == "not exact"
    assert ("arm B: its trainer logged no training step (no number through wandb.log or logging in steps 0-14); "
            "its own numbers cannot be compared") in reasons


def test_when_no_arm_logged_the_exactness_section_says_so_beside_the_equal_numbers(tmp_path: Path) -> None:
    doc, reasons = _reasons(tmp_path, RunSpec(silent="ACB"))  # losses and grad norms equal, nothing logged (issue 53)
    assert doc["verdict"] == "not exact" and doc["exactness"]["scalars_equal"] is True
    assert sum("logged no training step" in r for r in reasons) == 3
    shown = (tmp_path / "runs" / "run1" / "audit.md").read_text()
    assert ("equal across A, C, B at steps 0-14 (60 compared); but arm A, arm C, arm B logged no number of its own: "
            "not exact") in shown


def test_fp16_op_only_in_a_timed_step_is_found_by_the_watched_replay(tmp_path: Path) -> None:
    doc, reasons = _reasons(tmp_path, RunSpec(watch_forbidden=(12, "aten.mm.default", "float16")))
    ex = doc["exactness"]
    assert doc["verdict"] == "not exact"
    assert ex["forbidden"][0] == {"arm": "C", "rank": 0, "step": 12, "op": "aten.mm.default", "dtype": "float16",
                                  "package": "watch-C"}
    assert reasons[0] == (
        "forbidden dtype: aten.mm.default in float16 at step 12 (arm C, watched replay, rank 0) and 1 more")
    assert ex["watch_coverage"] == {"train-A": list(range(10)), "train-C": list(range(10)),
                                   "train-B": list(range(10)), "watch-C": list(range(16))}
    assert ex["replay_equal"] is True


def test_a_replay_that_computed_something_else_proves_nothing(tmp_path: Path) -> None:
    doc, reasons = _reasons(tmp_path, RunSpec(watch_differs=11))
    assert doc["verdict"] == "not exact" and doc["exactness"]["replay_equal"] is False
    assert any(r.startswith("watch-C did not replay train-C (its forbidden-dtype watch proves nothing): "
                            "digests mismatch at step 11, rank 0") for r in reasons)


def test_a_run_recorded_before_the_replay_is_refused_in_one_line(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    doc = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**doc, "schema": "orch.run/1"}))
    with pytest.raises(IncompleteRunError) as err:
        audit_run(tmp_path, "run1")
    assert err.value.problems == ["run.json: orch.run/1 (before watch-C and trainer scalars); relaunch the protocol"]
    assert "\n" not in err.value.message and "relaunch the protocol" in err.value.message
    assert not (run_dir / "audit.json").exists()


def test_the_audit_names_each_packages_isolation_and_what_it_left_open() -> None:
    """Issue 49: the audit says how packages were isolated; scan mode and the host's network are named with what
    they leave open, never silently."""
    from ledger.verdict.documents.isolation_doc import NAMESPACE_WORDS, isolation_doc, isolation_lines
    from protocol.run_record import PackageEntry, RunRecord

    run = RunRecord.model_validate_json(next((Path(__file__).resolve().parents[1] / "golden" / "home" / "runs").glob(
        "*/run.json")).read_bytes())
    assert isolation_doc(run.updated(packages=[])) is None  # recorded before run.json kept it

    def entry(name: str, isolation: str, network: str | None) -> PackageEntry:
        return PackageEntry(name=name, kind="train", arm_label="A", arm="baseline", env={}, status="ok",
                            isolation=isolation, network=network)

    quiet = isolation_doc(run.updated(packages=[entry("train-A", "namespace", "namespace")]))
    assert quiet == {"packages": {"train-A": {"isolation": "namespace", "network": "namespace"}},
                     "words": [NAMESPACE_WORDS]}
    mixed = isolation_doc(run.updated(packages=[entry("train-A", "namespace", "namespace"),
                                                entry("train-C", "scan+cgroup", "host")]))
    assert mixed is not None and len(mixed["words"]) == 2
    assert mixed["words"][0].startswith("scan mode (train-C): nothing was read-only")
    assert mixed["words"][1].startswith("the host's network (train-C): local services and sockets")
    assert isolation_lines({"isolation": mixed})[0].startswith("isolation: scan mode (train-C)")
