"""The Python API: load models once, generate many times.

    import specq
    target = specq.load("smollm2-135m")
    draft = specq.load("path/to/draft")
    out = specq.generate(target, "The capital of France is", draft=draft, gamma=4)
    print(out.text, out.stats.tau)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .decode import decode
from .drafters import for_pair
from .drafters.base import DEFAULT_GAMMA
from .drafters.sequence import DEFAULT_DRAFT_CONFIDENCE
from .errors import SpecqError
from .gamma import parse as parse_gamma
from .models import Model, check_compatible
from .sampling import SamplingConfig
from .stats import DecodeStats
from .stopping import trim_at_stop

MAX_GAMMA = 64


@dataclass
class Generation:
    text: str
    token_ids: list[int]  # new tokens only (the stop token included)
    prompt_ids: list[int]
    finish_reason: str  # 'eos' | 'stop' | 'length'
    stats: DecodeStats
    target: str
    draft: str | None

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "target": self.target, "draft": self.draft, "stats": self.stats.to_dict()}


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """A one-turn user prompt in the tokenizer's chat template, ready for the assistant's answer."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                        add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def answer_ids(tokenizer, prompt: str) -> list[int]:
    """A prompt as a model is asked to answer it: in its chat template if it has one."""
    if getattr(tokenizer, "chat_template", None):
        return chat_ids(tokenizer, prompt)
    return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])


def encode_prompt(model: Model, prompt: str, chat: bool = False) -> list[int]:
    if not prompt or not prompt.strip():
        raise SpecqError("the prompt is empty")
    tok = model.tokenizer
    if chat:
        if not getattr(tok, "chat_template", None):
            raise SpecqError(f"model '{model.ref}' has no chat template; drop --chat")
        ids = chat_ids(tok, prompt)
    else:
        ids = tok(prompt, add_special_tokens=True)["input_ids"]
    if not ids:
        raise SpecqError("the prompt encodes to no tokens")
    return list(ids)


def validate(target: Model, draft: Model | None, gamma: int, max_new_tokens: int, prompt_len: int) -> None:
    if draft is not None and not 1 <= gamma <= MAX_GAMMA:
        raise SpecqError(f"gamma must be between 1 and {MAX_GAMMA}, got {gamma}")
    if max_new_tokens < 1:
        raise SpecqError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    limit = getattr(target.net.config, "max_position_embeddings", None)
    if limit and prompt_len + max_new_tokens + gamma + 1 > limit:
        raise SpecqError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"the target's context of {limit} tokens")


def generate(target: Model, prompt: str | list[int], draft: Model | None = None, *, gamma: int | str = DEFAULT_GAMMA,
             max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0, chat: bool = False, stop: list[str] | None = None,
             ignore_eos: bool = False, draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE, drafter=None) -> Generation:
    """Generate from `target`; speculatively when `draft` (or a ready `drafter`) is given.
    The output is the target's own: token for token when greedy, in distribution when sampling.
    gamma "auto" chooses each step's draft length from this run's measured costs (up to 4)."""
    gamma, adaptive = parse_gamma(gamma)
    try:
        sampling = SamplingConfig(temperature, top_k, top_p)
    except ValueError as e:
        raise SpecqError(str(e)) from None
    prompt_ids = list(prompt) if isinstance(prompt, list) else encode_prompt(target, prompt, chat)
    if not prompt_ids:
        raise SpecqError("the prompt is empty")
    if draft is not None:
        check_compatible(draft, target)
        if not 0 <= draft_confidence < 1:
            raise SpecqError(f"draft_confidence must be in [0, 1), got {draft_confidence}")
        drafter = drafter or for_pair(draft, target, draft_confidence)
    validate(target, draft if drafter is not None else None, gamma, max_new_tokens, len(prompt_ids))
    ids, reason, stats = decode(target, prompt_ids, drafter=drafter, gamma=gamma, adaptive=adaptive, sampling=sampling,
                                max_new_tokens=max_new_tokens, stop_strings=stop, ignore_eos=ignore_eos,
                                generator=torch.Generator().manual_seed(seed))
    text = target.tokenizer.decode(ids, skip_special_tokens=True)
    if reason == "stop":
        text = trim_at_stop(text, stop)
    return Generation(text=text, token_ids=ids, prompt_ids=prompt_ids, finish_reason=reason, stats=stats,
                      target=target.ref, draft=draft.ref if draft is not None else None)
