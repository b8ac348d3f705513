"""Documents of a rehearsal's helpers: the tiny inputs that `workers.rehearsal.make_inputs` generates for upstream
R3, and the loopback judge's ready and counts files. Workers write them; the orchestrator reads them strictly.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

INPUTS_SCHEMA = "orch.rehearsal-inputs/1"
JUDGE_READY_SCHEMA = "orch.rehearsal-judge-ready/1"
JUDGE_COUNTS_SCHEMA = "orch.rehearsal-judge-counts/1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputFile(_Strict):
    path: str  # relative POSIX path under the inputs folder
    bytes: int
    sha256: str


class DeclaredModel(_Strict):
    """The shape the generated configs declare, and what upstream's classes built from them."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    vit_layers: int  # as vit_config.json declares it
    vit_layers_built: int  # upstream builds vit_layers + 1 + vit_select_layer (-2)
    vit_hidden: int
    vit_heads: int
    vit_intermediate: int
    layer_module: str
    bagel_parameters: int  # every parameter of the built Bagel model (frozen ViT and position tables included)
    ae_parameters: int  # the FLUX autoencoder, a separate module in upstream
    ema_dtype: str
    ema_tensors: int
    all_zero_tensors: list[str]  # tensors the checkpoint holds as all zeros (upstream's zero-initialised biases)


class TokenizerInfo(_Strict):
    bpe_vocab: int  # byte-level BPE entries in vocab.json
    special_tokens: list[str]  # added tokens, ids bpe_vocab.. in this order
    length: int  # len(tokenizer) = the model's vocab
    ids: dict[str, int]  # the ids upstream's add_special_tokens returns (bos, eos, start/end of image)


class DataInfo(_Strict):
    source: str  # the upstream file (relative to the upstream dir) the prompts are taken from
    source_sha256: str
    train_lines: int
    val_lines: int


class RehearsalInputs(_Strict):
    """`OUT/inputs.json`: what was generated, its hashes, and the flags that point upstream at it."""

    schema_: str = Field(INPUTS_SCHEMA, alias="schema")
    seed: int
    sizes: dict[str, int | str]  # the size flags as given (defaults filled in)
    model: DeclaredModel
    tokenizer: TokenizerInfo
    data: DataInfo
    assumed_trainer_flags: dict[str, int | float | str | bool]  # upstream flags the state dict's shapes depend on
    trainer_args: list[str]  # upstream online_rl.py flags, paths relative to the inputs folder
    files: list[InputFile]
    upstream_checks: list[str]  # what was verified against the upstream sources while generating


class JudgeReady(_Strict):
    schema_: str = Field(JUDGE_READY_SCHEMA, alias="schema")
    host: str
    ports: list[int]
    pid: int


class JudgePortCounts(_Strict):
    chat_completions: int
    geneval_pickle: int
    models: int
    health: int
    rejected: int
    total: int


class JudgeCounts(_Strict):
    schema_: str = Field(JUDGE_COUNTS_SCHEMA, alias="schema")
    host: str
    ports: dict[str, JudgePortCounts]
