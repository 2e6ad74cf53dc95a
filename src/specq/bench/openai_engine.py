"""A server that speaks the OpenAI API, measured from outside (`engine = "openai"`): vLLM,
llama-server, `specq serve`, or any other.

Every request streams, so the time to the first token and between tokens are the client's view
(HTTP included). Drafted and accepted tokens are the change of the engine's Prometheus counters
(`/metrics`) around each request, under vLLM's names with any prefix (`vllm:`, `llamacpp:`,
`specq:`), so requests run one at a time and nothing else may use the server meanwhile; where an
engine has no such counters, the response's own counts (llama-server's `timings.draft_n`, specq's
`specq`) are used. Token ids are read where the response carries them (vLLM's `token_ids` with
`return_token_ids`, llama-server's `logprobs.content[].id`); otherwise outputs are compared as text.

The standard library's HTTP client: nothing beyond it is needed, the raw stream keeps each engine's
own fields, and it never retries a request on its own (a retried request would count twice).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from ..core.stats import DecodeStats
from ..errors import SpecqError
from .engines import Result
from .prompts import Prompt
from .servers import Server, error_message, get

REQUEST_TIMEOUT_S = 3600.0
SETTLE_S = 5.0  # how long the counters may lag behind the response (vLLM updates them after it)
# counter names after the engine's prefix, as vLLM names them
COUNTERS = {"drafts": "spec_decode_num_drafts_total",
            "drafted": "spec_decode_num_draft_tokens_total",
            "accepted": "spec_decode_num_accepted_tokens_total",
            "per_pos": "spec_decode_num_accepted_tokens_per_pos_total",
            "generated": ("generation_tokens_total", "tokens_predicted_total"),
            "steps": "decode_steps_total"}  # specq's own: target passes after prefill
_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{.*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class Counters:
    """The speculative-decoding counters of one /metrics page, summed over their label sets."""

    drafts: float | None = None
    drafted: float | None = None
    accepted: float | None = None
    per_pos: dict[int, float] | None = None
    generated: float | None = None
    steps: float | None = None

    def minus(self, before: Counters) -> Counters:
        sub = lambda a, b: None if a is None or b is None else a - b  # noqa: E731
        per_pos = None if self.per_pos is None else {
            i: v - (before.per_pos or {}).get(i, 0.0) for i, v in self.per_pos.items()}
        return Counters(*(sub(getattr(self, k), getattr(before, k))
                          for k in ("drafts", "drafted", "accepted")), per_pos,
                        sub(self.generated, before.generated), sub(self.steps, before.steps))


def parse_metrics(text: str) -> Counters:
    """The counters of a Prometheus text page; a tolerant reader (names, labels and value of each
    sample line; comments and anything unreadable skipped)."""
    out = Counters()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        name = match.group(1).split(":", 1)[-1]
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        for field, names in COUNTERS.items():
            if name not in ((names,) if isinstance(names, str) else names):
                continue
            if field == "per_pos":
                labels = dict(_LABEL.findall(match.group(2) or ""))
                if labels.get("position", "").isdigit():
                    out.per_pos = out.per_pos or {}
                    position = int(labels["position"])
                    out.per_pos[position] = out.per_pos.get(position, 0.0) + value
            else:
                setattr(out, field, (getattr(out, field) or 0.0) + value)
    return out


def counters(server: Server) -> Counters | None:
    status, body = get(f"{server.url}/metrics", server.key())
    return parse_metrics(body.decode(errors="replace")) if status == 200 else None


def served_model(server: Server) -> str:
    """The request's model: the configured one, else the first the server lists."""
    if server.model:
        return server.model
    status, body = get(f"{server.url}/v1/models", server.key())
    try:
        return json.loads(body)["data"][0]["id"]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError):
        raise SpecqError(f"server '{server.name}': /v1/models (HTTP {status}) lists no model; "
                         "give 'model'") from None


