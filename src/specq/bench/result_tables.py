"""Tables of the rows the benchmark scripts and `specq compare --json` write to docs/results
(everything but `specq bench`'s results store and the llama.cpp comparison, `peer_tables.py`):
interleaved gammas, load time and memory, the server under load, quality against a reference, and
verify passes on the eager and the fast path. `doc_tables.py` puts them into the docs."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..core.gamma import sort_key
from ..core.stats import bootstrap_ci

PLAIN = "plain"


def _gamma_order(config) -> tuple:
    """Gammas (numbers, then `auto`) first; other configurations (trees, `auto@0.2`) after."""
    plain_gamma = isinstance(config, int) or config == "auto"
    return (0, sort_key(config)) if plain_gamma else (1, config)


def _bold_ci(ci: tuple, best: bool) -> str:
    text = "{:.2f} [{:.2f}, {:.2f}]".format(*ci)
    return f"**{text}**" if best else text


def gamma_interleaved(rows: list[dict]) -> str:
    """`benchmarks/bench_gamma.py`'s rows (the script at 4a89039), per target and prompt set: plain
    tokens/s (median), then per configuration the mean of the runs' speedups over the plain run of
    the same prompt and round, with its 95% bootstrap CI (the best in bold), and tau. An output that
    differs from its plain run fails."""
    configs = sorted({r["config"] for r in rows if r["config"] != PLAIN}, key=_gamma_order)
    names = [f"gamma {c}" if _gamma_order(c)[0] == 0 else c for c in configs]
    lines = ["| target | prompts | plain tok/s | " + " | ".join(names) + " | "
             + " | ".join(f"tau, {n}" for n in names) + " |", "|" + "---|" * (3 + 2 * len(configs))]
    for target, set_name in dict.fromkeys((r["target"], r["set"]) for r in rows):
        mine = [r for r in rows if (r["target"], r["set"]) == (target, set_name)]
        plain = {(r["prompt"], r["round"]): r for r in mine if r["config"] == PLAIN}
        cells, taus = {}, {}
        for c in configs:
            runs = [r for r in mine if r["config"] == c and (r["prompt"], r["round"]) in plain]
            for r in runs:
                if r["token_ids"] != plain[(r["prompt"], r["round"])]["token_ids"]:
                    raise SystemExit(f"{target} {set_name} prompt {r['prompt']}: {c} differs from "
                                     "plain decoding")
            base = [plain[(r["prompt"], r["round"])]["tokens_per_s"] for r in runs]
            cells[c] = bootstrap_ci([r["tokens_per_s"] / b for r, b in zip(runs, base)])
            taus[c] = statistics.mean(r["tau"] for r in runs)
        best = max(cells, key=lambda c: cells[c][0])
        rate = statistics.median(r["tokens_per_s"] for r in plain.values())
        lines.append(f"| {target} | {set_name} ({len(plain)} runs) | {rate:.1f} | "
                     + " | ".join(_bold_ci(cells[c], c == best) for c in configs) + " | "
                     + " | ".join(f"{taus[c]:.2f}" for c in configs) + " |")
    return "\n".join(lines)


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def load(rows: list[dict]) -> str:
    """`bench_load.py`'s rows, per machine and file, medians over rounds: load seconds, resident
    and peak memory, what was resident before the load (torch and specq imported) and the packed
    weights, each beside the file's bytes."""
    lines = ["| machine | model | file | load | resident after the load | peak | "
             "resident before it | packed weights |", "|---|---|---|---|---|---|---|---|"]
    for machine, ref in dict.fromkeys((r["machine"], r["ref"]) for r in rows):
        mine = [r for r in rows if (r["machine"], r["ref"]) == (machine, ref)]
        size = mine[0]["file_bytes"]
        med = {k: statistics.median(r[k] for r in mine)
               for k in ("load_s", "rss", "hwm", "rss_after_import", "packed_weight_bytes")}
        name = Path(ref).stem if ref.endswith(".gguf") else ref
        lines.append(f"| {machine} | {name} | {_mib(size)} | {med['load_s']:.2f} s | "
                     f"{_mib(med['rss'])} ({med['rss'] / size:.2f}x) | "
                     f"{_mib(med['hwm'])} ({med['hwm'] / size:.2f}x) | "
                     f"{_mib(med['rss_after_import'])} | "
                     f"{med['packed_weight_bytes'] / size:.3f}x |")
    return "\n".join(lines)


SERVE_CELL = ("precision", "clients", "mode")


