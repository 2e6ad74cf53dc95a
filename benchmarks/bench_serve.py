"""Load on `specq serve` with continuous batching: --max-batch values side by side, per precision.

Starts one `specq serve` per --max-batch value, each serving the built-in target at every given
precision (each with its registry draft). A cell is (precision, clients, mode): mode speculative
uses the precision's registry draft, plain sends `speculative: false`. In each cell the servers'
rounds run back to back, their order reversed from cell to cell (machine noise drifts by tens of
percent over minutes, so only rounds run side by side are compared), and the whole sweep repeats
--repeats times. A round sends --requests streamed chat completions (at least one per client) of
the held-out chat prompts to one precision from `clients` concurrent clients, greedy, exactly
--max-tokens tokens each (EOS ignored, so every server and mode generates the same tokens); the
other precision idles. One JSON line per request and per round to --out; the tables are computed
from that file.

    python benchmarks/bench_serve.py [--max-batch 1 4 16] [--precisions fp32 int4-g64-rtn-head8]
                                     [--clients 1 4 16] [--requests 16] [--max-tokens 32] [--repeats 2]
                                     [--threads 2] [--spec-max-batch N] [--out docs/results/serve-batch.jsonl]
    python benchmarks/bench_serve.py --table docs/results/serve-batch.jsonl
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MODES = {"speculative": {}, "plain": {"speculative": False}}
TARGET = "smollm2-135m"


def start_server(precisions: list[str], threads: int, queue: int, max_batch: int,
                 spec_max_batch: int | None = None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "specq.cli", "serve", "--precisions", ",".join(precisions), "--port", "0",
           "--threads", str(threads), "--queue", str(queue), "--max-batch", str(max_batch)]
    if spec_max_batch is not None:
        cmd += ["--spec-max-batch", str(spec_max_batch)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    url = None
    for line in proc.stderr:
        if m := re.search(r"on (http://\S+)", line):
            url = m.group(1)
        if "startup complete" in line:
            break
    if url is None:
        raise SystemExit("the server did not start")
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep its log pipe drained
    return proc, url


def one_request(client, model: str, prompt: str, max_tokens: int, extra: dict) -> dict:
    import openai

    started = time.perf_counter()
    ttft, tokens = None, None
    try:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True} | extra)
        for chunk in stream:
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - started
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        error = None
    except openai.APIError as e:
        error = f"{type(e).__name__}: {e}"
    return {"start_s": started, "ttft_s": ttft, "latency_s": time.perf_counter() - started,
            "completion_tokens": tokens, "error": error}


def run_round(url: str, label: dict, model: str, prompts: list[str], clients: int, requests: int,
              max_tokens: int) -> list[dict]:
    import openai

    local = threading.local()

    def task(i: int) -> dict:
        if not hasattr(local, "client"):
            local.client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
        row = {"kind": "request", **label, "prompt": i % len(prompts)}
        return row | one_request(local.client, model, prompts[i % len(prompts)], max_tokens, MODES[label["mode"]])

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        rows = list(pool.map(task, range(requests)))
    wall = time.perf_counter() - started
    for row in rows:
        row["start_s"] -= started
    return rows + [{"kind": "round", **label, "requests": requests, "wall_s": wall}]


def spec_counters(url: str) -> dict[tuple, dict]:
    """Drafted and accepted tokens and target steps per (model, draft) so far, from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"{url}/metrics").read().decode()
    out: dict[tuple, dict] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in ("specq:spec_decode_num_draft_tokens_total", "specq:spec_decode_num_accepted_tokens_total",
                          "specq:decode_steps_total", "specq:generation_tokens_total"):
                out.setdefault((s.labels["model"], s.labels["draft"]), {})[s.name] = s.value
    return out


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


