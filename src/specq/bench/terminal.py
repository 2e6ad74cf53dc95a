"""Print bench tables with rich; correctness failures in red, never folded into an average."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table as RichTable

from .tables import Table


def print_table(table: Table, console: Console) -> None:
    """Names fold when the terminal is narrow; numbers never wrap (a number split over two lines
    reads as two numbers)."""
    out = RichTable(title=table.title, caption=table.caption or None, caption_justify="left",
                    box=box.SIMPLE_HEAD, pad_edge=False)
    for i, header in enumerate(table.headers):
        numeric = i > 0 and all(_numeric(row[i]) for row in table.rows)
        out.add_column(header, overflow="fold", no_wrap=numeric,
                       min_width=len(header) if numeric else None)
    for cells, failed in zip(table.rows, table.failed):
        out.add_row(*cells, style="bold red" if failed else None)
    console.print(out)


def _numeric(cell: str) -> bool:
    return not cell or cell[0].isdigit() or cell[0] == "-" or cell.startswith("FAIL")


def print_failures(lines: list[str], console: Console) -> None:
    if not lines:
        return
    console.print(f"[bold red]CORRECTNESS FAILURE: {len(lines)} speculative outputs differ from "
                  "the target's own greedy output[/]")
    for line in lines:
        console.print(f"[red]  {line}[/]", highlight=False)
