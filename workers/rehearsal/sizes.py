"""The size flags of a rehearsal's tiny inputs (Sizes), the two ways generating them stops (Refused: exit 2,
Failed: exit 1), and how their JSON files are written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Refused(Exception):
    """Bad flags or folders: one line, exit 2, nothing written."""


class Failed(Exception):
    """The inputs do not fit upstream (or upstream cannot be imported): one line, exit 1."""


@dataclass(frozen=True)
class Sizes:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vit_layers: int = 3
    vit_hidden: int = 64
    vit_heads: int = 4
    vit_intermediate: int = 128
    bpe_vocab: int = 512
    train_prompts: int = 48
    val_prompts: int = 1
    ema_dtype: str = "bf16"
    ae: str = "random"

    def check(self) -> None:
        if self.hidden % self.heads or (self.hidden // self.heads) % 8:
            raise Refused(f"--hidden {self.hidden} / --heads {self.heads} must give a head dim that is a multiple of 8")
        if self.heads % self.kv_heads:
            raise Refused(f"--heads {self.heads} must be a multiple of --kv-heads {self.kv_heads} (GQA)")
        if self.vit_hidden % self.vit_heads or (self.vit_hidden // self.vit_heads) % 8:
            raise Refused(f"--vit-hidden {self.vit_hidden} / --vit-heads {self.vit_heads} must give a head dim "
                          "that is a multiple of 8")  # fmt: skip
        if self.vit_layers < 2:
            raise Refused(f"--vit-layers {self.vit_layers}: upstream builds vit_layers - 1 layers; give at least 2")
        if min(self.layers, self.intermediate, self.vit_intermediate, self.train_prompts, self.val_prompts) < 1:
            raise Refused("--layers, --intermediate, --vit-intermediate, --train-prompts, --val-prompts must be >= 1")
        if self.bpe_vocab < 256:
            raise Refused(f"--bpe-vocab {self.bpe_vocab}: a byte-level BPE needs at least the 256 byte symbols")


def write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
