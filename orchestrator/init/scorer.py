"""The DEV scorer `orch init` drafts beside the training script (score.py, the protocol's scorer.command): it loads an
orch.ckpt/1 checkpoint whole and leaves only the metric to write. Never written over a file that exists.
"""

from __future__ import annotations

from pathlib import Path

SCORER_NAME = "score.py"

SCORER = '''"""DEV scorer of {script}, drafted by `orch init`. orch runs it (the protocol's scorer.command) once per
arm, from the baseline's sealed sources, after every train and reload passed:

    python score.py --ckpt CKPT_DIR --out METRICS.json [the protocol's scorer flags]

--ckpt holds the trained model as orch.ckpt/1 files, one rank{{R}}.pt per rank; load_params() below makes them one
state dict. Write your metric in metric(); it must write one JSON object to --out (orch seals it until the audit),
read only --ckpt and committed files, and need no network. See docs/GUIDE.md, "The scorer".
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import torch

WRAPPERS = ("module.", "_orig_mod.")  # DDP / Trainer and torch.compile prefixes of the saved names


def load_params(ckpt_dir: str) -> dict[str, torch.Tensor]:
    """Every parameter whole: FSDP's Shard(0) pieces concatenated in rank order, replicated ones from rank 0."""
    files = glob.glob(os.path.join(ckpt_dir, "rank*.pt"))
    shards = sorted((torch.load(f, map_location="cpu", weights_only=True) for f in files), key=lambda d: d["rank"])
    if not shards or any(d.get("schema") != "orch.ckpt/1" for d in shards) or len(shards) != shards[0]["world_size"]:
        raise SystemExit(f"score: {{ckpt_dir}} does not hold one orch.ckpt/1 file per rank")
    params = {{}}
    for name, meta in shards[0]["param_meta"].items():
        if meta["placement"] == "shard0":
            tensor = torch.cat([d["params"][name] for d in shards], dim=0)
        else:
            tensor = shards[0]["params"][name]
        if list(tensor.shape) != list(meta["global_shape"]):
            raise SystemExit(f"score: {{name}} reassembled as {{list(tensor.shape)}}, not {{meta['global_shape']}}")
        while name.startswith(WRAPPERS):
            name = name.split(".", 1)[1]
        params[name] = tensor
    return params


def metric(params: dict[str, torch.Tensor], opts: argparse.Namespace) -> dict[str, float]:
    """Your DEV metric of the trained parameters. Rebuild the model as {script} does (with the sizes the recipe
    froze: pass them in the protocol's scorer.command), then
        missing, unexpected = model.load_state_dict(params, strict=False)
    A tied weight (lm_head.weight tied to the input embeddings) is saved once: it is in `missing`; call
    model.tie_weights() and check that nothing else is. Until then this scores the parameters' sum of squares."""
    return {{"param_sq_sum": sum(float(t.double().pow(2).sum()) for t in params.values()),
             "param_tensors": float(len(params))}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", required=True)
    opts, _ = ap.parse_known_args()  # the protocol's scorer flags and the baseline's config flags follow
    with open(opts.out, "w", encoding="utf-8") as fh:
        json.dump(metric(load_params(opts.ckpt), opts), fh, sort_keys=True)


if __name__ == "__main__":
    main()
'''


def draft_scorer(script: Path, script_rel: str) -> Path | None:
    """score.py beside the script, unless one is there (it holds the user's metric): its path, or None when kept."""
    path = script.parent / SCORER_NAME
    if path.exists():
        return None
    path.write_text(SCORER.format(script=script_rel))
    return path
