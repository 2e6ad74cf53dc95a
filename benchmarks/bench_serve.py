"""Load on `specq serve` with continuous batching: --max-batch values side by side, per
precision: tokens/s, latency and time to first token under concurrent clients.

    python benchmarks/bench_serve.py [--max-batch 1 4 16] [--precisions fp32 int4-g64-rtn-head8]
        [--clients 1 4 16] [--modes speculative plain] [--requests 16] [--max-tokens 32]
        [--repeats 2] [--threads 2] [--spec-max-batch N] [--out docs/results/serve-batch.jsonl]
    python benchmarks/bench_serve.py --table docs/results/serve-batch.jsonl
    python benchmarks/bench_serve.py --storm [--target qwen2.5-coder-1.5b --precisions gguf]
        [--clients 32] [--rounds 3] [--max-batch 16] [--queue 8] [--max-tokens 32] [--threads 2]
        [--out docs/results/serve-load-coder.jsonl]

Results: one JSON line per request, per round and per server's counters, and one for the run
(the command, the date), each with the machine (`cpu`), written to --out (replacing it; default
docs/results/serve-batch.jsonl); the tables are computed from that file
(`specq.bench.tools.serve_load`) and printed.

Starts one `specq serve` per --max-batch value, each serving the built-in target at every given
precision (each with its registry draft). A cell is (precision, clients, mode): mode speculative
uses the precision's registry draft, plain sends `speculative: false`. In each cell the servers'
rounds run back to back, their order reversed from cell to cell (machine noise drifts by tens of
percent over minutes, so only rounds run side by side are compared), and the whole sweep repeats
--repeats times. A round sends --requests streamed chat completions (at least one per client) of
the held-out chat prompts to one precision from `clients` concurrent clients, greedy, exactly
--max-tokens tokens each (EOS ignored, so every server and mode generates the same tokens); the
other precision idles.

--storm runs the server under hostile load instead (`specq.bench.tools.serve_storm`): one server
of --target at the first precision with its default draft, --clients concurrent streamed greedy
chats of --max-tokens tokens against a --queue small enough to fill, every fourth client asking
for a long answer and hanging up mid-stream, each 429 asked again after its Retry-After; then a
SIGKILL under load and a restart; the storm runs --rounds times back to back. Rows: each client's
outcome, latency and time to first token, every completed answer checked against `specq
generate`'s, the server's resident memory after its warm-up and its peak in each round, its
counts; default --out docs/results/serve-load-TARGET.jsonl.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specq.bench.tools import serve_storm
from specq.bench.tools.serve_load import ServerProcess, report
from specq.kernels import build

MODES = {"speculative": {}, "plain": {"speculative": False}}
TARGET = "smollm2-135m"
COUNTERS = ("specq:spec_decode_num_draft_tokens_total",
            "specq:spec_decode_num_accepted_tokens_total", "specq:decode_steps_total",
            "specq:generation_tokens_total")


def server_args(precisions: list[str], threads: int, queue: int, max_batch: int,
                spec_max_batch: int | None = None) -> list[str]:
    # rounds repeat the same prompts: with a suffix cache an n-gram draft would copy each answer
    # from its earlier round
    args = ["--target", TARGET, "--precisions", ",".join(precisions), "--port", "0",
            "--threads", str(threads), "--queue", str(queue), "--max-batch", str(max_batch),
            "--suffix-cache", "0"]
    return args + ([] if spec_max_batch is None else ["--spec-max-batch", str(spec_max_batch)])


def one_request(client, model: str, prompt: str, max_tokens: int, extra: dict) -> dict:
    import openai

    started = time.perf_counter()
    ttft, tokens = None, None
    try:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True} | extra)
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
            local.client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                                         timeout=600)
        prompt = prompts[i % len(prompts)]
        row = {"kind": "request", **label, "prompt": i % len(prompts)}
        return row | one_request(local.client, model, prompt, max_tokens, MODES[label["mode"]])

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
            if s.name in COUNTERS:
                out.setdefault((s.labels["model"], s.labels["draft"]), {})[s.name] = s.value
    return out


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_storm(args) -> None:
    """--storm: the hostile-load scenario on one server, its rows and table."""
    from specq.data import chat_prompts

    precision = (args.precisions or ["fp32"])[0]
    plan = serve_storm.Storm(clients=(args.clients or [32])[0], max_tokens=args.max_tokens,
                             rounds=args.rounds)
    prompts = chat_prompts("held_out")[:8]
    out = args.out or Path(f"docs/results/serve-load-{args.target}.jsonl")
    target = f"{args.target}@{precision}"
    run = {"kind": "run", "command": "python " + shlex.join(sys.argv), "target": target,
           "threads": args.threads, "max_batch": (args.max_batch or [16])[0],
           "queue": args.queue, "machine": platform.processor() or platform.machine(),
           "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    rows = [run] + serve_storm.run(
        ["--target", args.target, "--precisions", precision, "--port", "0",
         "--threads", str(args.threads), "--max-batch", str(run["max_batch"]),
         "--queue", str(args.queue)], args.target, prompts, target, plan)
    cpu = build.cpu_model()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({**r, "cpu": cpu}) + "\n" for r in rows))
    print(serve_storm.table(read(out)))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--storm", action="store_true",
                    help="hostile load on one server instead of the batching sweep")
    ap.add_argument("--target", default=TARGET, help="--storm's target (the sweep's is the 135M)")
    ap.add_argument("--max-batch", type=int, nargs="+", default=None,
                    help="one server per value (default 1 4 16; --storm: 16)")
    ap.add_argument("--precisions", nargs="+", default=None,
                    help="default fp32 int4-g64-rtn-head8 (--storm: the first, default fp32; "
                         "gguf for a GGUF target at its own precision)")
    ap.add_argument("--clients", type=int, nargs="+", default=None,
                    help="default 1 4 16 (--storm: 32)")
    ap.add_argument("--queue", type=int, default=8, help="--storm's --queue")
    ap.add_argument("--rounds", type=int, default=3,
                    help="--storm's storms back to back (memory that grows from one to the next "
                         "is kept)")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--requests", type=int, default=16,
                    help="requests per round (at least its clients)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="times the whole sweep runs")
    ap.add_argument("--threads", type=int, default=2, help="each server's torch threads")
    ap.add_argument("--spec-max-batch", type=int, default=None,
                    help="every server's --spec-max-batch")
    ap.add_argument("--out", type=Path, default=None,
                    help="default docs/results/serve-batch.jsonl (--storm: "
                         "docs/results/serve-load-TARGET.jsonl)")
    ap.add_argument("--table", type=Path, default=None,
                    help="print the tables of a results file and exit")
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.table:
        rows = read(args.table)
        stormy = any(r["kind"] == "summary" for r in rows)
        print(serve_storm.table(rows) if stormy else report(rows))
        return
    if args.storm:
        run_storm(args)
        return
    args.max_batch = args.max_batch or [1, 4, 16]
    args.precisions = args.precisions or ["fp32", "int4-g64-rtn-head8"]
    args.clients = args.clients or [1, 4, 16]
    args.out = args.out or Path("docs/results/serve-batch.jsonl")
    from specq.data import chat_prompts

    prompts = chat_prompts("held_out")
    cpu = build.cpu_model()
    servers = {}
    try:
        for batch in args.max_batch:
            server = ServerProcess(server_args(args.precisions, args.threads,
                                               max(args.clients) * 2, batch, args.spec_max_batch)
                                   ).wait()
            servers[batch] = (server.url, server)
        for url, _ in servers.values():  # untimed warm-up of every (model, mode)
            for precision in args.precisions:
                for mode in MODES:
                    run_round(url, {"mode": mode}, f"{TARGET}@{precision}", prompts, 2, 2, 8)
        rows = [{"kind": "run", "command": "python " + shlex.join(sys.argv),
                 "threads": args.threads, "precisions": args.precisions,
                 "max_batch": args.max_batch, "spec_max_batch": args.spec_max_batch,
                 "max_tokens": args.max_tokens, "requests": args.requests,
                 "repeats": args.repeats, "machine": platform.processor() or platform.machine(),
                 "time": time.strftime("%Y-%m-%d %H:%M:%S")}]
        before = {batch: spec_counters(url) for batch, (url, _) in servers.items()}
        order = list(args.max_batch)
        for repeat in range(args.repeats):
            for precision in args.precisions:
                for clients in args.clients:
                    for mode in args.modes:
                        for batch in order:
                            label = {"precision": precision, "clients": clients, "mode": mode,
                                     "max_batch": batch, "repeat": repeat}
                            rows += run_round(servers[batch][0], label, f"{TARGET}@{precision}",
                                              prompts, clients, max(args.requests, clients),
                                              args.max_tokens)
                            print(json.dumps(rows[-1]), flush=True)
                        order.reverse()
        for batch, (url, _) in servers.items():
            for (model, draft), now in spec_counters(url).items():
                was = before[batch].get((model, draft), {})
                rows.append({"kind": "metrics", "max_batch": batch, "model": model, "draft": draft}
                            | {k: v - was.get(k, 0) for k, v in now.items()})
    finally:
        for _, server in servers.values():
            server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps({**r, "cpu": cpu}) + "\n" for r in rows))
    print(report(read(args.out)))


if __name__ == "__main__":
    main()
