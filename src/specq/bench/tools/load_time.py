"""Load time and resident memory (benchmarks/bench_load.py): its tables, per file, from the rows
of its results file."""

from __future__ import annotations

import statistics

MIB = 2**20


def table(rows: list[dict]) -> str:
    """Per file, medians over rounds: load seconds, resident and peak memory, what was resident
    before the load (torch and specq imported) and the packed weights, each beside the file."""
    lines = ["| model | file | load | resident after the load | peak | resident before it | "
             "packed weights |", "|---|---|---|---|---|---|---|"]
    for ref in dict.fromkeys(r["ref"] for r in rows):
        mine = [r for r in rows if r["ref"] == ref]
        size = mine[0]["file_bytes"]
        med = {k: statistics.median(r[k] for r in mine)
               for k in ("load_s", "rss", "hwm", "rss_after_import", "packed_weight_bytes")}
        lines.append(f"| {ref} | {size / MIB:.0f} MiB | {med['load_s']:.2f} s | "
                     f"{med['rss'] / MIB:.0f} MiB ({med['rss'] / size:.2f}x) | "
                     f"{med['hwm'] / MIB:.0f} MiB ({med['hwm'] / size:.2f}x) | "
                     f"{med['rss_after_import'] / MIB:.0f} MiB | "
                     f"{med['packed_weight_bytes'] / size:.3f}x |")
    return "\n".join(lines)


def forms_table(rows: list[dict]) -> str:
    """Per file (its first round), its quantized tensors by format and the kernel form they run
    as: weights, bytes and bits per weight."""
    lines = ["| model | file format: kernel form | weights | packed bytes | bits per weight |",
             "|---|---|---|---|---|"]
    for ref in dict.fromkeys(r["ref"] for r in rows):
        first = next(r for r in rows if r["ref"] == ref)
        for kind, cell in sorted(first["packed_by_kind"].items(), key=lambda kv: -kv[1]["bytes"]):
            lines.append(f"| {ref} | {kind} | {cell['weights']:,} | {cell['bytes']:,} | "
                         f"{8 * cell['bytes'] / cell['weights']:.2f} |")
    return "\n".join(lines)
