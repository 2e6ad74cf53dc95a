"""Request bodies of /v1/completions and /v1/chat/completions.

Every field is declared and anything else is a 400 (`extra="forbid"`): a client must never
believe a parameter took effect when specq does not implement it. Types are strict (no "5" for
5). Fields OpenAI defines that specq implements only at their neutral value (n = 1, penalties 0,
no logprobs) are accepted at that value and refused otherwise (`unsupported_values`).

Extensions, as vLLM takes them (the openai client's `extra_body`): `draft` (a draft ref, an n-gram
draft `ngram[:n=N][:k=K]` alone or `+DRAFT`, or null for plain decoding), `speculative`, `gamma` (a
number or "auto"), `tree` / `tree_depth` / `tree_topk` (dynamic token trees), `top_k`, `ignore_eos`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..checks import MAX_SEED
from ..core.gamma import MAX_GAMMA
from .errors import APIError

STRICT = ConfigDict(extra="forbid", strict=True)


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class _Common(BaseModel):
    model_config = STRICT
    model: str
    max_tokens: int | None = Field(None, ge=1)
    # None: OpenAI's default, 1
    temperature: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1)  # 0 or -1 (vLLM's spelling): off
    seed: int | None = Field(None, ge=0, le=MAX_SEED)  # None: a fresh one per request
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float = Field(0.0, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, allow_inf_nan=False)
    user: str | None = None  # an end-user id for the caller's logs; it changes nothing
    # specq's extensions
    draft: str | None = None
    speculative: bool = True
    gamma: Annotated[int, Field(ge=1, le=MAX_GAMMA)] | Literal["auto"] | None = None
    tree: int | None = Field(None, ge=1, le=MAX_GAMMA)
    tree_depth: int | None = Field(None, ge=1, le=MAX_GAMMA)
    tree_topk: int | None = Field(None, ge=1, le=MAX_GAMMA)
    ignore_eos: bool = False


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def as_template_input(self) -> dict[str, str]:
        """The message as chat templates read it (a developer message is a system message)."""
        text = (self.content
                if isinstance(self.content, str) else "".join(p.text for p in self.content))
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


NEUTRAL = {"n": (1,), "presence_penalty": (0,), "frequency_penalty": (0,),
           "logprobs": (None, False, 0), "top_logprobs": (None,), "echo": (False,),
           "best_of": (None, 1), "suffix": (None, "")}


def unsupported_values(body: ChatRequest | CompletionRequest) -> None:
    """Refuse an OpenAI field set to a value specq does not implement."""
    for name, neutral in NEUTRAL.items():
        value = getattr(body, name, None)
        if name in body.model_fields_set and value not in neutral:
            raise APIError(400, f"{name}={value!r} is not supported by specq serve (only "
                                f"{neutral[0]!r})",
                           param=name, code="unsupported_value")
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options is only allowed with stream=true",
                       param="stream_options", code="invalid_value")
    if isinstance(body, CompletionRequest) and isinstance(body.prompt, list) and body.prompt \
            and isinstance(body.prompt[0], str) and len(body.prompt) != 1:
        raise APIError(400, "one prompt per request (n must be 1)", param="prompt",
                       code="unsupported_value")


FIELDS = {name for schema in (ChatRequest, CompletionRequest, Message, TextPart, StreamOptions)
          for name in schema.model_fields}


def invalid_body(error: ValidationError) -> APIError:
    """The first problem pydantic found in a body (malformed JSON, a missing field, a wrong type, a
    field the server does not implement) as a 400 that names the field."""
    problems = error.errors(include_url=False)
    param = _path(problems[0]["loc"])
    kind = problems[0]["type"]
    if kind == "extra_forbidden":
        param = ".".join(filter(None,
                                [_path(problems[0]["loc"][:-1]), str(problems[0]["loc"][-1])]))
        return APIError(400, f"unsupported parameter '{param}': specq serve does not implement it",
                        param=param, code="unsupported_parameter")
    if kind == "finite_number":  # JSON as Python reads it allows NaN and Infinity
        return APIError(400, f"{param}: must be a finite number, not {problems[0]['input']!r}",
                        param=param, code="invalid_value")
    if kind == "json_invalid":
        return APIError(400, "the body is not valid JSON "
                             f"({problems[0].get('ctx', {}).get('error', 'parse error')})",
                        code="invalid_json")
    # a union (prompt: text or token ids) fails once per member: say every way it could be right
    messages = dict.fromkeys(p["msg"] for p in problems if _path(p["loc"]) == param)
    return APIError(400, f"{param or 'the body'}: {' or '.join(messages)}", param=param,
                    code="invalid_value")


def _path(loc: tuple) -> str | None:
    """'messages.0.role' from pydantic's location, without the union member names it adds."""
    parts = []
    for part in loc:
        if not isinstance(part, int) and part not in FIELDS:
            break
        parts.append(str(part))
    return ".".join(parts) or None
