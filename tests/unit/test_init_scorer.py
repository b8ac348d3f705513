"""orch init drafts the DEV scorer (issue 53): score.py beside the script loads an orch.ckpt/1 checkpoint whole
(FSDP shards concatenated, wrapper prefixes removed), writes one JSON object to --out, and leaves only the metric."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from orchestrator.init.draft import InitOptions, init_command

SCRIPT = "import argparse\nap = argparse.ArgumentParser()\nap.add_argument('--lr', type=float, default=1e-3)\n"


def _init(tmp_path: Path, protocol_only: bool = False) -> dict[str, object]:
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "train.py").write_text(SCRIPT)
    opts = InitOptions(script=tmp_path / "src" / "train.py", device="cpu", root=tmp_path, force=True,
                       protocol_only=protocol_only)
    return init_command(opts, lambda specs: {})


def test_init_drafts_a_scorer_and_never_writes_over_one(tmp_path: Path) -> None:
    doc = _init(tmp_path)
    assert doc["scorer"] == "src/score.py"
    scorer = tmp_path / "src" / "score.py"
    assert "def metric(" in scorer.read_text() and "src/train.py" in scorer.read_text()
    scorer.write_text("# the user's metric\n")
    assert _init(tmp_path)["scorer"] is None and _init(tmp_path, protocol_only=True)["scorer"] is None
    assert scorer.read_text() == "# the user's metric\n"  # kept, even with --force


def test_the_drafted_scorer_loads_a_sharded_checkpoint_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    _init(tmp_path)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    w = torch.arange(12.0).reshape(4, 3)
    meta = {"module.w": {"global_shape": [4, 3], "placement": "shard0"},
            "module._orig_mod.b": {"global_shape": [2], "placement": "replicate"}}
    for rank in (0, 1):  # the probe's orch.ckpt/1 files of two ranks (workers/rank/probe_model.save_checkpoint)
        params = {"module.w": w[2 * rank: 2 * rank + 2].clone(), "module._orig_mod.b": torch.tensor([1.0, 2.0])}
        torch.save({"schema": "orch.ckpt/1", "rank": rank, "world_size": 2, "params": params, "param_meta": meta,
                    "optim": {}, "devices": {}}, ckpt / f"rank{rank}.pt")
    spec = importlib.util.spec_from_file_location("drafted_score", tmp_path / "src" / "score.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    params = module.load_params(str(ckpt))
    assert set(params) == {"w", "b"} and torch.equal(params["w"], w)
    out = tmp_path / "dev.json"
    monkeypatch.setattr(sys, "argv", ["score.py", "--ckpt", str(ckpt), "--out", str(out), "--width", "8"])
    module.main()  # the protocol's and the baseline config's flags after --ckpt/--out are left to the metric
    assert json.loads(out.read_text()) == {"param_sq_sum": 506.0 + 5.0, "param_tensors": 2.0}
    (ckpt / "rank1.pt").unlink()
    with pytest.raises(SystemExit, match=r"does not hold one orch\.ckpt/1 file per rank"):
        module.load_params(str(ckpt))
