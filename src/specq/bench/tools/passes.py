"""The cost of a step and of verify passes (benchmarks/bench_passes.py): the table of one model's
rows, each N-row pass against the 1-row step paired by round, and the read rates that say whether
a step is bound by reading the weights or by arithmetic."""

from __future__ import annotations

import statistics

SUM = "float32 sum of 1 GiB"  # the measurement of the machine's read rate
SUM_BYTES = 1 << 30


def rows_label(n: int) -> str:
    return f"{n} row{'s' * (n != 1)}"


def table(rows: list[dict]) -> str:
    """One line per measurement of one model (and the machine's read rate): the median ms at each
    row count over rounds, and each row count's ms over the fewest rows', paired by round (the
    median of the rounds' ratios); then the read rates at the fewest rows: the packed linear
    layers', the decoder layers' C call's (where measured) and a plain float32 sum's."""
    timed = [r for r in rows if r["measurement"] != SUM]
    counts = sorted({r["rows"] for r in timed})
    base = counts[0]

    def ms(what: str, n: int, context: int) -> dict[tuple, float]:
        """(run, round) -> ms of one measurement."""
        return {(r.get("run"), r["round"]): r["ms"] for r in rows
                if (r["measurement"], r["rows"], r["context"]) == (what, n, context)}

    header = ["measurement", *map(rows_label, counts),
              *(f"{rows_label(n)} / {rows_label(base)} (paired, median)" for n in counts[1:])]
    blank = " |" * (len(header) - 2)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def contexts(what: str) -> list[int]:
        return sorted({r["context"] for r in timed if r["measurement"] == what})

    labels = [(("pass", c), f"whole pass, {c} tokens of context") for c in contexts("pass")]
    labels += [(("layers", c), f"decoder layers' C call within the pass, {c} tokens of context")
               for c in contexts("layers")]
    linears = [r for r in timed if r["measurement"] == "linears"]
    weight_mb = linears[0]["weight_bytes"] / 1e6 if linears else 0.0
    if linears:
        label = f"linear layers alone ({weight_mb:.0f} MB of packed weights)"
        labels.append((("linears", 0), label))
    for (what, context), label in labels:
        times = {n: ms(what, n, context) for n in counts}
        cells = [f"{statistics.median(times[n].values()):.1f} ms" for n in counts]
        cells += [f"{statistics.median(t / times[base][k] for k, t in times[n].items()):.2f}"
                  for n in counts[1:]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if linears:
        read = statistics.median(weight_mb / m for m in ms("linears", base, 0).values())
        lines.append(f"| read rate: the linear layers at {rows_label(base)} | {read:.1f} GB/s |"
                     + blank)
    layers = [r for r in timed if r["measurement"] == "layers" and r["layer_weight_bytes"]]
    for context in contexts("layers")[:1] if layers else ():
        layer_mb = layers[0]["layer_weight_bytes"] / 1e6
        rate = statistics.median(layer_mb / m for m in ms("layers", base, context).values())
        lines.append(f"| read rate: the decoder layers' C call at {rows_label(base)} "
                     f"({layer_mb:.0f} MB) | {rate:.1f} GB/s |" + blank)
    sums = [r["ms"] for r in rows if r["measurement"] == SUM]
    if sums:
        summed = statistics.median(SUM_BYTES / 1e6 / m for m in sums)
        lines.append(f"| read rate: torch's {SUM} | {summed:.1f} GB/s |" + blank)
    return "\n".join(lines)
