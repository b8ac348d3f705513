"""Terminal tables that never cut a key or a figure, at any width and through any pipe.

Each column is as wide as its widest cell (headers fold onto lines); a table wider than the terminal is
printed wider than it rather than cut, and into a file or a pipe always whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table


def whole_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
                footer: Sequence[str] | None = None, left: int = 1,
                numeric: Sequence[bool] | None = None) -> Table:
    """A table whose first `left` columns (or those not `numeric`) are left-aligned keys, figures right-aligned."""
    table = Table(title=title, box=box.SIMPLE_HEAD, show_footer=footer is not None, pad_edge=False, padding=(0, 0),
                  title_justify="left")
    for i, head in enumerate(header):
        cells = [str(r[i]) for r in rows] + ([str(footer[i])] if footer is not None else [])
        # as wide as its widest cell or header word: headers fold onto lines, cells never do
        width = max([len(c) for c in cells] + [len(word) for word in head.split()] + [1])
        is_key = not numeric[i] if numeric is not None else i < left
        table.add_column(head, justify="left" if is_key else "right", footer=footer[i] if footer else "",
                         width=width, overflow="fold")
    for row in rows:
        table.add_row(*[str(c) for c in row])
    return table


def print_whole(table: Table, console: Console | None = None) -> None:
    """Print `table` without cutting any cell: wider than the terminal if need be, full width into a file."""
    console = console or Console(highlight=False)
    need = Measurement.get(console, console.options.update_width(1 << 20), table).maximum
    if need <= console.width:
        console.print(table)
        return
    Console(file=console.file, width=need, force_terminal=console.is_terminal, no_color=console.no_color,
            highlight=False).print(table)
