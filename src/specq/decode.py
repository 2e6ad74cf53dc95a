"""The decoding loop: propose -> verify in one target pass -> accept -> roll back.

Plain decoding is the same loop with no drafter (gamma 0): one target pass per token. The loop
knows nothing about which drafter or quantization it runs with, nor whether it proposes a chain
or a token tree: a chain is a tree whose nodes each have one child.

Cache invariant: the target's KV cache holds every token of `seq` except the last one, which is
fed (as the root, with the draft nodes after it) to the next verify pass.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from .acceptance import accept_greedy, accept_sampling, depths, is_chain, verify_layout
from .drafters.base import DEFAULT_GAMMA, EMPTY, Drafter
from .gamma import CostAwareGamma
from .models import Model
from .sampling import SamplingConfig, probabilities, sample
from .stats import DecodeStats
from .stopping import StopChecker


@torch.inference_mode()
def decode(target: Model, prompt_ids: list[int], *, drafter: Drafter | None = None, gamma: int = DEFAULT_GAMMA,
           adaptive: bool = False, sampling: SamplingConfig = SamplingConfig(), max_new_tokens: int = 128,
           stop_strings: list[str] | None = None, ignore_eos: bool = False,
           generator: torch.Generator | None = None,
           on_tokens: Callable[[list[int]], bool] | None = None) -> tuple[list[int], str, DecodeStats]:
    """Generate from `target`, speculatively when a drafter is given.
    Returns (new token ids, finish reason 'eos' | 'stop' | 'length' | 'cancelled', stats). `adaptive`: gamma is
    the longest proposal and each step's length is chosen from measured costs (`gamma.py`).
    `ignore_eos` runs to max_new_tokens (as in vLLM), for benchmarks at a fixed output length.
    `on_tokens` (streaming) gets each step's new tokens, up to a stop; returning False ends the
    run with reason 'cancelled' (a client that went away)."""
    generator = generator or torch.Generator().manual_seed(0)
    gamma = gamma if drafter is not None else 0
    chooser = CostAwareGamma(gamma) if adaptive and gamma else None
    stats = DecodeStats(gamma=gamma, prompt_tokens=len(prompt_ids))
    eos_ids = frozenset() if ignore_eos else target.eos_ids
    stopper = StopChecker(target.tokenizer, eos_ids, stop_strings, max_new_tokens)
    capacity = len(prompt_ids) + max_new_tokens + (drafter.nodes(gamma) if drafter is not None else 0) + 1

    cache = target.net.new_cache(capacity)
    wants_features = drafter is not None and drafter.needs_target_features

    def target_pass(ids, last_only=False, parents=None):
        """(logits, the target's hidden states if the drafter reads them, else None). `parents`:
        the draft nodes after the root ids[0] form a tree, not a chain."""
        tree = {} if parents is None else verify_layout(parents, cache.length)
        if wants_features:
            return target.net(ids, cache, last_only=last_only, return_hidden=True, **tree)
        return target.net(ids, cache, last_only=last_only, **tree), None

    # Prefill both models; the target's last logits give the first new token.
    started = time.perf_counter()
    prompt = torch.tensor(prompt_ids, dtype=torch.long)
    logits, features = target_pass(prompt, last_only=True)
    first = int(logits.argmax(-1)) if sampling.greedy else int(sample(probabilities(logits, sampling), generator))
    if drafter is not None:
        drafter.start(prompt, capacity, features)
    stats.prefill_s = time.perf_counter() - started

    seq = list(prompt_ids) + [first]
    generated = [first]
    stop = stopper.first_stop(generated, 0)
    sent = 0  # tokens passed to on_tokens

    def stream() -> tuple[int, str] | None:
        nonlocal sent
        upto = len(generated) if stop is None else stop[0]
        if on_tokens is None or upto == sent:
            return stop
        keep_going = on_tokens(generated[sent:upto])
        sent = upto
        return stop if keep_going or stop is not None else (upto, "cancelled")

    stop = stream()
    started = time.perf_counter()
    while stop is None:
        # 1. Propose: never draft past the token budget.
        g = min(chooser.next() if chooser else gamma, max_new_tokens - len(generated) - 1)
        t0 = time.perf_counter()
        proposal = drafter.propose(seq, g, sampling, generator) if g > 0 else EMPTY
        t1 = time.perf_counter()

        # 2. Verify: one target pass over the last token (the root) and every draft node.
        tokens, parents = proposal.tokens, proposal.parents
        ids = torch.cat([torch.tensor(seq[-1:]), tokens])
        logits, features = target_pass(ids, parents=None if is_chain(parents) else parents)
        if sampling.greedy:
            path, next_token = accept_greedy(tokens, parents, logits)
        else:
            path, next_token = accept_sampling(tokens, parents, proposal.probs, probabilities(logits, sampling),
                                               generator)
        t2 = time.perf_counter()
        stats.draft_s += t1 - t0
        stats.verify_s += t2 - t1
        stats.record_step(len(tokens), len(path), int(depths(parents).max()) if len(tokens) else 0)
        if chooser:
            chooser.observe(g, len(tokens), len(path), t1 - t0, t2 - t1)

        # 3. Accept the path plus the target's own next token; keep only their rows in the caches.
        rows = torch.tensor([0] + [node + 1 for node in path])
        new = tokens[path].tolist() + [next_token]
        cache.keep(len(seq) - 1, rows)
        seq += new
        generated += new
        if drafter is not None:
            drafter.rollback(len(seq) - 1, None if features is None else features[rows], path)
        stop = stopper.first_stop(generated, len(generated) - len(new))
        stop = stream()

    keep, reason = stop
    stats.decode_s = time.perf_counter() - started
    stats.new_tokens = keep
    return generated[:keep], reason, stats
