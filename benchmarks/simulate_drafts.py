"""Replay drafting policies against cached greedy outputs, without running a model: predicted
target passes, rows per pass, draft-model steps and time, per policy and prompt kind.

    python benchmarks/simulate_drafts.py --trace TRACES.jsonl [--prompts 8] [--tokens 512]
        [--sets chat code edit]      # once: the models' outputs (minutes on 2 cores; resumes)
    python benchmarks/simulate_drafts.py TRACES.jsonl [--tokens 128 512] [--costs flat|steep]
        [--sets chat code edit] [--policies NAME ...]    # a Markdown table, in seconds

TRACES.jsonl: one line per prompt of the bench's sets: the Qwen2.5-Coder 1.5B Q4_K_M file's
greedy output (EOS ignored, as the bench runs), and its 0.5B int4-head32k draft teacher-forced
along prompt + output in one pass: `prompt_ids`, `output`, `draft_argmax` (the draft's greedy
token after each position of prompt + output, from its narrowed head as a greedy chain drafts)
and `draft_conf` (its probability). A shorter run is a prefix of a longer one.

specq's own loop (`core.decode.Sequence`), gamma auto, the n-gram lookup and the routing run
unchanged; only the models are replaced: the target by one whose logits pick the cached output
wherever the verified rows followed it, the draft model by one that proposes its teacher-forced
tokens (exact while its proposal follows the output; past its first wrong token its confidence
is taken from the output's positions), and the clock by a virtual one that each pass advances
by a cost model (per row count of the target's verify pass, per row count of the draft's
forward, per prompt token of each prefill; `COSTS`). A run's time is
prefill + decode, as the bench's tokens per second; the speedup is over plain decoding of the
same prompt under the same costs. One `GammaMemory` per policy carries across the cells in the
bench's order (per length, then per set, as given), each cell after an untimed warm-up run.

A model of the machine, not a measurement: it ranks policies and says where the time goes; the
bench says how fast. Replaying the default before copies (`ngram:...:c=0+0.5B`) predicts the
measured cells of docs/results/default-draft.jsonl within a few percent on chat and edit, and
above them on code.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specq.core import decode as decode_module
from specq.core import gamma as gamma_module
from specq.core.gamma import AUTO_MAX_GAMMA, CostAwareGamma, GammaMemory
from specq.core.decode import Sequence, run
from specq.core.types import Proposal
from specq.drafters import ngram
from specq.drafters.fallback import FallbackDrafter

WARMUP_TOKENS = 8  # the bench's untimed first run of a cell (`bench.runner.WARMUP_TOKENS`)

# Costs in ms, read from the AMD EPYC Zen 4 VM's results files (2 threads): the bench's plain step
# of the 1.5B Q4_K_M file (verify_s / steps of the plain cells in default-draft*.jsonl, a pass and
# its acceptance), its N-row passes relative to that (flat: fitted to the speculative cells'
# verify_s against their paired plain runs, rows 1-8; steep: llamacpp-coder.jsonl's specq
# 'forward N' rows, 16 rows at 3.6x one), the 0.5B int4-head32k's draft step relative to it
# (draft_s / drafted of the model route) and its N-row forwards (step-profile-coder.jsonl,
# llamacpp-coder.jsonl), and the prefills (prefill_s of the plain and speculative runs).
COSTS = {
    "flat": {"step": 33.0, "rows": {1: 1.0, 2: 1.03, 3: 1.1, 4: 1.17, 5: 1.25, 8: 1.5, 16: 2.9,
                                    32: 5.6, 65: 11.2}},
    "steep": {"step": 33.0, "rows": {1: 1.0, 2: 1.07, 4: 1.23, 8: 1.97, 16: 3.65, 32: 7.0,
                                     65: 14.0}},
}
DRAFT_STEP = 0.22  # of a plain target step
DRAFT_ROWS = {1: 1.0, 2: 1.05, 4: 1.15, 8: 1.6, 16: 2.6, 32: 4.6, 64: 8.6, 4096: 550.0}
TARGET_PREFILL = (35.0, 5.2)  # ms: fixed, per prompt token
DRAFT_PREFILL = (0.0, 1.75)
OTHER = 0.6  # ms of the loop's own work per step


def interpolate(table: dict[int, float], n: float) -> float:
    keys = sorted(table)
    if n <= keys[0]:
        return table[keys[0]]
    for lo, hi in zip(keys, keys[1:]):
        if n <= hi:
            return table[lo] + (n - lo) / (hi - lo) * (table[hi] - table[lo])
    lo, hi = keys[-2], keys[-1]
    return table[hi] + (n - hi) * (table[hi] - table[lo]) / (hi - lo)


class Clock:
    """The virtual clock `core.decode` reads (`time.perf_counter`), in seconds."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def spend(self, ms: float) -> None:
        self.now += ms / 1000


