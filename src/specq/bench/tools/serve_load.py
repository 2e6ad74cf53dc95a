"""The server load test's tables (benchmarks/bench_serve.py): tokens/s, latency and time to first
token per (precision, clients, mode) and --max-batch, and acceptance per server."""

from __future__ import annotations

import statistics

CELL = ("precision", "clients", "mode")


def percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def load_table(rows: list[dict]) -> str:
    """Per cell and --max-batch: tokens/s (all rounds' completion tokens over their wall time),
    latency and TTFT percentiles over every request, and tokens/s against --max-batch 1 in the
    same repeat (the paired rounds), as the mean and the range over repeats."""
    lines = ["| precision | clients | mode | max batch | requests | errors | tokens/s | "
             "vs max batch 1 (mean, min-max) | latency p50 / p95 (s) | TTFT p50 / p95 (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    rounds = [r for r in rows if r["kind"] == "round"]
    requests = [r for r in rows if r["kind"] == "request"]
    cells = sorted({tuple(r[k] for k in CELL) for r in rounds},
                   key=lambda c: (c[0], c[1], c[2] != "speculative"))
    for cell in cells:
        mine = [r for r in rounds if tuple(r[k] for k in CELL) == cell]

        def rate(rs: list[dict]) -> float:
            done = [q for q in requests
                    if any(_same_round(q, r) for r in rs) and q["error"] is None]
            return sum(q["completion_tokens"] or 0 for q in done) / sum(r["wall_s"] for r in rs)

        for batch in sorted({r["max_batch"] for r in mine}):
            rs = [r for r in mine if r["max_batch"] == batch]
            done = [q for q in requests if any(_same_round(q, r) for r in rs)]
            ok = [q for q in done if q["error"] is None]
            lat = [q["latency_s"] for q in ok]
            ttft = [q["ttft_s"] for q in ok if q["ttft_s"] is not None]
            ratios = [rate([r]) / rate([b]) for r in rs for b in mine
                      if b["max_batch"] == 1 and b["repeat"] == r["repeat"]]
            vs = "" if batch == 1 or not ratios else \
                f"{statistics.mean(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
            lines.append(f"| {cell[0]} | {cell[1]} | {cell[2]} | {batch} | {len(done)} | "
                         f"{len(done) - len(ok)} | {rate(rs):.1f} | {vs} | "
                         f"{percentile(lat, 50):.2f} / {percentile(lat, 95):.2f} | "
                         f"{percentile(ttft, 50):.2f} / {percentile(ttft, 95):.2f} |")
    return "\n".join(lines)


def acceptance_lines(rows: list[dict]) -> str:
    """Acceptance and tau per server and model over the whole run (speculative rounds)."""
    out = []
    for m in (r for r in rows if r["kind"] == "metrics" and r["draft"] != "none"):
        drafted = m["specq:spec_decode_num_draft_tokens_total"]
        accepted = m["specq:spec_decode_num_accepted_tokens_total"]
        steps = m["specq:decode_steps_total"]
        out.append(f"- max batch {m['max_batch']}, {m['model']} with {m['draft']}: acceptance "
                   f"{accepted / drafted:.3f}, tau {(accepted + steps) / steps:.2f} "
                   "(bonus token included)")
    return "\n".join(out)


def report(rows: list[dict]) -> str:
    """A results file's run line, load table and acceptance lines."""
    run = next(r for r in rows if r["kind"] == "run")
    machine = run.get("cpu") or run["machine"]
    return "\n".join([f"`{run['command']}` ({run['threads']} threads per server, {machine}, "
                      f"{run['max_tokens']} tokens per request, {run['time']})", "",
                      load_table(rows), "", acceptance_lines(rows)])


def _same_round(request: dict, round_: dict) -> bool:
    return all(request[k] == round_[k] for k in (*CELL, "max_batch", "repeat"))
