"""Load on `specq serve`: 1, 4 and 16 concurrent clients, mixed precisions, speculative vs plain.

Starts `specq serve` on the built-in target at the given precisions. For each concurrency it runs
one round per mode (speculative: each precision's registry draft; plain: `speculative: false`),
back to back, alternating which goes first (machine noise drifts by tens of percent over minutes,
so only rounds run side by side are compared). A round is --requests streamed chat completions
(at least one per client), round-robin over the precisions and the held-out chat prompts, greedy,
exactly --max-tokens tokens (EOS ignored, so both modes generate the same tokens). One JSON line
per request and per round to --out; the Markdown table is computed from that file.

    python benchmarks/bench_serve.py [--precisions fp32 int4-g64-rtn-head8] [--requests 8] [--max-tokens 32]
                                     [--threads 2] [--out docs/results/serve-load.jsonl]
    python benchmarks/bench_serve.py --table docs/results/serve-load.jsonl
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

import openai
from prometheus_client.parser import text_string_to_metric_families

from specq.data import chat_prompts

CONCURRENCY = (1, 4, 16)
MODES = {"speculative": {}, "plain": {"speculative": False}}


def start_server(precisions: list[str], threads: int, queue: int) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "specq.cli", "serve", "--precisions", ",".join(precisions), "--port", "0",
           "--threads", str(threads), "--queue", str(queue)]
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


def one_request(client: openai.OpenAI, model: str, prompt: str, max_tokens: int, extra: dict) -> dict:
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


def run_round(url: str, label: dict, models: list[str], prompts: list[str], concurrency: int, requests: int,
              max_tokens: int) -> list[dict]:
    local = threading.local()

    def task(i: int) -> dict:
        if not hasattr(local, "client"):
            local.client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
        model, prompt = models[i % len(models)], prompts[i % len(prompts)]
        row = {"kind": "request", **label, "model": model, "prompt": i % len(prompts)}
        return row | one_request(local.client, model, prompt, max_tokens, MODES[label["mode"]])

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        rows = list(pool.map(task, range(requests)))
    wall = time.perf_counter() - started
    for row in rows:
        row["start_s"] -= started
    return rows + [{"kind": "round", **label, "requests": requests, "wall_s": wall}]


def spec_counters(url: str) -> dict[tuple, dict]:
    """Drafted and accepted tokens and target steps per (model, draft) so far, from /metrics."""
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


def table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    run = next(r for r in rows if r["kind"] == "run")
    lines = [f"`{run['command']}` ({run['threads']} threads, {run['machine']}, {run['max_tokens']} tokens per "
             f"request, precisions {', '.join(run['precisions'])}, {run['time']})", "",
             "| clients | mode | requests | errors | tokens/s | latency p50 / p95 (s) | TTFT p50 / p95 (s) |",
             "|---|---|---|---|---|---|---|"]
    key = ("concurrency", "mode")
    rounds = sorted((r for r in rows if r["kind"] == "round"),
                    key=lambda r: (r["concurrency"], r["mode"] != "speculative"))
    for r in rounds:
        done = [q for q in rows if q["kind"] == "request" and all(q[k] == r[k] for k in key)]
        ok = [q for q in done if q["error"] is None]
        lat, ttft = [q["latency_s"] for q in ok], [q["ttft_s"] for q in ok if q["ttft_s"] is not None]
        tokens = sum(q["completion_tokens"] or 0 for q in ok)
        lines.append(f"| {r['concurrency']} | {r['mode']} | {len(done)} | {len(done) - len(ok)} | "
                     f"{tokens / r['wall_s']:.1f} | {percentile(lat, 50):.2f} / {percentile(lat, 95):.2f} | "
                     f"{percentile(ttft, 50):.2f} / {percentile(ttft, 95):.2f} |")
    lines += ["", "One client at a time, per model: median latency, speculative vs plain", ""]
    for model in dict.fromkeys(q["model"] for q in rows if q["kind"] == "request"):
        p50 = {mode: statistics.median(q["latency_s"] for q in rows if q["kind"] == "request" and q["model"] == model
                                       and q["concurrency"] == 1 and q["mode"] == mode and q["error"] is None)
               for mode in MODES}
        lines.append(f"- {model}: {p50['speculative']:.2f} s vs {p50['plain']:.2f} s "
                     f"(speedup {p50['plain'] / p50['speculative']:.2f}x)")
    lines.append("")
    for m in (r for r in rows if r["kind"] == "metrics" and r["draft"] != "none"):
        drafted = m["specq:spec_decode_num_draft_tokens_total"]
        accepted = m["specq:spec_decode_num_accepted_tokens_total"]
        steps = m["specq:decode_steps_total"]
        lines.append(f"- {m['model']} with {m['draft']}: acceptance {accepted / drafted:.3f}, "
                     f"tau {(accepted + steps) / steps:.2f} (bonus token included; speculative rounds)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "int4-g64-rtn-head8"])
    ap.add_argument("--requests", type=int, default=8, help="requests per round (at least its concurrency)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    ap.add_argument("--out", type=Path, default=Path("docs/results/serve-load.jsonl"))
    ap.add_argument("--table", type=Path, default=None, help="print the table of a results file and exit")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return
    proc, url = start_server(args.precisions, args.threads, max(CONCURRENCY) * 2)
    try:
        models = [f"smollm2-135m@{p}" for p in args.precisions]
        prompts = chat_prompts("held_out")
        for mode in MODES:  # untimed warm-up of every (model, mode)
            run_round(url, {"mode": mode}, models, prompts, len(models), len(models), 8)
        rows = [{"kind": "run", "command": "python " + shlex.join(sys.argv), "threads": args.threads,
                 "precisions": args.precisions, "max_tokens": args.max_tokens, "requests": args.requests,
                 "machine": platform.processor() or platform.machine(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}]
        before = spec_counters(url)
        order = list(MODES)
        for concurrency in CONCURRENCY:
            for mode in order:
                label = {"concurrency": concurrency, "mode": mode}
                rows += run_round(url, label, models, prompts, concurrency, max(args.requests, concurrency),
                                  args.max_tokens)
                print(json.dumps(rows[-1]), flush=True)
            order.reverse()
        for (model, draft), now in spec_counters(url).items():
            was = before.get((model, draft), {})
            rows.append({"kind": "metrics", "model": model, "draft": draft}
                        | {k: v - was.get(k, 0) for k, v in now.items()})
    finally:
        proc.terminate()
        proc.wait(30)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(table(args.out))


if __name__ == "__main__":
    main()