CLOCK = Clock()
decode_module.time = CLOCK  # the loop times its passes on the virtual clock


@dataclass
class Cache:
    length: int = 0

    def keep(self, start: int, rows: torch.Tensor) -> None:
        self.length = start + len(rows)

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)


class ReplayRunner:
    """The target: each verify row's argmax is the cached output's next token where the rows
    before it followed the output (else a token nobody drafts)."""

    def __init__(self, full: list[int], vocab: int, costs: dict):
        self.full, self.vocab, self.costs = full, vocab, costs
        self.passes: list[int] = []  # rows of each verify pass

    def new_cache(self, capacity: int) -> Cache:
        return Cache()

    def forward_many(self, seqs, return_hidden=False):
        out = []
        for rows in seqs:
            ids = rows.ids.tolist()
            p = rows.cache.length  # the first row's position
            if rows.last_only:  # the prefill
                CLOCK.spend(TARGET_PREFILL[0] + TARGET_PREFILL[1] * len(ids))
                logits = torch.zeros(1, self.vocab)
                logits[0, self.full[p + len(ids)]] = 1
            else:
                assert ids[0] == self.full[p], "the root is the sequence's last token"
                self.passes.append(len(ids))
                CLOCK.spend(self.costs["step"] * interpolate(self.costs["rows"], len(ids)))
                logits = torch.zeros(len(ids), self.vocab)
                on_path = True
                for i in range(len(ids)):
                    on_path = on_path and (i == 0 or ids[i] == self.full[p + i])
                    if on_path and p + i + 1 < len(self.full):
                        logits[i, self.full[p + i + 1]] = 1
            rows.cache.length += len(ids)
            out.append((logits, None))
        CLOCK.spend(OTHER)
        return out


class ReplayTarget:
    def __init__(self, runner: ReplayRunner):
        self.runner, self.tokenizer, self.eos_ids, self.ref = runner, None, frozenset(), "replay"


class TraceDraft:
    """The draft model as `drafters.sequence.SequenceDrafter` runs it (its cache holds settled
    tokens; a proposal first feeds what it missed), proposing its teacher-forced tokens and
    stopping after one below `min_confidence`."""

    needs_target_features = False

    def __init__(self, full: list[int], argmax: list[int], conf: list[float], costs: dict,
                 min_confidence: float = 0.4):
        self.full, self.argmax, self.conf = full, argmax, conf
        self.step_ms = DRAFT_STEP * costs["step"]
        self.min_confidence = min_confidence
        self.length = self.base = 0
        self.steps = 0  # draft forwards
        self.off_path = max(full + argmax) + 1  # a token after a wrong one: never accepted

    def start(self, prompt, capacity, features=None):
        n = len(prompt) - 1
        CLOCK.spend(DRAFT_PREFILL[0] + DRAFT_PREFILL[1] * n)
        self.length, self.base = n, len(prompt)

    def nodes(self, gamma: int) -> int:
        return gamma

    def propose(self, seq, gamma, sampling, generator) -> Proposal:
        pending = len(seq) - self.length
        self.base = len(seq)
        tokens, on_path = [], True
        for j in range(gamma):
            CLOCK.spend(self.step_ms * interpolate(DRAFT_ROWS, pending))
            self.steps += 1
            self.length += pending
            pending = 1
            at = len(seq) - 1 + j  # the position the token is drafted after
            token = self.argmax[at] if on_path else self.off_path
            on_path = on_path and token == self.full[at + 1]
            tokens.append(token)
            if self.conf[at] < self.min_confidence:
                break
        return Proposal.chain(torch.tensor(tokens, dtype=torch.long))

    def rollback(self, length, features, path):
        self.length = min(self.length, self.base + len(path), length)


