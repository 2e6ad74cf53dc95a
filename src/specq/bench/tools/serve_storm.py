"""`specq serve` under hostile load (tests/serve/test_serve_load.py and `bench_serve.py --storm`):
many concurrent streamed greedy chats, every few clients hanging up mid-stream, 429s of the
bounded queue asked again after their Retry-After, then a SIGKILL under load and a restart on the
same port. Every completed answer is compared with `specq generate`'s for the same target and
default draft; the server's memory is read from /proc before and after.

Rows (one results file, `bench_serve.py --storm`): "request" per client, "killed" per client
cut by the SIGKILL, "restarted" per answer after the restart, one "server" (memory, start times)
and one "summary" (`summary`).
"""

from __future__ import annotations

import asyncio
import importlib
import time
from dataclasses import asdict, dataclass

from .serve_load import MIB, ServerProcess, percentile


@dataclass(frozen=True)
class Storm:
    clients: int = 32  # concurrent streamed chats
    rounds: int = 2  # storms back to back: memory that grows from one to the next is kept
    max_tokens: int = 16  # per answer
    hang_up_every: int = 4  # every Nth client closes its stream after `hang_up_after` chunks
    hang_up_after: int = 2
    killed_clients: int = 4  # streams open when the server is killed
    # the answer's length (EOS ignored) for a client that hangs up or is cut by the kill: still
    # running when it goes, so the server must cancel it
    long_tokens: int = 512
    timeout_s: float = 600  # a client's whole wait, its 429s and their Retry-After included


def reference_answers(target: str, prompts: list[str], max_tokens: int) -> list[dict]:
    """What `specq generate --target TARGET --chat PROMPT --max-new-tokens N` prints for each
    prompt (greedy, the target's default draft): text and tokens. TARGET is `name@precision`."""
    from ...api import generate
    from ...loading.drafts.default import load_default
    from ...loading.kinds import load

    model = load(target)
    draft, _ = load_default(target, lambda ref: load(ref, target=model))
    outs = [generate(model, p, draft, chat=True, max_new_tokens=max_tokens) for p in prompts]
    return [{"text": o.text, "tokens": len(o.token_ids)} for o in outs]


async def chat(client, model: str, prompt: str, max_tokens: int, hang_up_after: int | None,
               timeout_s: float, started_streams: asyncio.Event | None = None,
               extra: dict | None = None) -> dict:
    """One client's streamed greedy chat, asked again after each 429 (until `timeout_s` passes);
    `hang_up_after`: close the stream after that many content chunks."""
    import openai

    first = time.perf_counter()
    rejected, pieces, ttft, tokens, error = 0, [], None, None, None
    messages = [{"role": "user", "content": prompt}]
    while True:
        started = time.perf_counter()
        try:
            stream = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                stream=True, stream_options={"include_usage": True}, extra_body=extra)
            break
        except openai.RateLimitError as e:
            rejected += 1
            if time.perf_counter() - first > timeout_s:
                return _row("rejected", first, started, ttft, pieces, tokens, rejected, str(e))
            await asyncio.sleep(float(e.response.headers.get("retry-after", 1)))
        except _lost() as e:
            return _row("error", first, started, ttft, pieces, tokens, rejected, _name(e))
    outcome = "completed"
    try:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft or time.perf_counter() - started
                pieces.append(chunk.choices[0].delta.content)
                if started_streams is not None:
                    started_streams.set()
                if hang_up_after is not None and len(pieces) >= hang_up_after:
                    await stream.close()
                    outcome = "disconnected"
                    break
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except _lost() as e:  # an error event, or the server gone
        outcome, error = "error", _name(e)
    return _row(outcome, first, started, ttft, pieces, tokens, rejected, error)


def _row(outcome: str, first: float, started: float, ttft: float | None, pieces: list[str],
         tokens: int | None, rejected: int, error: str | None) -> dict:
    now = time.perf_counter()
    return {"outcome": outcome, "rejected_429": rejected, "ttft_s": ttft,
            "latency_s": now - started,  # the attempt the server took
            "wait_s": now - first,  # the client's whole wait, its 429s included
            "text": "".join(pieces), "completion_tokens": tokens, "error": error}


def _lost() -> tuple[type[Exception], ...]:
    """What a request raises when the server fails it or goes away: openai's errors, and the HTTP
    library's own, which older openai clients let through from a stream."""
    import openai

    errors = [openai.APIError]
    for module in ("httpx", "httpx2"):
        try:
            errors.append(importlib.import_module(module).HTTPError)
        except ImportError:
            pass
    return tuple(errors)


