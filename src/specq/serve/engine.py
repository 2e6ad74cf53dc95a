"""One served model (a target at one precision): a bounded queue and one worker thread that
decodes up to `max_batch` requests together (continuous batching).

Each iteration the worker takes waiting requests while there is room (prefilling each on its
own), then advances every running request by one decoding step in one stacked target pass
(`decode.step`: each request drafts, accepts and rolls back on its own, so its output is what
`specq generate` gives it alone); a finished request leaves and a waiting one takes its place at
the next iteration. `max_batch` 1 runs requests one at a time, in arrival order. The models of
one server compute at the same time.

The worker owns the model and its tokenizer: prompts are encoded, generated and decoded on that
thread only. It talks to a request's event loop through `Job.post`; the event loop talks back
through two flags read after every decoding step: the client went away (`cancel`), or the
request outlived the server's timeout. A request whose client leaves while it waits gives its
place in the queue to the next request (a queue full of abandoned requests would turn live ones
away).

Each request drafts from, and when it ends joins, the earlier requests of its API key
(`ModelPool.suffix_cache`), except a sampled request with its own seed, which only joins them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field

from .. import api
from ..core.decode import Sequence, step
from ..core.gamma import parse as parse_gamma
from ..core.prompt import check_context, encode_prompt, token_ids
from ..core.types import Model
from ..drafters.lookahead import LookaheadDraft
from ..drafters.ngram import NgramDraft
from ..drafters.suffix import SuffixCache
from ..errors import SpecqError
from .errors import APIError, bad_request
from .metrics import Metrics
from .options import CHAT_MAX_TOKENS, REGISTRY, Plan
from .pool import ModelPool
from .text import TextStream

log = logging.getLogger("specq.serve")
RETRY_AFTER_S = 1


@dataclass
class Job:
    plan: Plan
    loop: asyncio.AbstractEventLoop
    deadline: float  # time.monotonic() after which the request is abandoned
    key: str = ""  # the API key it came with: whose earlier requests it drafts from
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None  # time.monotonic() of its first token
    cancelled: bool = False
    timed_out: bool = False

    def post(self, *event) -> None:
        """Hand an event to the request's event loop: ("text", delta), ("done", Generation, last
        delta) or ("error", APIError). A loop that has closed (server
        shutting down) gets nothing."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            pass

    def cancel(self) -> None:
        self.cancelled = True

    def keep_going(self) -> bool:
        if time.monotonic() > self.deadline:
            self.timed_out = True
        return not (self.cancelled or self.timed_out)


@dataclass
class Running:
    """A request being decoded."""

    job: Job
    sequence: Sequence
    draft: Model | NgramDraft | LookaheadDraft | None
    text: TextStream | None  # streamed requests only
    started: float  # time.monotonic() when it left the queue
    suffix_cache: SuffixCache | None  # its key's earlier requests, which it joins when it ends
    error: APIError | None = None  # it failed while stepping

    @property
    def finished(self) -> bool:
        return self.error is not None or self.sequence.done