def lookup(alone: bool = False, **options) -> tuple:
    """(a drafter of the trace's draft model, the run's longest proposal): specq's n-gram draft
    (`NgramDraft(**options)`), in front of the draft model unless `alone`, as `api.start` builds
    it. `copy=0` on a specq before copies (to replay its own default) is its only behaviour."""
    if options.get("copy") == 0 and "copy" not in ngram.NgramDraft.__dataclass_fields__:
        del options["copy"]
    draft = ngram.NgramDraft(**options)
    if alone:
        return lambda model: ngram.NgramDrafter(draft), draft.longest(AUTO_MAX_GAMMA)
    return (lambda model: FallbackDrafter(ngram.NgramDrafter(draft), model, AUTO_MAX_GAMMA),
            max(draft.longest(AUTO_MAX_GAMMA), AUTO_MAX_GAMMA))


def model_alone() -> tuple:
    return lambda model: model, AUTO_MAX_GAMMA


class MatchIndex:
    """Every occurrence of each `n_min`-gram (the position of the token after it); a match is
    the occurrence, among the newest `chain`, whose tokens before it agree longest with the
    sequence's end (up to `limit`; newest on a tie), with that length."""

    def __init__(self, n_min: int, chain: int, limit: int):
        self.n_min, self.chain, self.limit = n_min, chain, limit
        self.tokens: list[int] = []
        self.at: dict[tuple, list[int]] = {}
        # chain 0: the current index's choice (the latest occurrence of the longest n <= 3),
        # then its agreement measured
        self.latest = ngram.NgramIndex(n_min, 3) if chain == 0 else None

    def __len__(self):
        return len(self.tokens)

    def extend(self, tokens):
        tokens = list(tokens)
        if self.latest is not None:
            self.latest.extend(tokens)
        for token in tokens:
            end = len(self.tokens)
            if end >= self.n_min:
                self.at.setdefault(tuple(self.tokens[end - self.n_min:end]), []).append(end)
            self.tokens.append(token)

    def match(self) -> tuple[int, int] | None:
        tokens = self.tokens
        if self.latest is not None:
            start = self.latest.match()
            if start is None:
                return None
            n = 0
            while n < self.limit and start - n - 1 >= 0 and tokens[start - n - 1] == tokens[-n - 1]:
                n += 1
            return start, n
        found = self.at.get(tuple(tokens[-self.n_min:]))
        if not found:
            return None
        best, longest = None, 0
        for start in reversed(found[-self.chain:]):
            n = self.n_min
            while n < self.limit and start - n - 1 >= 0 and tokens[start - n - 1] == tokens[-n - 1]:
                n += 1
            if n > longest:
                best, longest = start, n
        return best, longest

    def continuation(self, start: int, k: int) -> list[int]:
        tokens, length, out = self.tokens, len(self.tokens), []
        for i in range(start, start + k):
            out.append(tokens[i] if i < length else out[i - length])
        return out