CELL = ("precision", "clients", "mode")


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_table(rows: list[dict]) -> str:
    """Per cell and --max-batch: tokens/s (all rounds' completion tokens over their wall time),
    latency and TTFT percentiles over every request, and tokens/s against --max-batch 1 in the
    same repeat (the paired rounds), as the mean and the range over repeats."""
    lines = ["| precision | clients | mode | max batch | requests | errors | tokens/s | vs max batch 1 "
             "(mean, min-max) | latency p50 / p95 (s) | TTFT p50 / p95 (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    rounds = [r for r in rows if r["kind"] == "round"]
    requests = [r for r in rows if r["kind"] == "request"]
    cells = sorted({tuple(r[k] for k in CELL) for r in rounds},
                   key=lambda c: (c[0], c[1], c[2] != "speculative"))
    for cell in cells:
        mine = [r for r in rounds if tuple(r[k] for k in CELL) == cell]

        def rate(rs: list[dict]) -> float:
            done = [q for q in requests if any(_same_round(q, r) for r in rs) and q["error"] is None]
            return sum(q["completion_tokens"] or 0 for q in done) / sum(r["wall_s"] for r in rs)

        for batch in sorted({r["max_batch"] for r in mine}):
            rs = [r for r in mine if r["max_batch"] == batch]
            done = [q for q in requests if any(_same_round(q, r) for r in rs)]
            ok = [q for q in done if q["error"] is None]
            lat, ttft = [q["latency_s"] for q in ok], [q["ttft_s"] for q in ok if q["ttft_s"] is not None]
            ratios = [rate([r]) / rate([b]) for r in rs for b in mine
                      if b["max_batch"] == 1 and b["repeat"] == r["repeat"]]
            vs = "" if batch == 1 or not ratios else \
                f"{statistics.mean(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
            lines.append(f"| {cell[0]} | {cell[1]} | {cell[2]} | {batch} | {len(done)} | {len(done) - len(ok)} | "
                         f"{rate(rs):.1f} | {vs} | {percentile(lat, 50):.2f} / {percentile(lat, 95):.2f} | "
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
                   f"{accepted / drafted:.3f}, tau {(accepted + steps) / steps:.2f} (bonus token included)")
    return "\n".join(out)


def _same_round(request: dict, round_: dict) -> bool:
    return all(request[k] == round_[k] for k in (*CELL, "max_batch", "repeat"))


def table(path: Path) -> str:
    rows = _read(path)
    run = next(r for r in rows if r["kind"] == "run")
    return "\n".join([f"`{run['command']}` ({run['threads']} threads per server, {run['machine']}, "
                      f"{run['max_tokens']} tokens per request, {run['time']})", "", load_table(rows), "",
                      acceptance_lines(rows)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-batch", type=int, nargs="+", default=[1, 4, 16], help="one server per value")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "int4-g64-rtn-head8"])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--requests", type=int, default=16, help="requests per round (at least its clients)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="times the whole sweep runs")
    ap.add_argument("--threads", type=int, default=2, help="each server's torch threads")
    ap.add_argument("--spec-max-batch", type=int, default=None, help="every server's --spec-max-batch")
    ap.add_argument("--out", type=Path, default=Path("docs/results/serve-batch.jsonl"))
    ap.add_argument("--table", type=Path, default=None, help="print the tables of a results file and exit")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return
    from specq.data import chat_prompts

    prompts = chat_prompts("held_out")
    servers = {}
    try:
        for batch in args.max_batch:
            proc, url = start_server(args.precisions, args.threads, max(args.clients) * 2, batch, args.spec_max_batch)
            servers[batch] = (url, proc)
        for url, _ in servers.values():  # untimed warm-up of every (model, mode)
            for precision in args.precisions:
                for mode in MODES:
                    run_round(url, {"mode": mode}, f"{TARGET}@{precision}", prompts, 2, 2, 8)
        rows = [{"kind": "run", "command": "python " + shlex.join(sys.argv), "threads": args.threads,
                 "precisions": args.precisions, "max_batch": args.max_batch, "spec_max_batch": args.spec_max_batch,
                 "max_tokens": args.max_tokens,
                 "requests": args.requests, "repeats": args.repeats,
                 "machine": platform.processor() or platform.machine(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}]
        before = {batch: spec_counters(url) for batch, (url, _) in servers.items()}
        order = list(args.max_batch)
        for repeat in range(args.repeats):
            for precision in args.precisions:
                for clients in args.clients:
                    for mode in args.modes:
                        for batch in order:
                            label = {"precision": precision, "clients": clients, "mode": mode, "max_batch": batch,
                                     "repeat": repeat}
                            rows += run_round(servers[batch][0], label, f"{TARGET}@{precision}", prompts, clients,
                                              max(args.requests, clients), args.max_tokens)
                            print(json.dumps(rows[-1]), flush=True)
                        order.reverse()
        for batch, (url, _) in servers.items():
            for (model, draft), now in spec_counters(url).items():
                was = before[batch].get((model, draft), {})
                rows.append({"kind": "metrics", "max_batch": batch, "model": model, "draft": draft}
                            | {k: v - was.get(k, 0) for k, v in now.items()})
    finally:
        for _, proc in servers.values():
            proc.terminate()
            proc.wait(30)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(table(args.out))


if __name__ == "__main__":
    main()
