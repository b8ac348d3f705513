"""Test helper: variants of the shipped 8-GPU protocol, one text replacement each; the recipe files beside a copied
protocol; the orch.protocol/1 form of a shipped protocol (no recipe file named: R3's recipe, the ids recorded then)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BAGEL = REPO / "protocol" / "r3_bagel7b_8xh100.yaml"
# the lines an orch.protocol/2 file adds to its /1 form: the recipe file it names and the comment above it
_RECIPE_FILE = re.compile(r"^# the frozen recipe \(docs/RECIPES\.md\).*\nrecipe_file:\n  path: .*\n  sha256: .*\n",
                          re.M)


def with_recipes(root: Path) -> None:
    """The repository's recipe files under root/recipes/, where a protocol with base root finds them."""
    if not (root / "recipes").exists():
        shutil.copytree(REPO / "recipes", root / "recipes")


def bagel_variant(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the shipped protocol under tmp_path/protocol/ with the first `old` replaced by `new`."""
    text = BAGEL.read_text()
    assert old in text
    path = tmp_path / "protocol" / "p.yaml"
    path.parent.mkdir(exist_ok=True)
    with_recipes(tmp_path)
    path.write_text(text.replace(old, new, 1))
    return path


def v1_text(text: str) -> str:
    """A shipped orch.protocol/2 file as it was written under orch.protocol/1: without its recipe_file."""
    assert text.count("schema: orch.protocol/2\n") == 1 and len(_RECIPE_FILE.findall(text)) == 1
    return _RECIPE_FILE.sub("", text).replace("schema: orch.protocol/2\n", "schema: orch.protocol/1\n")