class CopyLookup:
    """A lookup whose route names how long its match agrees with the text's end: "lookup" below
    the first of `buckets`, else "copyB" for the largest bucket B reached; each route proposes
    up to its own k (`k` for "lookup", `k_copy` for the others; at most `factor` x the match length
    when given), and gamma auto learns each route's acceptance apart."""

    needs_target_features = False

    def __init__(self, n_min=2, chain=16, limit=64, k=4, k_copy=16, buckets=(8,), factor=None):
        self.args = (n_min, chain, limit)
        self.k, self.k_copy, self.buckets, self.factor = k, k_copy, buckets, factor
        self.index = MatchIndex(*self.args)
        self.found: tuple[int, tuple | None] = (-1, None)

    def start(self, prompt, capacity, features=None):
        self.index = MatchIndex(*self.args)
        self.index.extend(prompt.tolist())
        self.found = (-1, None)

    def nodes(self, gamma):
        return min(gamma, max(self.k, self.k_copy))

    def _match(self, seq):
        self.index.extend(seq[len(self.index):])
        if self.found[0] != len(seq):
            self.found = (len(seq), self.index.match())
        return self.found[1]

    def _route(self, length: int) -> str:
        reached = [b for b in self.buckets if length >= b]
        return f"copy{reached[-1]}" if reached else "lookup"

    def route(self, seq) -> str | None:
        match = self._match(seq)
        return None if match is None else self._route(match[1])

    def longest(self, route):
        return self.k if route == "lookup" else self.k_copy

    def propose(self, seq, gamma, sampling, generator) -> Proposal:
        match = self._match(seq)
        if match is None:
            return Proposal.chain(torch.zeros(0, dtype=torch.long))
        n = min(gamma, self.longest(self._route(match[1])))
        if self.factor is not None:
            n = min(n, max(1, int(self.factor * match[1])))
        return Proposal.chain(torch.tensor(self.index.continuation(match[0], n), dtype=torch.long))

    def rollback(self, length, features, path):
        pass


class RoutedFallback:
    """`ngram+MODEL` with the lookup's own routes (`CopyLookup.route`) beside the model's."""

    def __init__(self, first: CopyLookup, then, then_gamma: int = AUTO_MAX_GAMMA):
        self.first, self.then, self.then_gamma = first, then, then_gamma
        self.needs_target_features = False
        self.proposer, self.chosen, self.last = None, None, "model"

    def nodes(self, gamma):
        model = 0 if self.then is None else self.then.nodes(min(gamma, self.then_gamma))
        return max(self.first.nodes(gamma), model)

    def start(self, prompt, capacity, features):
        self.first.start(prompt, capacity, features)
        if self.then is not None:
            self.then.start(prompt, capacity, features)

    def routes(self, seq):
        route = self.first.route(seq)
        if self.then is None:
            return [route or "lookup"]
        return [route, "model"] if route else ["model"]

    def use(self, route):
        self.chosen = route

    def proposed(self):
        return self.last

    def longest(self, route, gamma):
        if route == "model":
            return min(gamma, self.then_gamma)
        return min(gamma, self.first.longest(route))

    def propose(self, seq, gamma, sampling, generator):
        chosen, self.chosen = self.chosen, None
        if chosen != "model":
            proposal = self.first.propose(seq, gamma, sampling, generator)
            self.proposer, self.last = self.first, self.first.route(seq) or "lookup"
            if len(proposal.tokens) or self.then is None:
                return proposal
        self.proposer, self.last = self.then, "model"
        return self.then.propose(seq, min(gamma, self.then_gamma), sampling, generator)

    def rollback(self, length, features, path):
        for drafter in (self.first, self.then):
            if drafter is not None:
                drafter.rollback(length, features, path if drafter is self.proposer else [])
        self.proposer = None


class WholeCap(CostAwareGamma):
    """A chooser that drafts its whole length or nothing (plain), never a shorter cap: every
    position of every proposal is seen, so a route whose drafter sets its own length (a copy's)
    is priced by what it proposes, not by a prior for the positions a short cap never reached."""

    def next(self) -> int:
        if self.draft_s is None:
            return self.max_gamma
        if self.drafting_steps >= MIN_EVIDENCE and 1 not in self.verify_s:
            return 0
        if self.drafting_steps < MIN_EVIDENCE:
            return self.max_gamma
        return max((0, self.max_gamma), key=self.tokens_per_second)


MIN_EVIDENCE = gamma_module.MIN_EVIDENCE
WHOLE: set[str] = set()  # route-name prefixes whose choosers are `WholeCap`
_chooser = GammaMemory.chooser