class OpenAIEngine:
    """One server entry; greedy when `temperature` is 0. `ignore_eos` is sent only when true (an
    extension vLLM, llama-server and specq serve take)."""

    def __init__(self, server: Server, temperature: float, seed: int, ignore_eos: bool):
        self.server, self.temperature, self.seed, self.ignore_eos = (server, temperature, seed,
                                                                     ignore_eos)
        self.model = served_model(server)

    def request_body(self, prompt: Prompt, max_tokens: int) -> dict:
        body = {"model": self.model, "max_tokens": max_tokens, "temperature": self.temperature,
                "seed": self.seed, "stream": True, "stream_options": {"include_usage": True}}
        if prompt.chat:
            body["messages"] = [{"role": "user", "content": prompt.text}]
        else:
            body["prompt"] = prompt.text
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body | self.server.body

    def generate(self, prompt: Prompt, max_tokens: int, repeat: int = 0) -> Result:
        before = counters(self.server)
        stream = self.stream(prompt, max_tokens)
        after = self.settled(before, stream.usage.get("completion_tokens"))
        return stream.result(after.minus(before) if before and after else None, self.server.gamma)

    def settled(self, before: Counters | None, tokens: int | None) -> Counters | None:
        """The counters once they count this request's tokens (when the engine counts them)."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            after = counters(self.server)
            if (before is None or after is None or tokens is None or after.generated is None
                    or after.generated - (before.generated or 0.0) >= tokens
                    or time.monotonic() > deadline):
                return after
            time.sleep(0.02)

    def stream(self, prompt: Prompt, max_tokens: int) -> Stream:
        path = "/v1/chat/completions" if prompt.chat else "/v1/completions"
        key = self.server.key()
        request = urllib.request.Request(
            self.server.url + path, json.dumps(self.request_body(prompt, max_tokens)).encode(),
            {"Content-Type": "application/json", "Accept": "text/event-stream"}
            | ({"Authorization": f"Bearer {key}"} if key else {}))
        out = Stream(time.perf_counter())
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                for line in response:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    out.add(json.loads(data), time.perf_counter(), self.server.name)
            out.ended = time.perf_counter()
        except urllib.error.HTTPError as e:
            raise SpecqError(f"server '{self.server.name}': {path} answered HTTP {e.code}: "
                             f"{error_message(e.read())}") from None
        except (urllib.error.URLError, OSError) as e:
            raise SpecqError(f"server '{self.server.name}': {path} failed: "
                             f"{getattr(e, 'reason', e)}") from None
        except json.JSONDecodeError:
            raise SpecqError(f"server '{self.server.name}': {path} sent an event that is not "
                             "JSON") from None
        return out


class Stream:
    """What one streamed response said, as it arrived."""

    def __init__(self, sent: float):
        self.sent = sent
        self.ended = sent
        self.first: float | None = None
        self.last: float | None = None
        self.parts: list[str] = []
        self.ids: list[int] = []
        self.ids_known = True  # every chunk with text carried its token ids
        self.finish_reason = "length"
        self.usage: dict = {}
        self.reported: dict = {}  # the engine's own counts: llama-server's timings, specq's stats

    def add(self, event: dict, now: float, name: str) -> None:
        if "error" in event:
            error = event["error"]
            raise SpecqError(f"server '{name}': the stream ended in an error: "
                             f"{error.get('message', error) if isinstance(error, dict) else error}")
        for key in ("timings", "specq"):
            if isinstance(event.get(key), dict):
                self.reported[key] = event[key]
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        for choice in event.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            ids = _token_ids(choice)
            if text or ids:
                self.first = self.first or now
                self.last = now
                self.parts.append(text)
                if ids is None:
                    self.ids_known = False
                else:
                    self.ids += ids
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def result(self, delta: Counters | None, gamma: int | None) -> Result:
        """The stream as the store keeps a run: its timings and counts in a DecodeStats."""
        ids = self.ids if self.ids_known and self.ids else []
        # without usage: the ids, llama-server's own count, else a token per chunk with text
        new = (self.usage.get("completion_tokens") or len(ids)
               or self.reported.get("timings", {}).get("predicted_n") or len(self.parts))
        first = self.first or self.ended  # no token at all: all of it was waiting
        last = self.last or first
        stats = DecodeStats(prompt_tokens=self.usage.get("prompt_tokens") or 0, new_tokens=new,
                            prefill_s=first - self.sent, decode_s=last - first)
        source = _count(stats, delta, self.reported, gamma)
        extra = {"acceptance_source": source} | ({"reported": self.reported}
                                                 if self.reported else {})
        return Result(ids, "".join(self.parts), self.finish_reason, stats, extra)


def _token_ids(choice: dict) -> list[int] | None:
    """The chunk's token ids: vLLM's `token_ids`, or the ids in llama-server's logprobs."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(type(t) is int for t in ids):
        return ids
    content = (choice.get("logprobs") or {}).get("content") if isinstance(
        choice.get("logprobs"), dict) else None
    if isinstance(content, list) and content and all(
            isinstance(c, dict) and type(c.get("id")) is int for c in content):
        return [c["id"] for c in content]
    return None


def _count(stats: DecodeStats, delta: Counters | None, reported: dict,
           gamma: int | None) -> str | None:
    """Fill the step and acceptance counts of `stats` from the metrics' change, else from the
    response's own counts; returns where they came from (None: nowhere, so no steps counted).

    A step emits its accepted tokens and one more, and the first token comes from prefill, so
    steps = new tokens - 1 - accepted where the engine does not count its steps. Per position, as
    vLLM reports it: accepted at position i over all drafting steps (a step that drafted fewer
    tokens counts as rejected at the positions it did not draft)."""
    drafts = accepted_at = None
    source = None
    if delta is not None and delta.drafted is not None and delta.accepted is not None:
        source, drafted, accepted, drafts, steps = ("metrics", delta.drafted, delta.accepted,
                                                    delta.drafts, delta.steps)
        accepted_at = [delta.per_pos.get(i, 0.0) for i in range(max(delta.per_pos) + 1)] \
            if delta.per_pos else None
    elif "draft_n" in reported.get("timings", {}):  # llama-server
        source, drafted, accepted, steps = ("response", reported["timings"]["draft_n"],
                                            reported["timings"].get("draft_n_accepted", 0), None)
    elif "drafted" in reported.get("specq", {}):  # specq serve
        specq = reported["specq"]
        source, drafted, accepted, steps = ("response", specq["drafted"], specq["accepted"],
                                            specq.get("steps"))
    else:  # unknown: no steps, so no acceptance or tau either
        drafted = accepted = steps = 0
    stats.drafted, stats.accepted = int(drafted), int(accepted)
    stats.steps = int(steps) if steps is not None else max(0, stats.new_tokens - 1 - stats.accepted)
    stats.emitted = stats.steps + stats.accepted
    positions = max(gamma or 0, len(accepted_at or []))
    if drafts is not None and positions and drafted:
        accepted_at = [int(a) for a in accepted_at or []] + [0] * positions
        stats.gamma = positions
        stats.accepted_at = accepted_at[:positions]
        stats.drafted_at = [int(drafts)] * positions
        stats.reached_at = [int(drafts)] + stats.accepted_at[:-1]
    return source
