"""Print bench tables with rich; correctness failures in red, never folded into an average."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table as RichTable

from .tables import Table


def print_table(table: Table, console: Console) -> None:
    out = RichTable(title=table.title, caption=table.caption or None, caption_justify="left")
    for header in table.headers:
        out.add_column(header, overflow="fold")
    for cells, failed in zip(table.rows, table.failed):
        out.add_row(*cells, style="bold red" if failed else None)
    console.print(out)


def print_failures(lines: list[str], console: Console) -> None:
    if not lines:
        return
    console.print(f"[bold red]CORRECTNESS FAILURE: {len(lines)} speculative outputs differ from the target's "
                  "own greedy output[/]")
    for line in lines:
        console.print(f"[red]  {line}[/]", highlight=False)