def _name(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"[:300]


def _client(url: str, storm: Storm):
    import openai

    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                              timeout=storm.timeout_s)


async def storm_requests(url: str, model: str, prompts: list[str], storm: Storm) -> list[dict]:
    """`storm.clients` chats at once (client i asks prompts[i % len(prompts)]), every
    `hang_up_every`-th asking for a long answer and hanging up mid-stream."""
    async with _client(url, storm) as client:
        def hangs(i: int) -> int | None:
            every = storm.hang_up_every
            return storm.hang_up_after if every and i % every == every - 1 else None

        rows = await asyncio.gather(*(
            chat(client, model, prompts[i % len(prompts)], storm.long_tokens, hangs(i),
                 storm.timeout_s, extra={"ignore_eos": True}) if hangs(i) else
            chat(client, model, prompts[i % len(prompts)], storm.max_tokens, None, storm.timeout_s)
            for i in range(storm.clients)))
    return [{"kind": "request", "client": i, "prompt": i % len(prompts)} | row
            for i, row in enumerate(rows)]


async def kill_under_load(server: ServerProcess, model: str, prompts: list[str],
                          storm: Storm) -> list[dict]:
    """`storm.killed_clients` long streams; once one has text, SIGKILL the server. Each client
    must end (with an error), none may hang."""
    async with _client(server.url, storm) as client:
        streaming = asyncio.Event()
        tasks = [asyncio.create_task(chat(client, model, prompts[i % len(prompts)],
                                          storm.long_tokens, None, storm.timeout_s, streaming,
                                          {"ignore_eos": True}))
                 for i in range(storm.killed_clients)]
        await asyncio.wait_for(streaming.wait(), storm.timeout_s)
        killed = time.perf_counter()
        await asyncio.to_thread(server.kill)
        rows = await asyncio.gather(*tasks)
    return [{"kind": "killed", "client": i, "ended_after_kill_s": time.perf_counter() - killed}
            | row for i, row in enumerate(rows)]


async def ask_each(url: str, model: str, prompts: list[str], storm: Storm, kind: str
                   ) -> list[dict]:
    """One chat per prompt, all at once."""
    async with _client(url, storm) as client:
        rows = await asyncio.gather(*(chat(client, model, p, storm.max_tokens, None,
                                           storm.timeout_s) for p in prompts))
    return [{"kind": kind, "prompt": i} | row for i, row in enumerate(rows)]


def check_answers(rows: list[dict], references: list[dict]) -> None:
    """Mark every completed answer `equal` (text and token count) to its prompt's reference."""
    for row in rows:
        if row["outcome"] == "completed":
            want = references[row["prompt"]]
            row["equal"] = (row["text"], row["completion_tokens"]) == (want["text"],
                                                                       want["tokens"])


def run(args: list[str], model: str, prompts: list[str], target: str, storm: Storm
        ) -> list[dict]:
    """The whole scenario on `specq serve ARGS` (ARGS with `--port 0`; the restart takes the
    first server's port): start it, and while it loads compute the reference answers
    (`reference_answers` of `target`, its `name@precision`); one warm request, the storm's
    rounds (each with its peak memory), a last request, then a SIGKILL under load and a restart,
    and the answers after it."""
    server = ServerProcess(args)
    try:
        references = reference_answers(target, prompts, storm.max_tokens)
        first_start_s = server.wait().start_s
        asyncio.run(ask_each(server.url, model, prompts[:1], storm, "warm-up"))
        rss_warm = server.memory()["VmRSS"]
        rows, peaks, walls, peak_since_warm = [], [], [], True
        for round_ in range(storm.rounds):
            peak_since_warm &= server.reset_peak()
            began = time.perf_counter()
            rows += [r | {"round": round_} for r in
                     asyncio.run(storm_requests(server.url, model, prompts, storm))]
            walls.append(time.perf_counter() - began)
            peaks.append(server.memory()["VmHWM"])
        rss_after = server.memory()["VmRSS"]
        rows += asyncio.run(ask_each(server.url, model, prompts[:1], storm, "after"))
        counted = server_counts(server.url)
        rows += asyncio.run(kill_under_load(server, model, prompts, storm))
        port = server.port
        server = ServerProcess([*_without_port(args), "--port", str(port)]).wait()
        rows += asyncio.run(ask_each(server.url, model, prompts, storm, "restarted"))
    finally:
        server.stop()
    check_answers(rows, references)
    rows.append({"kind": "server", "start_s": first_start_s, "restart_s": server.start_s,
                 "storm_wall_s": walls, "rss_warm_bytes": rss_warm, "rss_after_bytes": rss_after,
                 "peak_rss_bytes": peaks,  # per round
                 "peak_since_warm": peak_since_warm, "storm": asdict(storm)} | counted)
    return rows + [summary(rows)]