def _percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _served(rows: list[dict]) -> dict[tuple, dict]:
    """`bench_serve.py`'s rounds by (precision, clients, mode, --max-batch): requests, errors,
    tokens/s (all rounds' completion tokens over their wall time), latency and TTFT percentiles
    over every request, and the rounds' tokens/s against --max-batch 1 in the same repeat."""
    rounds = [r for r in rows if r["kind"] == "round"]
    requests = [r for r in rows if r["kind"] == "request"]

    def key(r: dict) -> tuple:
        return (*(r[k] for k in SERVE_CELL), r["max_batch"], r["repeat"])

    def of(rs: list[dict]) -> list[dict]:
        keys = {key(r) for r in rs}
        return [q for q in requests if key(q) in keys]

    def rate(rs: list[dict]) -> float:
        done = [q for q in of(rs) if q["error"] is None]
        return sum(q["completion_tokens"] or 0 for q in done) / sum(r["wall_s"] for r in rs)

    out = {}
    cells = sorted({tuple(r[k] for k in SERVE_CELL) for r in rounds},
                   key=lambda c: (c[0], c[1], c[2] != "speculative"))
    for cell in cells:
        mine = [r for r in rounds if tuple(r[k] for k in SERVE_CELL) == cell]
        for batch in sorted({r["max_batch"] for r in mine}):
            rs = [r for r in mine if r["max_batch"] == batch]
            done = of(rs)
            ok = [q for q in done if q["error"] is None]
            latency = [q["latency_s"] for q in ok]
            ttft = [q["ttft_s"] for q in ok if q["ttft_s"] is not None]
            ones = [rate([r]) / rate([b]) for r in rs for b in mine
                    if b["max_batch"] == 1 and b["repeat"] == r["repeat"]]
            out[(*cell, batch)] = {"requests": len(done), "errors": len(done) - len(ok),
                                   "rate": rate(rs), "vs_one": ones if batch > 1 else [],
                                   "latency": [_percentile(latency, p) for p in (50, 95)],
                                   "ttft": [_percentile(ttft, p) for p in (50, 95)]}
    return out


def serve_modes(rows: list[dict], clients: set[int] | None = None) -> str:
    """The same rounds with the two modes side by side: per precision, clients and --max-batch,
    plain and speculative tokens/s, their ratio, and the median latency and TTFT of each."""
    served = _served(rows)
    lines = ["| precision | clients | max batch | plain tok/s | speculative tok/s | "
             "speculative / plain | latency p50, plain / speculative (s) | "
             "TTFT p50, plain / speculative (s) |", "|" + "---|" * 8]
    for precision, n, batch in dict.fromkeys((p, c, b) for p, c, _, b in served):
        plain = served.get((precision, n, "plain", batch))
        spec = served.get((precision, n, "speculative", batch))
        if (clients is not None and n not in clients) or not (plain and spec):
            continue
        lines.append(f"| {precision} | {n} | {batch} | {plain['rate']:.1f} | {spec['rate']:.1f} | "
                     f"{spec['rate'] / plain['rate']:.2f} | "
                     f"{plain['latency'][0]:.2f} / {spec['latency'][0]:.2f} | "
                     f"{plain['ttft'][0]:.2f} / {spec['ttft'][0]:.2f} |")
    return "\n".join(lines)


def _mean_ci(m: dict, digits: int) -> str:
    return f"{m['mean']:.{digits}f} [{m['low']:.{digits}f}, {m['high']:.{digits}f}]"


def compare(rows: list[dict]) -> str:
    """`specq compare --json` rows (those with a top-1 figure): each model B against the reference
    A on held-out text, on the kernels it ran (`--backend eager`: torch's), 95% CIs over chunks;
    A's own perplexity is in the rows (`ppl_a`)."""
    lines = ["| B | kernels | commit | perplexity | top-1 agreement with A | KL(A, B) |",
             "|---|---|---|---|---|---|"]
    for r in (r for r in rows if "top1" in r):
        eager = "--backend eager" in r.get("command", "")
        kernels = r.get("kernels") or ("eager" if eager else "fast")
        lines.append(f"| {r['b']} | {kernels} | {r.get('commit', '-')} | "
                     f"{_mean_ci(r['ppl_b'], 1)} | {_mean_ci(r['top1'], 3)} | "
                     f"{_mean_ci(r['kl_ab'], 3)} |")
    return "\n".join(lines)


def verify(rows: list[dict]) -> str:
    """`benchmarks/bench_verify.py`'s rows (the script at 4a89039): ms of one forward of N tokens
    per precision and path (medians over rounds), and its cost relative to a one-token step."""
    sizes = sorted({r["tokens"] for r in rows})
    lines = ["| precision | path | " + " | ".join(f"{n} tok" for n in sizes) + " |",
             "|---|---|" + "---|" * len(sizes)]
    for spec, path in dict.fromkeys((r["precision"], r["path"]) for r in rows):
        med = {n: statistics.median(r["ms"] for r in rows
                                    if (r["precision"], r["path"], r["tokens"]) == (spec, path, n))
               for n in sizes}
        cells = [f"{med[n]:.1f} ({med[n] / med[sizes[0]]:.2f}x)" for n in sizes]
        lines.append(f"| {spec} | {path} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
