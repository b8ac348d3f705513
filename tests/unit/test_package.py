"""protocol.package: one model per kind (orch.package/2), and the orch.package/1 specs of a recorded run still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocol.package import PACKAGE_SCHEMA, ChecksSpec, ReloadSpec, ScoreSpec, TrainSpec, parse_spec

GOLDEN_PACKAGES = Path(__file__).resolve().parents[1] / "golden" / "home" / "runs"
KINDS = {"checks": ChecksSpec, "train": TrainSpec, "replay": TrainSpec, "reload": ReloadSpec, "score": ScoreSpec}
BASE = {"run_id": "r1", "name": "p", "package_dir": "/p", "sealed_dir": "/s", "scratch_dir": "/t",
        "result_path": "/p/result.json", "device": "cpu", "precision": "fp32"}  # fmt: skip


def test_every_v1_spec_of_the_recorded_run_reads_into_its_kinds_model() -> None:
    paths = sorted(GOLDEN_PACKAGES.glob("*/packages/*/package.json"))
    assert len(paths) == 9
    for path in paths:
        old = json.loads(path.read_bytes())
        assert old["schema"] == "orch.package/1"
        spec = parse_spec(path.read_bytes())
        assert type(spec) is KINDS[old["kind"]] and spec.schema_ == PACKAGE_SCHEMA
        kept = spec.model_dump(by_alias=True)
        # every field the kind has keeps its recorded value (slurm came later: its default); other kinds' are gone
        shared = [k for k in kept if k != "schema" and k in old]
        assert {k: kept[k] for k in shared} == {k: old[k] for k in shared}
        assert set(kept) - set(old) <= {"slurm", "watch_from", "until_compiled", "diagnosed"}
        assert kept.get("slurm") is None and kept.get("diagnosed") is None  # /1 ran every diagnostic
        assert (kept.get("watch_from", 0), kept.get("until_compiled", False)) == (0, False)  # as /1 ran
        assert len(shared) < len(old) - 1


def test_a_v2_spec_round_trips_and_names_its_kind() -> None:
    train = TrainSpec(**BASE, kind="replay", script="train/x.py", steps=16, watch_all=True)
    doc = json.loads(train.model_dump_json(by_alias=True))
    assert doc["schema"] == "orch.package/2" and "prepare" not in doc and "score_targets" not in doc
    assert parse_spec(json.dumps(doc)) == train
    assert parse_spec({**BASE, "kind": "reload", "ckpt_dir": "/c"}) == ReloadSpec(**BASE, ckpt_dir="/c")


@pytest.mark.parametrize("doc", [
    {**BASE, "kind": "reload", "steps": 16},  # a field of another kind
    {**BASE, "kind": "shell"},  # no such kind
    {**BASE, "kind": "checks", "schema": "orch.package/3"},  # a version this orch does not know
    {**BASE, "schema": "orch.package/1", "kind": "shell"},
])
def test_a_spec_that_is_not_one_kind_is_refused(doc: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        parse_spec(doc)
