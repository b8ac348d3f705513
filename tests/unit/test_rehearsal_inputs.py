"""The rehearsal's tiny inputs for upstream R3: tokenizer, prompts, configs and refusals without upstream; the whole
generation, checked by upstream's own classes and loader, when ORCH_UPSTREAM_R3 names an upstream tree.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.rehearsal_inputs import RehearsalInputs
from workers.rehearsal import make_inputs as mi

REPO = Path(__file__).resolve().parents[2]
CORPUS = ["A photo of a brown bus, a green truck, and a red skateboard", "a photo of two wine glasses",
          "How to further edit the provided image? <think> planning </think> no further edit needed."]  # fmt: skip
TEXT = "<|im_start|>A photo of 3 red buses, naïve café 東京<|im_end|><|vision_start|><|vision_end|>\n"


def load_generated(model_dir: Path):  # type: ignore[no-untyped-def]
    """The generated files loaded as a byte-level BPE with the added tokens of tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = json.loads((model_dir / "vocab.json").read_text(encoding="utf-8"))
    lines = (model_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "#version: 0.2"
    merges = [tuple(line.split(" ")) for line in lines[1:]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    added = sorted(config["added_tokens_decoder"].items(), key=lambda kv: int(kv[0]))
    tok.add_special_tokens([AddedToken(v["content"], special=True, normalized=False) for _, v in added])
    return tok, vocab, merges, config


def test_tokenizer_holds_upstreams_special_tokens_so_nothing_is_added(tmp_path: Path) -> None:
    bpe, length = mi.write_tokenizer(tmp_path, CORPUS, 300)
    tok, vocab, merges, config = load_generated(tmp_path)
    assert bpe == len(vocab) == 300 and length == 300 + len(mi.SPECIAL_TOKENS) == tok.get_vocab_size()
    assert sorted(vocab.values()) == list(range(300))
    assert all(a in vocab and b in vocab and a + b in vocab for a, b in merges)  # a valid BPE merge table
    # upstream's add_special_tokens adds whichever of these four is not in special_tokens_map
    specials = {config["eos_token"], config["pad_token"], *config["additional_special_tokens"]}
    assert {"<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"} <= specials
    ids = {v["content"]: int(k) for k, v in config["added_tokens_decoder"].items()}
    assert ids == {t: 300 + i for i, t in enumerate(mi.SPECIAL_TOKENS)}
    assert mi.tokenizer_ids(300) == {"bos_token_id": ids["<|im_start|>"], "eos_token_id": ids["<|im_end|>"],
                                     "start_of_image": ids["<|vision_start|>"],
                                     "end_of_image": ids["<|vision_end|>"]}  # fmt: skip
    enc = tok.encode(TEXT)
    assert enc.ids[0] == ids["<|im_start|>"] and enc.ids[-3:-1] == [ids["<|vision_start|>"], ids["<|vision_end|>"]]
    assert tok.decode(enc.ids, skip_special_tokens=False) == TEXT  # every byte encodes: non-ASCII included
    assert len(tok.encode("A photo of a brown bus").ids) < len(b"A photo of a brown bus")  # merges were learned


def test_tokenizer_files_are_byte_identical_for_the_same_corpus(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        mi.write_tokenizer(tmp_path / name, CORPUS, 300)
    for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    (tmp_path / "c").mkdir()
    mi.write_tokenizer(tmp_path / "c", CORPUS, 280)
    assert (tmp_path / "c" / "merges.txt").read_bytes() != (tmp_path / "a" / "merges.txt").read_bytes()


def test_prompts_are_disjoint_raw_lines_and_too_few_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "prompts.jsonl"
    rows = [json.dumps({"tag": "t", "include": [{"class": "cat", "count": i}], "prompt": f"p{i}"}) for i in range(6)]
    src.write_text("\n".join(rows) + "\n\n")
    train, val = mi.select_prompts(src, 4, 1)
    assert val == [(rows[0] + "\n").encode()] and train == [(r + "\n").encode() for r in rows[1:5]]
    with pytest.raises(mi.Refused, match="fewer than"):
        mi.select_prompts(src, 6, 1)
    src.write_text(json.dumps({"text": "no prompt key"}) + "\n")
    with pytest.raises(mi.Failed, match="no 'prompt'"):
        mi.select_prompts(src, 0, 1)


def test_llm_config_declares_the_tokenizer_length_and_no_padding_row() -> None:
    s = mi.Sizes()
    cfg = mi.llm_config(s, 526, 512)
    assert cfg["vocab_size"] == 526 and cfg["eos_token_id"] == 512 + mi.SPECIAL_TOKENS.index("<|im_end|>")
    assert "pad_token_id" not in cfg and cfg["model_type"] == "qwen2" and cfg["rope_scaling"] is None
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (
        2, 64, 4, 2)  # fmt: skip
    vit = mi.vit_config(s)
    assert vit["image_size"] // vit["patch_size"] == mi.TRAINER_FLAGS["vit_max_num_patch_per_side"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--heads", "3"], "head dim"), (["--kv-heads", "3"], "multiple of --kv-heads"),
     (["--vit-layers", "1"], "at least 2"), (["--bpe-vocab", "100"], "256 byte symbols")],
)  # fmt: skip
def test_bad_sizes_are_refused_in_one_line(tmp_path: Path, flags: list[str], message: str) -> None:
    proc = run_cli(["--upstream", str(tmp_path / "up"), "--out", str(tmp_path / "out"), *flags], tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_folders_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    inside = run_cli(["--upstream", str(tmp_path), "--out", str(REPO / "scratch-inputs")], tmp_path)
    assert inside.returncode == 2 and "inside the orch repository" in inside.stderr
    assert not (REPO / "scratch-inputs").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "old").write_text("x")
    used = run_cli(["--upstream", str(tmp_path), "--out", str(tmp_path / "used")], tmp_path)
    assert used.returncode == 2 and "not an empty folder" in used.stderr
    lacking = run_cli(["--upstream", str(tmp_path), "--out", str(tmp_path / "new")], tmp_path)
    assert lacking.returncode == 2
    # orch's list of what the folder lacks, every required file of an empty folder, in order
    assert (f"--upstream {tmp_path} is not an R3 source tree (lacks train/online_rl.py, train/fsdp_utils.py, "
            "modeling/bagel/__init__.py, modeling/autoencoder.py, data/data_utils.py, "
            "data/rl_test/test_geneval++.jsonl); point it at the upstream snapshot") in lacking.stderr
    assert lacking.stderr.count("\n") == 1 and not (tmp_path / "new").exists()


def test_trainer_defaults_are_read_from_the_source_without_importing_it(tmp_path: Path) -> None:
    src = tmp_path / "train" / "online_rl.py"
    src.parent.mkdir()
    fields = "\n".join(f"    {k}: object = field(default={v!r})" for k, v in mi.TRAINER_FLAGS.items())
    src.write_text(f"import torch_is_not_here\n@dataclass\nclass ModelArguments:\n{fields}\n")
    assert "match" in mi.check_trainer_defaults(tmp_path)
    src.write_text(src.read_text().replace("field(default=-2)", "field(default=-1)"))
    with pytest.raises(mi.Failed, match="vit_select_layer"):
        mi.check_trainer_defaults(tmp_path)


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workers.rehearsal.make_inputs", *args], cwd=cwd,
                          env=env or {**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


# ---------------------------------------------------------------- against upstream (skipped without it)

UPSTREAM = os.environ.get("ORCH_UPSTREAM_R3", "")


def _transformers_4() -> bool:
    if importlib.util.find_spec("transformers") is None:
        return False
    import transformers

    return str(transformers.__version__).startswith("4.")


needs_upstream = pytest.mark.skipif(
    not (UPSTREAM and Path(UPSTREAM, "train", "online_rl.py").is_file() and _transformers_4()),
    reason="set ORCH_UPSTREAM_R3 to an upstream R3 tree and put transformers 4.49 on PYTHONPATH",
)


@needs_upstream
def test_generated_inputs_load_through_upstream_and_repeat_byte_for_byte(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    flags = ["--upstream", UPSTREAM, "--ae", "empty", "--train-prompts", "8"]
    first = run_cli([*flags, "--out", str(tmp_path / "a")], tmp_path, env)
    assert first.returncode == 0, first.stderr
    doc = RehearsalInputs.model_validate_json(first.stdout)
    assert (tmp_path / "a" / "inputs.json").read_text() == first.stdout
    second = run_cli([*flags, "--out", str(tmp_path / "b")], tmp_path, env)
    assert second.returncode == 0 and second.stdout == first.stdout  # every file's SHA256 is in it
    for f in doc.files:
        assert (tmp_path / "b" / f.path).stat().st_size == f.bytes
    assert {f.path for f in doc.files} == {"data/train.jsonl", "data/val.jsonl", "model/ae.safetensors",
                                           "model/ema.safetensors", "model/llm_config.json", "model/merges.txt",
                                           "model/tokenizer_config.json", "model/vit_config.json",
                                           "model/vocab.json"}  # fmt: skip
    assert doc.data.train_lines == 8 and doc.data.val_lines == 1

    check = subprocess.run([sys.executable, str(REPO / "tests" / "rehearsal_upstream_check.py"), UPSTREAM,
                            str(tmp_path / "a")], env=env, capture_output=True, text=True, timeout=300,
                           check=False)  # fmt: skip
    assert check.returncode == 0, check.stderr[-2000:]
    seen = json.loads(check.stdout.strip().splitlines()[-1])
    m = doc.model
    assert seen["llm"] == [m.layers, m.hidden, m.heads, m.kv_heads, m.vocab]
    assert seen["num_new_tokens"] == 0 and seen["len_tokenizer"] == m.vocab == doc.tokenizer.length
    assert seen["new_token_ids"] == doc.tokenizer.ids
    assert seen["vit_layers_built"] == m.vit_layers_built == m.vit_layers - 1
    assert seen["bagel_parameters"] == m.bagel_parameters and seen["ae_parameters"] == m.ae_parameters
    assert seen["ema_keys_not_in_model"] == [] and seen["model_keys_not_in_ema"] == []
    assert seen["loaded_values_differ"] == [] and seen["llm2vae_nonzero"]

    changed = run_cli([*flags, "--out", str(tmp_path / "c"), "--seed", "1"], tmp_path, env)
    assert changed.returncode == 0
    ema = {f.path: f.sha256 for f in RehearsalInputs.model_validate_json(changed.stdout).files}
    assert ema["model/ema.safetensors"] != {f.path: f.sha256 for f in doc.files}["model/ema.safetensors"]