def chooser(self, key, route, max_gamma):
    made = _chooser(self, key, route, max_gamma)
    if any(route.startswith(p) for p in WHOLE) and not isinstance(made, WholeCap):
        whole = WholeCap(max_gamma)
        whole.__dict__.update(made.__dict__)
        return whole
    return made


GammaMemory.chooser = chooser


def copy_policy(alone=False, whole=False, **options):
    lookup = CopyLookup(**options)

    def make(model):
        WHOLE.clear()
        if whole:
            WHOLE.add("copy")
        return RoutedFallback(CopyLookup(**options), None if alone else model)
    return make, max(lookup.k, lookup.k_copy)


# built when run: an older specq (to replay its own default) lacks some options
POLICIES: dict[str, Callable[[], tuple]] = {
    "ngram:n=2-3:k=4:c=0+0.5B (default before)": lambda: lookup(copy=0),
    "ngram:k=16:c=0+0.5B": lambda: lookup(k=16, copy=0),
    "ngram:n=2-6:k=4:c=0+0.5B": lambda: lookup(n_max=6, copy=0),
    "0.5B alone": lambda: model_alone(),
    "ngram:c=0 alone": lambda: lookup(alone=True, copy=0),
    "ngram:c=16+0.5B": lambda: lookup(copy=16),
    "ngram:c=32+0.5B": lambda: lookup(copy=32),
    "ngram:c=8+0.5B": lambda: lookup(copy=8),
    "ngram:n=2-5:c=16+0.5B": lambda: lookup(n_max=5, copy=16),
    "ngram:c=16 alone": lambda: lookup(alone=True, copy=16),
    # prototypes (`CopyLookup`): the copy route from a match's measured agreement
    "proto copy>=8 k16": lambda: copy_policy(buckets=(8,)),
    "proto copy>=4 k16": lambda: copy_policy(buckets=(4,)),
    "proto copy 4,8,16,32 k16": lambda: copy_policy(buckets=(4, 8, 16, 32)),
    "proto copy>=4 k16 chain1": lambda: copy_policy(buckets=(4,), chain=1),
    "proto copy>=4 k16 factor1": lambda: copy_policy(buckets=(4,), factor=1.0),
    "proto copy>=4 k16 whole": lambda: copy_policy(buckets=(4,), whole=True),
    "proto copy>=4 k16 whole factor1": lambda: copy_policy(buckets=(4,), whole=True, factor=1.0),
    "proto copy>=4 k16 latest whole factor1": lambda: copy_policy(buckets=(4,), whole=True,
                                                                  factor=1.0, chain=0),
}


@dataclass
class Result:
    tokens: int
    time_s: float
    plain_s: float
    passes: list[int]
    draft_steps: int
    routes: dict


def simulate(trace: dict, make, gamma: int, tokens: int, costs: dict,
             memory: GammaMemory) -> Result:
    # token ids renumbered densely, so each verify row's logits are a few hundred wide
    ids: dict[int, int] = {}
    dense = lambda tokens: [ids.setdefault(t, len(ids)) for t in tokens]  # noqa: E731
    prompt, out = dense(trace["prompt_ids"]), dense(trace["output"][:tokens])
    full = prompt + out
    argmax = dense(trace["draft_argmax"])
    runner = ReplayRunner(full, len(ids) + 1, costs)
    model = TraceDraft(full, argmax, trace["draft_conf"], costs)
    drafter = make(model) if make else None
    CLOCK.now = 0.0
    sequence = Sequence(ReplayTarget(runner), prompt, drafter=drafter, gamma=gamma,
                        adaptive=drafter is not None, max_new_tokens=tokens, ignore_eos=True,
                        memory=memory, memory_key="sim")
    ids, _, stats = run(sequence)
    assert ids == out, "a replayed run emits the cached output"
    plain = (TARGET_PREFILL[0] + TARGET_PREFILL[1] * len(prompt)
             + (tokens - 1) * (costs["step"] + OTHER)) / 1000
    return Result(tokens, stats.prefill_s + stats.decode_s, plain, runner.passes, model.steps,
                  stats.routes)


