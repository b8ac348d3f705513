"""Test helper: variants of the shipped 8-GPU protocol, one text replacement each."""

from __future__ import annotations

from pathlib import Path

BAGEL = Path(__file__).resolve().parents[1] / "protocol" / "r3_bagel7b_8xh100.yaml"


def bagel_variant(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the shipped protocol under tmp_path/protocol/ with the first `old` replaced by `new`."""
    text = BAGEL.read_text()
    assert old in text
    path = tmp_path / "protocol" / "p.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text.replace(old, new, 1))
    return path
