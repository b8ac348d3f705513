"""ledger/cost/hints.py: the tail hint and the offset index are caches, written so a reader never trusts a wrong one."""

from __future__ import annotations

from pathlib import Path

from ledger.cost.hints import extend_index, read_tail_hint, write_tail_hint


def test_the_tail_hint_round_trips_and_anything_else_reads_as_no_hint(tmp_path: Path) -> None:
    tail = tmp_path / "ledger.arrows.tail"
    assert read_tail_hint(tail) is None
    write_tail_hint(tail, size=4096, offset=3800, records=7)
    assert read_tail_hint(tail) == {"size": 4096, "offset": 3800, "records": 7}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.arrows.tail"]  # no temporary file left
    for junk in ("[1, 2]", "{not json", ""):
        tail.write_text(junk)
        assert read_tail_hint(tail) is None


def test_a_tail_hint_that_cannot_be_written_leaves_nothing(tmp_path: Path) -> None:
    write_tail_hint(tmp_path / "absent" / "ledger.arrows.tail", 1, 0, 1)  # its folder is missing: a cache, ignored
    assert list(tmp_path.iterdir()) == []


def test_the_index_grows_by_one_8_byte_offset_per_record_or_is_dropped(tmp_path: Path) -> None:
    index = tmp_path / "ledger.arrows.idx"
    extend_index(index, 0, 8)
    extend_index(index, 1, 300)
    assert index.read_bytes() == (8).to_bytes(8, "little") + (300).to_bytes(8, "little")
    extend_index(index, 5, 900)  # the index holds 2 entries, not 5: dropped, rebuilt by a later scan
    assert not index.exists()
    extend_index(index, 3, 700)  # no index and not the first record: none is started
    assert not index.exists()