def trace(path: str, sets: list[str], prompts: int, tokens: int) -> None:
    """Append to `path` the trace of each prompt it lacks (`TRACES.jsonl` above). The target's
    outputs are generated with its default draft at gamma 4 (lossless, and faster than plain
    decoding whatever the machine's load)."""
    import specq
    from specq.bench.prompts import load_set
    from specq.core.prompt import encode_prompt

    try:
        done = {(t["set"], t["prompt"]) for t in map(json.loads, open(path))
                if len(t["output"]) >= tokens}
    except FileNotFoundError:
        done = set()
    target = specq.load("qwen2.5-coder-1.5b@gguf")
    draft = specq.load("qwen2.5-coder-0.5b@gguf-int4-head32k")
    head = draft.net.output  # a NarrowHead: its kept rows, as a greedy chain drafts from them
    for name in sets:
        for prompt in load_set(name, prompts):
            if (name, prompt.index) in done:
                continue
            ids = encode_prompt(target, prompt.text, prompt.chat)
            out = specq.generate(target, ids, max_new_tokens=tokens, ignore_eos=True, gamma=4)
            with torch.inference_mode():
                full = torch.tensor(ids + out.token_ids)
                logits = draft.runner(full, draft.runner.new_cache(len(full) + 1),
                                      head=head.rows)  # [len(full), kept]
                conf, kept = logits.float().softmax(-1).max(-1)
            with open(path, "a") as f:
                f.write(json.dumps({"set": name, "prompt": prompt.index, "prompt_ids": ids,
                                    "output": out.token_ids,
                                    "draft_argmax": head.keep[kept].tolist(),
                                    "draft_conf": [round(float(c), 4) for c in conf]}) + "\n")
            print(name, prompt.index, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="?")
    parser.add_argument("--trace", metavar="TRACES", help="write the traces (loads the models)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--costs", default="flat", choices=sorted(COSTS))
    parser.add_argument("--policies", nargs="*", default=None)
    parser.add_argument("--sets", nargs="*", default=["chat", "code", "edit"])
    parser.add_argument("--prompts", type=int, default=8)
    args = parser.parse_args()
    if args.trace:
        return trace(args.trace, args.sets, args.prompts, max(args.tokens))
    traces = [json.loads(line) for line in open(args.traces)]
    costs = COSTS[args.costs]
    names = args.policies or list(POLICIES)
    print("| policy | tokens | set | tau | rows/pass | draft steps/token | predicted speedup "
          "(mean, min) | routes: steps/drafted/accepted |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        make, gamma = POLICIES[name]()
        memory = GammaMemory()  # one per target in the bench, across its cells, in their order
        for tokens in args.tokens:
            for set_name in args.sets:
                mine = [t for t in traces if t["set"] == set_name and len(t["output"]) >= tokens]
                mine = sorted(mine, key=lambda t: t["prompt"])[:args.prompts]
                if not mine:
                    continue
                simulate(mine[0], make, gamma, WARMUP_TOKENS, costs, memory)
                results = [simulate(t, make, gamma, tokens, costs, memory) for t in mine]
                passes = [p for r in results for p in r.passes]
                emitted = sum(r.tokens - 1 for r in results)
                speedups = [r.plain_s / r.time_s for r in results]
                routes = defaultdict(lambda: [0, 0, 0])
                for r in results:
                    for route, c in r.routes.items():
                        for i, key in enumerate(("steps", "drafted", "accepted")):
                            routes[route][i] += c[key]
                print(f"| {name} | {tokens} | {set_name} | {emitted / len(passes):.2f} | "
                      f"{sum(passes) / len(passes):.2f} | "
                      f"{sum(r.draft_steps for r in results) / emitted:.2f} | "
                      f"{statistics.mean(speedups):.2f}, {min(speedups):.2f} | "
                      + ", ".join(f"{k} {v[0]}/{v[1]}/{v[2]}" for k, v in sorted(routes.items()))
                      + " |", flush=True)


if __name__ == "__main__":
    main()
