"""A prompt as the loop takes it: token ids, from text (in the model's chat template on request)
or given as ids, checked against the model's vocabulary and context."""

from __future__ import annotations

from .. import checks
from ..errors import SpecqError
from .types import Model


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


def token_ids(model: Model, ids: list[int]) -> list[int]:
    """A prompt given as token ids: a non-empty list of ints in the model's vocabulary."""
    if not ids:
        raise SpecqError("the prompt is empty")
    for i in ids:
        checks.integer("a prompt token id", i, 0, model.vocab_size - 1)
    return list(ids)


def encode_prompt(model: Model, prompt: str, chat: bool = False) -> list[int]:
    checks.text("the prompt", prompt)
    if not prompt.strip():
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


def check_context(target: Model, proposal_nodes: int, max_new_tokens: int, prompt_len: int) -> None:
    """Prompt, new tokens and one proposal fit in the target's context."""
    limit = getattr(target.net.config, "max_position_embeddings", None)
    if limit and prompt_len + max_new_tokens + proposal_nodes + 1 > limit:
        raise SpecqError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) "
                         f"exceeds the target's context of {limit} tokens")
