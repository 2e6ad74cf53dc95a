"""Prometheus metrics, named as vLLM names them where vLLM has the metric (prefix `specq:`), so
dashboards built for vLLM's speculative decoding read specq too. Labels: `model`
(target@precision) and `draft` (the draft ref, or `none` for plain decoding).

Derived, as in vLLM: acceptance rate = accepted / draft tokens; mean acceptance length (drafting
steps only) = 1 + accepted / num_drafts; specq's tau (every target pass, bonus token included) =
(accepted + decode steps) / decode steps; generation tokens/s = rate(generation_tokens_total).
"""

from __future__ import annotations

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest)

from ..core.stats import DecodeStats

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
REQUEST = ("model", "draft")


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = CollectorRegistry()  # one per app: tests run several apps in one process
        r = self.registry
        self.running = Gauge("specq:num_requests_running", "Requests generating now.", ["model"],
                             registry=r)
        self.waiting = Gauge("specq:num_requests_waiting", "Requests queued.", ["model"],
                             registry=r)
        self.rejected = Counter("specq:request_rejected",
                                "Requests that ended before running (queue_full, timeout, "
                                "abort: the client left while it waited).",
                                ["model", "reason"], registry=r)
        self.finished = Counter("specq:request_success",
                                "Finished requests by reason (stop, length, abort, "
                                "timeout).", [*REQUEST, "finished_reason"], registry=r)
        self.prompt_tokens = Counter("specq:prompt_tokens", "Prompt tokens prefilled.", REQUEST,
                                     registry=r)
        self.generation_tokens = Counter("specq:generation_tokens", "Tokens generated.", REQUEST,
                                         registry=r)
        self.steps = Counter("specq:decode_steps",
                             "Target forward passes after prefill (verify steps).", REQUEST,
                             registry=r)
        self.drafts = Counter("specq:spec_decode_num_drafts",
                              "Verify steps that checked a proposal.", REQUEST, registry=r)
        self.draft_tokens = Counter("specq:spec_decode_num_draft_tokens",
                                    "Draft tokens proposed.", REQUEST, registry=r)
        self.accepted = Counter("specq:spec_decode_num_accepted_tokens",
                                "Draft tokens accepted.", REQUEST, registry=r)
        self.accepted_per_pos = Counter("specq:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted draft tokens per position (depth of a tree), "
                                        "from 0.",
                                        [*REQUEST, "position"], registry=r)
        self.latency = Histogram("specq:e2e_request_latency_seconds",
                                 "Arrival to last token.", REQUEST, buckets=LATENCY_BUCKETS,
                                 registry=r)
        self.queue_time = Histogram("specq:request_queue_time_seconds",
                                    "Arrival to start of generation.", REQUEST,
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("specq:time_to_first_token_seconds",
                              "Arrival to first token.", REQUEST, buckets=LATENCY_BUCKETS,
                              registry=r)
        self.tpot = Histogram("specq:time_per_output_token_seconds",
                              "Decode time per token after the first.", REQUEST,
                              buckets=TOKEN_BUCKETS, registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def record(self, model: str, draft: str | None, reason: str, stats: DecodeStats,
               latency_s: float, queue_s: float, ttft_s: float | None) -> None:
        """One finished generation (also an aborted or timed-out one: its tokens were computed)."""
        labels = dict(model=model, draft=draft or "none")
        self.finished.labels(**labels, finished_reason=reason).inc()
        self.prompt_tokens.labels(**labels).inc(stats.prompt_tokens)
        self.generation_tokens.labels(**labels).inc(stats.new_tokens)
        self.steps.labels(**labels).inc(stats.steps)
        self.drafts.labels(**labels).inc(stats.drafted_at[0] if stats.drafted_at else 0)
        self.draft_tokens.labels(**labels).inc(stats.drafted)
        self.accepted.labels(**labels).inc(stats.accepted)
        for position, count in enumerate(stats.accepted_at):
            self.accepted_per_pos.labels(**labels, position=str(position)).inc(count)
        self.latency.labels(**labels).observe(latency_s)
        self.queue_time.labels(**labels).observe(queue_s)
        if ttft_s is not None:
            self.ttft.labels(**labels).observe(ttft_s)
        if stats.new_tokens > 1 and stats.decode_s > 0:
            self.tpot.labels(**labels).observe(stats.decode_s / (stats.new_tokens - 1))
