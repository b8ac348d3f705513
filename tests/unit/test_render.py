"""ledger/render.py: tables never cut a key or a figure, whatever the terminal's width."""

from __future__ import annotations

import io

from rich.console import Console

from ledger.render import print_whole, whole_table

KEY = "20261201T151531Z-65f0dacd-f08f"


def _printed(width: int) -> str:
    out = io.StringIO()
    rows = [[KEY, "1234567.891"], ["r2", "0.5"]]
    table = whole_table(["run id", "GPU seconds"], rows, footer=["total", "1234568.391"])
    print_whole(table, Console(file=out, width=width, no_color=True, highlight=False))
    return out.getvalue()


def test_columns_are_as_wide_as_their_widest_cell_keys_left_figures_right() -> None:
    table = whole_table(["run id", "GPU seconds"], [[KEY, "1.5"], ["r2", "10.25"]])
    assert [c.width for c in table.columns] == [len(KEY), len("seconds")]  # a header folds at its spaces
    assert [c.justify for c in table.columns] == ["left", "right"]
    numeric = whole_table(["a", "b", "c"], [["x", "1", "y"]], numeric=[False, True, False])
    assert [c.justify for c in numeric.columns] == ["left", "right", "left"]


def test_a_narrow_terminal_gets_the_whole_table_not_a_cut_one() -> None:
    for width in (20, 200):
        text = _printed(width)
        assert KEY in text and "1234567.891" in text and "1234568.391" in text
        row = next(line for line in text.splitlines() if KEY in line)
        assert row.rstrip().endswith("1234567.891")  # the figure is right-aligned at the table's edge
