"""The server load tests' shared parts (benchmarks/bench_serve.py and tests/serve): `specq serve`
run as a subprocess with its memory read from /proc, and the batching sweep's tables: tokens/s,
latency and time to first token per (precision, clients, mode) and --max-batch, and acceptance
per server."""

from __future__ import annotations

import collections
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

CELL = ("precision", "clients", "mode")
MIB = 2**20


class ServerProcess:
    """`python -m specq.cli serve ARGS` in a subprocess, ready once uvicorn's start-up completes
    (models loaded and warmed up); its log is drained on a thread (the last lines kept for the
    error of a server that did not start)."""

    def __init__(self, args: list[str], env: dict | None = None):
        """Start it; `wait` for it to take requests (the caller may work meanwhile)."""
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "specq.cli", "serve", *args],
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.url: str | None = None
        self.start_s: float | None = None  # the command's start to its first request
        self.log: collections.deque[str] = collections.deque(maxlen=40)
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def wait(self, timeout_s: float = 900) -> ServerProcess:
        while not self._ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() - self.started > timeout_s:
                self.stop()
                raise RuntimeError("specq serve did not start:\n" + "".join(self.log))
        self.start_s = self.start_s or time.monotonic() - self.started
        return self

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            if m := re.search(r" on (http://\S+)", line):
                self.url = m.group(1)
            if "startup complete" in line and self.url:
                self._ready.set()

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def memory(self) -> dict[str, int]:
        """VmRSS (resident now) and VmHWM (its peak since start or `reset_peak`), in bytes."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)
                    if k in ("VmRSS", "VmHWM")}

    def reset_peak(self) -> bool:
        """Start VmHWM over from the resident size now (Linux's clear_refs 5); False where
        the kernel refuses (the peak then includes loading)."""
        try:
            with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL, as the kernel's out-of-memory killer or a crash ends it: nothing runs after."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()



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
    for m in (r for r in rows if r["kind"] == "metrics" and r["draft"] != "none"
              and r["specq:spec_decode_num_draft_tokens_total"]):  # not a plain-only sweep
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