class Engine:
    def __init__(self, name: str, pool: ModelPool, precision: str, metrics: Metrics,
                 queue_size: int, timeout_s: float, max_batch: int, spec_max_batch: int | None):
        self.name, self.pool, self.precision = name, pool, precision
        self.target, self.draft, self.note = pool.models(precision)
        self.gamma_memory = pool.gamma_memory(precision)  # gamma auto's, across requests
        self.metrics, self.timeout_s, self.max_batch = metrics, timeout_s, max_batch
        self.spec_max_batch = spec_max_batch  # larger steps decode plainly; None: always speculate
        self.queue_size = queue_size
        self.waiting: collections.deque[Job] = collections.deque()  # guarded by self.changed
        self.changed = threading.Condition()  # a job was queued, or the server stops
        self.stopping = False
        self.thread = threading.Thread(target=self._work, name=f"specq-serve {name}", daemon=True)
        self.running: list[Running] = []
        for gauge in (metrics.running, metrics.waiting):
            gauge.labels(model=name).set(0)

    def start(self) -> None:
        """Warm up (first calls pay for allocation and lazy initialisation, a batched step for
        probing which row counts the kernels stack exactly), then take requests."""
        hello = encode_prompt(self.target, "Hello")
        warm = [api.start(self.target, hello, self.draft, max_new_tokens=4,
                          gamma_memory=self.gamma_memory) for _ in range(min(2, self.max_batch))]
        for sequence in warm:
            sequence.prefill()
        while live := [s for s in warm if not s.done]:
            step(live)
        self.thread.start()

    def stop(self) -> None:
        """Refuse what is queued, cancel what runs, end the worker."""
        with self.changed:
            self.stopping = True
            refused, self.waiting = list(self.waiting), collections.deque()
            self.changed.notify()
        for job in refused:
            job.post("error", APIError(503, "the server is shutting down", type="server_error"))
        for running in list(self.running):
            running.job.cancel()

    def new_job(self, plan: Plan, key: str = "") -> Job:
        return Job(plan=plan, loop=asyncio.get_running_loop(),
                   deadline=time.monotonic() + self.timeout_s, key=key)

    def submit(self, job: Job) -> None:
        with self.changed:
            if len(self.waiting) >= self.queue_size:
                self._drop_abandoned()
            if len(self.waiting) >= self.queue_size:
                self.metrics.rejected.labels(model=self.name, reason="queue_full").inc()
                raise APIError(429, f"the queue of '{self.name}' is full ({self.queue_size} "
                                    "waiting): retry later",
                               type="rate_limit_error", code="queue_full",
                               headers={"Retry-After": str(RETRY_AFTER_S)})
            self.waiting.append(job)
            self.metrics.waiting.labels(model=self.name).inc()
            self.changed.notify()

    def _drop_abandoned(self) -> None:
        """Forget the waiting jobs whose clients have left (the caller holds `changed`)."""
        kept = collections.deque(job for job in self.waiting if not job.cancelled)
        for _ in range(len(self.waiting) - len(kept)):
            self._left_waiting()
        self.waiting = kept

    def _left_waiting(self) -> None:
        self.metrics.waiting.labels(model=self.name).dec()
        self.metrics.rejected.labels(model=self.name, reason="abort").inc()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def _work(self) -> None:
        """Admit, step everything running together, let the finished go; until `stop`. Nothing
        here outlives an iteration: a finished request is freed as it leaves (its caches are
        large, and a reference this frame kept would hold them while the server waits)."""
        while self._admit():
            self._step([r for r in self.running if not r.finished])
            self._end_finished()

    def _end_finished(self) -> None:
        finished = [r for r in self.running if r.finished]
        self.running = [r for r in self.running if not r.finished]
        for running in finished:
            self._end(running)

    def _admit(self) -> bool:
        """Start waiting jobs while fewer than max_batch run (waiting for one when none runs);
        False once the server stops."""
        while len(self.running) < self.max_batch:
            with self.changed:
                while not (self.waiting or self.running or self.stopping):
                    self.changed.wait()
                if self.stopping:
                    return False
                if not self.waiting:
                    return True
                job = self.waiting.popleft()
            if job.cancelled:
                self._left_waiting()
                continue
            self.metrics.waiting.labels(model=self.name).dec()
            if not job.keep_going():
                self.metrics.rejected.labels(model=self.name, reason="timeout").inc()
                job.post("error", _timeout(self.timeout_s))
                continue
            try:
                self.running.append(self._start(job))
            except Exception as e:
                job.post("error", _error(e))
                continue
            self.metrics.running.labels(model=self.name).inc()
        return True

    def _start(self, job: Job) -> Running:
        """Build the request's sequence and prefill it (its first token is streamed at once)."""
        plan, started = job.plan, time.monotonic()
        draft = self._draft(plan.draft)
        ids = self._prompt_ids(plan)
        nodes = 0 if draft is None else (plan.options["tree"].size if plan.options["tree"] else
                                         parse_gamma(plan.options["gamma"])[0])
        if isinstance(draft, NgramDraft):  # its k may be longer than gamma
            nodes = max(nodes, draft.k)
        if isinstance(draft, LookaheadDraft):  # its window and n-grams, whatever the gamma
            nodes = draft.nodes(draft.depth)
        max_tokens = plan.max_tokens or self._room(len(ids), nodes)
        text = TextStream(self.target.tokenizer, plan.options["stop"]) if plan.stream else None

        # the sequence holds this: it must not hold the `Running` that holds the sequence (a
        # reference cycle keeps the request's caches alive until the garbage collector's next
        # full pass, which a server with large models loaded seldom makes)
        def on_tokens(new: list[int]) -> bool:
            job.first_token_at = job.first_token_at or time.monotonic()
            if text:
                job.post("text", text.push(new))
            return job.keep_going()

        earlier = self.pool.suffix_cache(self.precision, job.key)
        sequence = api.start(self.target, ids, draft, max_new_tokens=max_tokens,
                             on_tokens=on_tokens, gamma_memory=self.gamma_memory,
                             suffix_cache=None if plan.repeatable else earlier, **plan.options)
        sequence.prefill()
        return Running(job, sequence, draft, text, started, earlier)

    def _step(self, running: list[Running]) -> None:
        if not running:
            return
        try:
            step([r.sequence for r in running],
                 speculate=self.spec_max_batch is None or len(running) <= self.spec_max_batch)
        except Exception as e:  # a bug: these requests fail, the server stays up
            error = _error(e)
            for r in running:
                r.error = error

    def _end(self, running: Running) -> None:
        """Report a finished request: its metrics, then its response (or error) to the client."""
        self.metrics.running.labels(model=self.name).dec()
        job = running.job
        if running.error is not None:
            job.post("error", running.error)
            return
        try:
            out = api.finish(running.sequence, running.draft, running.suffix_cache)
        except Exception as e:  # a bug: this request fails, the server stays up
            job.post("error", _error(e))
            return
        reason = (("timeout" if job.timed_out else "abort") if out.finish_reason == "cancelled" else
                  ("length" if out.finish_reason == "length" else "stop"))
        self.metrics.record(self.name, running.draft.ref if running.draft else None, reason,
                            out.stats, time.monotonic() - job.arrived,
                            running.started - job.arrived, job.first_token_at - job.arrived
                            if job.first_token_at else None)
        if job.timed_out:
            job.post("error", _timeout(self.timeout_s))
        elif not job.cancelled:
            job.post("done", out, running.text.finish(out.text) if running.text else "")

    def _draft(self, choice: str | None) -> Model | NgramDraft | LookaheadDraft | None:
        if choice == REGISTRY:
            return self.draft
        return None if choice is None else self.pool.draft_model(self.precision, choice)

    def _prompt_ids(self, plan: Plan) -> list[int]:
        if not plan.chat:
            prompt = plan.prompt
            return token_ids(self.target, prompt) if isinstance(prompt, list) else \
                encode_prompt(self.target, prompt)
        tokenizer = self.target.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise APIError(400, f"model '{self.name}' has no chat template: use /v1/completions",
                           param="model")
        ids = tokenizer.apply_chat_template(plan.prompt, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def _room(self, prompt_len: int, nodes: int) -> int:
        """A chat without max_tokens: up to the context, at most CHAT_MAX_TOKENS."""
        limit = (getattr(self.target.net.config, "max_position_embeddings", None)
                 or prompt_len + CHAT_MAX_TOKENS)
        room = min(CHAT_MAX_TOKENS, limit - prompt_len - nodes - 1)
        if room < 1:
            check_context(self.target, nodes, 1, prompt_len)  # raises: the prompt fills the context
        return max(room, 1)


def _error(e: Exception) -> APIError:
    """What a request that failed gets: a 4xx for bad input, a 500 for a bug (logged)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, SpecqError):
        return bad_request(e)
    log.exception("generation failed")
    return APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")


def _timeout(timeout_s: float) -> APIError:
    return APIError(504, f"the request took longer than the server's timeout of {timeout_s:g} s",
                    type="timeout_error", code="timeout")