def server_counts(url: str) -> dict[str, float]:
    """What the server counted (its /metrics): finished requests by reason (`finished_stop`,
    `finished_length`, `finished_abort`, ...) and refused ones (`rejected_queue_full`, ...)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "specq:request_success_total":
                key = f"finished_{s.labels['finished_reason']}"
            elif s.name == "specq:request_rejected_total":
                key = f"rejected_{s.labels['reason']}"
            else:
                continue
            out[key] = out.get(key, 0) + s.value
    return out


def _without_port(args: list[str]) -> list[str]:
    i = args.index("--port")
    return args[:i] + args[i + 2:]


def summary(rows: list[dict]) -> dict:
    """The storm's counts over its rounds (by outcome, 429s, equal answers), latency and time to
    first token percentiles of its completed requests, the memory, and what the kill and restart
    left."""
    storm = [r for r in rows if r["kind"] == "request"]
    done = [r for r in storm if r["outcome"] == "completed"]
    checked = [r for r in rows if r.get("outcome") == "completed"]  # the storm's and after it
    server = next(r for r in rows if r["kind"] == "server")

    def pcts(key: str) -> dict:
        values = [r[key] for r in done if r[key] is not None]
        return {f"{key}_p{q}": percentile(values, q) if values else None for q in (50, 95, 99)}

    counts = {o: sum(r["outcome"] == o for r in storm)
              for o in ("completed", "disconnected", "rejected", "error")}
    return {"kind": "summary", "clients": server["storm"]["clients"],
            "rounds": server["storm"]["rounds"], "requests": len(storm), **counts,
            "responses_429": sum(r["rejected_429"] for r in storm),
            # the server's own counts: 429s it sent, generations a hang-up cancelled
            "server_429": server.get("rejected_queue_full", 0),
            "server_aborted": server.get("finished_abort", 0),
            "completed_all": len(checked), "equal": sum(r.get("equal", False) for r in checked),
            **pcts("latency_s"), **pcts("ttft_s"), **pcts("wait_s"),
            "peak_rss_mib": max(server["peak_rss_bytes"]) / MIB,
            "round_peaks_mib": [b / MIB for b in server["peak_rss_bytes"]],
            "rss_warm_mib": server["rss_warm_bytes"] / MIB,
            "rss_after_mib": server["rss_after_bytes"] / MIB,
            "killed_clients_ended": sum(r["kind"] == "killed" and r["outcome"] == "error"
                                        for r in rows),
            "restarted_equal": sum(r.get("equal", False) for r in rows
                                   if r["kind"] == "restarted")}


def table(rows: list[dict]) -> str:
    """One line per results file's run (its summary): the requests' outcomes over its rounds,
    the 429s, the equal answers, latency and time to first token of the completed, memory (the
    peak of each round), and the restart."""
    lines = ["| target | clients x rounds | completed | hung up (cancelled) | 429s | "
             "equal to generate | latency p50 / p95 / p99 (s) | TTFT p50 / p95 (s) | "
             "resident after warm-up / peak per round | restart |", "|" + "---|" * 10]
    runs = [r for r in rows if r["kind"] == "run"]
    for run_row, s, server in zip(runs, (r for r in rows if r["kind"] == "summary"),
                                  (r for r in rows if r["kind"] == "server")):
        lines.append(
            f"| {run_row['target']} | {s['clients']} x {s['rounds']} | {s['completed']} | "
            f"{s['disconnected']} "
            f"({s['server_aborted']:.0f}) | {s['responses_429']} | {s['equal']} of "
            f"{s['completed_all']} | {s['latency_s_p50']:.2f} / {s['latency_s_p95']:.2f} / "
            f"{s['latency_s_p99']:.2f} | {s['ttft_s_p50']:.2f} / {s['ttft_s_p95']:.2f} | "
            f"{s['rss_warm_mib']:.0f} / "
            f"{', '.join(f'{p:.0f}' for p in s['round_peaks_mib'])} MiB | "
            f"{server['restart_s']:.1f} s |")
    return "\n".join(lines)
