"""How far apart two models' next-token distributions are, and what that predicts.

For next-token distributions p (model A) and q (model B) at every position of held-out text:
KL(A||B), KL(B||A), Jensen-Shannon, total variation, top-1 agreement, and
beta = sum_x min(p, q) = 1 - TV, the exact expected acceptance of one speculative step when
B drafts for A (Leviathan et al. 2023). Greedy acceptance is top-1 agreement. Means come with
bootstrap CIs over text chunks (tokens within a chunk are correlated).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import backends
from ..core.stats import bootstrap_ci
from ..core.types import Draft, Model
from ..errors import SpecqError
from ..loading import kinds

METRICS = ("kl_ab", "kl_ba", "js", "tv", "top1", "beta")


def token_divergences(logits_a: Tensor, logits_b: Tensor,
                      temperature: float = 1.0) -> dict[str, Tensor]:
    """Per-position metrics for two [n, V] logit tensors (truncated to their shared vocabulary)."""
    v = min(logits_a.shape[-1], logits_b.shape[-1])
    la = torch.log_softmax(logits_a[..., :v].double() / temperature, dim=-1)
    lb = torch.log_softmax(logits_b[..., :v].double() / temperature, dim=-1)
    pa, pb = la.exp(), lb.exp()
    m = 0.5 * (pa + pb)
    lm = m.clamp_min(1e-300).log()
    kl = lambda p, lp, lq: torch.where(p > 0, p * (lp - lq),  # noqa: E731
                                       torch.zeros_like(p)).sum(-1)
    tv = 0.5 * (pa - pb).abs().sum(-1)
    return {
        "kl_ab": kl(pa, la, lb),
        "kl_ba": kl(pb, lb, la),
        "js": 0.5 * kl(pa, la, lm) + 0.5 * kl(pb, lb, lm),
        "tv": tv,
        "top1": (la.argmax(-1) == lb.argmax(-1)).double(),
        "beta": torch.minimum(pa, pb).sum(-1),
    }


def _nll(logits: Tensor, next_ids: Tensor) -> Tensor:
    return -torch.log_softmax(logits.double(), dim=-1).gather(-1, next_ids[:, None]).squeeze(-1)


def _runner(model: Model | Draft):
    """What runs the model's passes: its runner, or torch's ops where it was loaded without one."""
    return model.runner or backends.runner(model.net, "eager")


def _next_token_logits(a: Model, b: Model | Draft, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Both models' next-token logits at the same positions, and the tokens that follow, as B's
    kind scores them (a feature draft B reads A's hidden states)."""
    return kinds.kind_of(b).next_token_logits(_runner(a), _runner(b), ids)


@torch.inference_mode()
def compare(a: Model, b: Model | Draft, chunks: list[list[int]], temperature: float = 1.0,
            resamples: int = 2000, seed: int = 0, progress=None) -> dict:
    """Divergence of B from A over token chunks, plus each model's perplexity on them.
    Returns {metric: {"mean", "low", "high"}} and "ppl_a", "ppl_b" the same way."""
    per_chunk: dict[str, list[float]] = {k: [] for k in (*METRICS, "nll_a", "nll_b")}
    tokens = 0
    for chunk in chunks:
        ids = torch.tensor(chunk, dtype=torch.long)
        la, lb, next_ids = _next_token_logits(a, b, ids)
        for name, values in token_divergences(la, lb, temperature).items():
            per_chunk[name].append(float(values.mean()))
        per_chunk["nll_a"].append(float(_nll(la, next_ids).mean()))
        per_chunk["nll_b"].append(float(_nll(lb, next_ids).mean()))
        tokens += len(next_ids)
        if progress:
            progress()
    out = {"tokens": tokens, "chunks": len(chunks), "temperature": temperature}
    for name in METRICS:
        out[name] = dict(zip(("mean", "low", "high"),
                             bootstrap_ci(per_chunk[name], resamples=resamples, seed=seed)))
    for side in ("a", "b"):
        mean, low, high = bootstrap_ci(per_chunk[f"nll_{side}"], resamples=resamples, seed=seed)
        out[f"ppl_{side}"] = {"mean": math.exp(mean), "low": math.exp(low), "high": math.exp(high)}
    return out


def held_out_chunks(a: Model, n_text: int, chunk_len: int, n_chat: int,
                    answer_tokens: int = 96) -> list[list[int]]:
    """Held-out Shakespeare chunks, plus held-out chat prompts with A's own greedy answers (the
    text a speculative run actually verifies)."""
    from ..core.decode import decode
    from ..core.prompt import check_context, encode_prompt
    from ..data import chat_prompts, shakespeare_texts, split

    context = getattr(a.net.config, "max_position_embeddings", None)
    if context and chunk_len > context:
        raise SpecqError(f"chunks of {chunk_len} tokens exceed the context of '{a.ref}' ({context} "
                         "tokens)")
    _, held = split(shakespeare_texts())
    chunks: list[list[int]] = []
    for text in held if n_text else []:
        ids = a.tokenizer(text)["input_ids"]
        chunks += [ids[i: i + chunk_len] for i in range(0, len(ids) - chunk_len + 1, chunk_len * 7)]
        if len(chunks) >= n_text:
            break
    if len(chunks) < n_text:
        raise SpecqError(f"the held-out text gives {len(chunks)} chunks of {chunk_len} tokens, "
                         f"fewer than the {n_text} asked for: ask for fewer or shorter chunks")
    chunks = chunks[:n_text]
    for prompt in chat_prompts("held_out")[:n_chat]:
        ids = encode_prompt(a, prompt, chat=True)
        check_context(a, 0, answer_tokens, len(ids))
        chunks.append(ids + decode(a, ids, max_new_tokens=answer_tokens)[0])
    return chunks
