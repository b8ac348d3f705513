"""Tiny, seeded inputs for rehearsing the unmodified upstream R3 trainer (`train/online_rl.py`) end to end.

`python -m workers.rehearsal.make_inputs --upstream DIR --out DIR [size flags]` writes, byte-identical for the
same flags and environment, one model folder and two prompt files, checks them against upstream's own classes and
loader, and prints `orch.rehearsal-inputs/1` (also `OUT/inputs.json`). Needs transformers 4.x (4.49 as upstream).

Layout (every path relative to OUT; what online_rl.py reads, as scripts/train_rl.sh points at BAGEL-7B-MoT):
  model/llm_config.json   --llm_path      Qwen2 config (MoT fields come from the trainer's flags)
  model/vit_config.json   --vit_path      SigLIP vision config (980 px, patch 14: 70 patches per side)
  model/ae.safetensors    --vae_path      FLUX autoencoder weights for load_ae (random; or empty: see --ae)
  model/ema.safetensors   --resume_from model (with --resume_model_only True --finetune_from_ema True)
  model/vocab.json, merges.txt, tokenizer_config.json   Qwen2Tokenizer (os.path.dirname(llm_path))
  data/train.jsonl, data/val.jsonl   geneval_plus prompts (lines of upstream's data/rl_test/test_geneval++.jsonl)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import asdict
from pathlib import Path

from protocol.hashing import sha256_file
from protocol.rehearsal_inputs import DataInfo, DeclaredModel, InputFile, RehearsalInputs, TokenizerInfo
from workers.rehearsal.model_config import TRAINER_FLAGS, check_trainer_defaults, llm_config, vit_config
from workers.rehearsal.sizes import Failed, Refused, Sizes, write_json
from workers.rehearsal.tokenizer import SPECIAL_TOKENS, tokenizer_ids, write_tokenizer
from workers.rehearsal.upstream_model import (
    build_model,
    check_ae,
    check_checkpoint,
    check_tokenizer,
    import_upstream,
    write_weights,
)

REPO = Path(__file__).resolve().parents[2]
PROMPT_SOURCE = "data/rl_test/test_geneval++.jsonl"  # the snapshot lacks data/rl_train/train_geneval++.jsonl
UPSTREAM_REQUIRED = ("train/online_rl.py", "train/fsdp_utils.py", "modeling/bagel/__init__.py",
                     "modeling/autoencoder.py", "data/data_utils.py", PROMPT_SOURCE)  # fmt: skip


# ---------------------------------------------------------------- data


def select_prompts(source: Path, n_train: int, n_val: int) -> tuple[list[bytes], list[bytes]]:
    """val = the first n_val lines, train = the next n_train (disjoint), raw bytes as upstream wrote them."""
    lines = [ln.rstrip(b"\r\n") + b"\n" for ln in source.read_bytes().splitlines() if ln.strip()]
    if len(lines) < n_val + n_train:
        raise Refused(f"{source.name} has {len(lines)} prompts, fewer than --val-prompts + --train-prompts "
                      f"({n_val + n_train}); ask for fewer")  # fmt: skip
    for i, line in enumerate(lines[: n_val + n_train]):
        doc = json.loads(line)
        if not isinstance(doc, dict) or not isinstance(doc.get("prompt"), str):
            raise Failed(f"{source.name} line {i + 1} has no 'prompt' string: not what GenevalPromptDataset reads")
    return lines[n_val : n_val + n_train], lines[:n_val]


# ---------------------------------------------------------------- document


def file_entries(out: Path) -> list[InputFile]:
    return [InputFile(path=p.relative_to(out).as_posix(), bytes=p.stat().st_size, sha256=sha256_file(p))
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != "inputs.json"]  # fmt: skip


def trainer_args() -> list[str]:
    return ["--llm_path", "model/llm_config.json", "--vit_path", "model/vit_config.json",
            "--vae_path", "model/ae.safetensors", "--resume_from", "model",
            "--train_data_path", "data/train.jsonl", "--val_data_path", "data/val.jsonl"]  # fmt: skip


def prepare_out(out: Path) -> None:
    resolved = out.resolve()
    if resolved == REPO or REPO in resolved.parents:
        raise Refused(f"--out {out} is inside the orch repository; generate in scratch (e.g. under $ORCH_HOME)")
    if resolved.exists() and (not resolved.is_dir() or any(resolved.iterdir())):
        raise Refused(f"--out {out} exists and is not an empty folder; choose a new folder or remove it")


def check_upstream_dir(upstream: Path) -> None:
    lacking = [rel for rel in UPSTREAM_REQUIRED if not (upstream / rel).is_file()]
    if lacking:
        raise Refused(f"--upstream {upstream} is not an R3 source tree (lacks {', '.join(lacking)}); "
                      "point it at the upstream snapshot")  # fmt: skip


def generate(upstream: Path, out: Path, s: Sizes, seed: int) -> RehearsalInputs:
    s.check()
    prepare_out(out)
    check_upstream_dir(upstream)
    checks = [check_trainer_defaults(upstream)]
    up = import_upstream(upstream)
    model_dir, data_dir = out / "model", out / "data"
    model_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)

    source = upstream / PROMPT_SOURCE
    train, val = select_prompts(source, s.train_prompts, s.val_prompts)
    (data_dir / "train.jsonl").write_bytes(b"".join(train))
    (data_dir / "val.jsonl").write_bytes(b"".join(val))

    corpus = [json.loads(line)["prompt"] for line in val + train]
    bpe_vocab, length = write_tokenizer(model_dir, corpus, s.bpe_vocab)
    write_json(model_dir / "llm_config.json", llm_config(s, length, bpe_vocab))
    write_json(model_dir / "vit_config.json", vit_config(s))
    checks.append(check_tokenizer(up, model_dir, length, bpe_vocab))

    model, vae_model, build_checks = build_model(up, model_dir, s, seed)
    checks += build_checks
    n_tensors, zero = write_weights(model, vae_model, model_dir, s)
    checks.append(check_checkpoint(up, model_dir / "ema.safetensors", model))
    checks.append(check_ae(up, model_dir / "ae.safetensors", vae_model, s))

    declared = DeclaredModel(
        layers=s.layers, hidden=s.hidden, heads=s.heads, kv_heads=s.kv_heads, intermediate=s.intermediate,
        vocab=length, vit_layers=s.vit_layers, vit_layers_built=len(model.vit_model.vision_model.encoder.layers),
        vit_hidden=s.vit_hidden, vit_heads=s.vit_heads, vit_intermediate=s.vit_intermediate,
        layer_module=str(TRAINER_FLAGS["layer_module"]), bagel_parameters=sum(p.numel() for p in model.parameters()),
        ae_parameters=sum(p.numel() for p in vae_model.parameters()), ema_dtype=s.ema_dtype, ema_tensors=n_tensors,
        all_zero_tensors=zero,
    )  # fmt: skip
    doc = RehearsalInputs(
        seed=seed, sizes=asdict(s), model=declared,
        tokenizer=TokenizerInfo(bpe_vocab=bpe_vocab, special_tokens=list(SPECIAL_TOKENS), length=length,
                                ids=tokenizer_ids(bpe_vocab)),
        data=DataInfo(source=PROMPT_SOURCE, source_sha256=sha256_file(source), train_lines=len(train),
                      val_lines=len(val)),
        assumed_trainer_flags=TRAINER_FLAGS, trainer_args=trainer_args(), files=file_entries(out),
        upstream_checks=checks,
    )  # fmt: skip
    return doc


def document_text(doc: RehearsalInputs) -> str:
    return json.dumps(doc.model_dump(mode="json", by_alias=True), indent=1, sort_keys=True) + "\n"


def parse_args(argv: list[str] | None) -> tuple[Path, Path, Sizes, int]:
    d = Sizes()
    ap = argparse.ArgumentParser(
        prog="python -m workers.rehearsal.make_inputs",
        description="Generate tiny seeded inputs (model folder, prompts) for the unmodified upstream R3 trainer.",
        epilog="example: PYTHONPATH=/path/to/transformers-4.49 python -m workers.rehearsal.make_inputs "
        "--upstream ./R3 --out $ORCH_HOME/scratch/inputs",
    )
    ap.add_argument("--upstream", type=Path, required=True, help="the upstream R3 source tree (read only)")
    ap.add_argument("--out", type=Path, required=True, help="a new or empty folder outside the repository")
    ap.add_argument("--seed", type=int, default=0, help="seed of every random weight (default 0)")
    for name, help_ in (("layers", "LLM decoder layers"), ("hidden", "LLM hidden size"), ("heads", "attention heads"),
                        ("kv-heads", "key/value heads"), ("intermediate", "LLM MLP size"),
                        ("vit-layers", "SigLIP layers in vit_config.json (upstream builds one less)"),
                        ("vit-hidden", "SigLIP hidden size"), ("vit-heads", "SigLIP heads"),
                        ("vit-intermediate", "SigLIP MLP size"),
                        ("bpe-vocab", "byte-level BPE entries (256 bytes + merges) before the special tokens"),
                        ("train-prompts", "lines of data/train.jsonl"),
                        ("val-prompts", "lines of data/val.jsonl (step-0 evaluation runs over all)")):  # fmt: skip
        attr = name.replace("-", "_")
        ap.add_argument(f"--{name}", type=int, default=getattr(d, attr), help=f"{help_} (default {getattr(d, attr)})")
    ap.add_argument("--ema-dtype", choices=("bf16", "fp32"), default=d.ema_dtype,
                    help="dtype of ema.safetensors (default bf16, as BAGEL's checkpoint)")  # fmt: skip
    ap.add_argument("--ae", choices=("random", "empty"), default=d.ae,
                    help="ae.safetensors: seeded random FLUX weights (default: the same autoencoder on every rank) or "
                    "empty (load_ae keeps each rank's own seeded init, which differs across ranks)")  # fmt: skip
    o = ap.parse_args(argv)
    sizes = Sizes(layers=o.layers, hidden=o.hidden, heads=o.heads, kv_heads=o.kv_heads, intermediate=o.intermediate,
                  vit_layers=o.vit_layers, vit_hidden=o.vit_hidden, vit_heads=o.vit_heads,
                  vit_intermediate=o.vit_intermediate, bpe_vocab=o.bpe_vocab, train_prompts=o.train_prompts,
                  val_prompts=o.val_prompts, ema_dtype=o.ema_dtype, ae=o.ae)  # fmt: skip
    return o.upstream, o.out, sizes, o.seed


def main(argv: list[str] | None = None) -> int:
    upstream, out, sizes, seed = parse_args(argv)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout holds the one document; upstream's prints go to stderr
            doc = generate(upstream, out, sizes, seed)
    except Refused as exc:
        sys.stderr.write(f"make_inputs: {exc}\n")
        return 2
    except Failed as exc:
        sys.stderr.write(f"make_inputs: {exc}\n")
        return 1
    text = document_text(doc)
    (out / "inputs.json").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
