"""A validated request -> what the engine runs: the prompt, the draft choice and the keyword
options of `specq.generate`. Defaults follow the OpenAI API (temperature 1, top_p 1, completions
16 tokens, chat up to the context, capped) unless the request says otherwise."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from ..core.gamma import AUTO
from ..drafters.base import default_gamma
from ..drafters.tree import DEFAULT_TREE, TreeShape
from .errors import APIError
from .schemas import ChatRequest, CompletionRequest

COMPLETION_MAX_TOKENS = 16  # the OpenAI completions default
CHAT_MAX_TOKENS = 1024  # a chat without max_tokens runs to EOS, the context, or this

REGISTRY = "registry"  # the draft choice: the served model's own draft


@dataclass
class Plan:
    prompt: str | list[int] | list[dict[str, str]]  # text, token ids, or chat messages
    chat: bool
    max_tokens: int | None  # None: up to the context, at most CHAT_MAX_TOKENS
    draft: str | None  # REGISTRY, a draft ref, or None (plain decoding)
    stream: bool = False
    include_usage: bool = False
    options: dict = field(default_factory=dict)  # specq.generate's keyword options
    # sampled with the request's own seed: it drafts from its own text only (not from earlier
    # requests', which change what the seed draws), so the same request repeats its output
    repeatable: bool = False


def plan(body: ChatRequest | CompletionRequest) -> Plan:
    chat = isinstance(body, ChatRequest)
    if chat:
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            raise APIError(400, "give max_tokens or max_completion_tokens, not both",
                           param="max_tokens")
        prompt = [m.as_template_input() for m in body.messages]
        max_tokens = body.max_completion_tokens or body.max_tokens
    else:
        prompt = (body.prompt[0] if isinstance(body.prompt, list) and body.prompt
                  and isinstance(body.prompt[0], str)
                  else body.prompt)
        max_tokens = body.max_tokens or COMPLETION_MAX_TOKENS
    temperature = 1.0 if body.temperature is None else body.temperature
    options = dict(gamma=_gamma(body, temperature), tree=_tree(body), temperature=temperature,
                   top_p=1.0 if body.top_p is None else body.top_p, top_k=max(0, body.top_k or 0),
                   seed=body.seed if body.seed is not None else secrets.randbits(63),
                   stop=body.stop, ignore_eos=body.ignore_eos)
    return Plan(prompt=prompt, chat=chat, max_tokens=max_tokens, draft=_draft(body),
                stream=body.stream,
                include_usage=bool(body.stream_options and body.stream_options.include_usage),
                options=options, repeatable=temperature > 0 and body.seed is not None)


def _draft(body) -> str | None:
    if not body.speculative:
        if body.draft is not None or any(getattr(body, f) is not None for f in ("gamma", "tree")):
            raise APIError(400, "speculative=false takes no draft, gamma or tree",
                           param="speculative")
        return None
    if "draft" in body.model_fields_set:
        return body.draft  # null: plain decoding
    return REGISTRY


def _gamma(body, temperature: float) -> int | str:
    """With a tree the depth is tree_depth; only gamma "auto" goes with it (as `specq generate`)."""
    if body.tree is not None and body.gamma not in (None, AUTO):
        raise APIError(400, "with tree the depth is tree_depth, not gamma (only gamma 'auto' goes "
                            "with tree)",
                       param="gamma")
    return default_gamma(_tree(body), greedy=temperature == 0) if body.gamma is None else body.gamma


def _tree(body) -> TreeShape | None:
    if body.tree is None:
        if body.tree_depth is not None or body.tree_topk is not None:
            raise APIError(400, "tree_depth and tree_topk need tree (the number of draft nodes)",
                           param="tree")
        return None
    return TreeShape(body.tree, body.tree_depth or DEFAULT_TREE.depth,
                     body.tree_topk or DEFAULT_TREE.topk)
