"""Response bodies and server-sent events in the shapes the OpenAI API defines (and its official
clients parse): `chat.completion`, `text_completion`, their streamed chunks, `data: [DONE]`."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from ..api import Generation

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


@dataclass
class Reply:
    """What every chunk of one response shares."""

    chat: bool
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.id = self.id or f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    def _head(self, chunk: bool) -> dict:
        kind = (("chat.completion.chunk" if chunk else "chat.completion")
                if self.chat else "text_completion")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, out: Generation) -> dict:
        """A non-streamed response."""
        choice = {"index": 0, "logprobs": None, "finish_reason": FINISH[out.finish_reason]}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": out.text}
        else:
            choice["text"] = out.text
        return self._head(False) | {"choices": [choice], "usage": usage(out),
                                    "specq": specq_stats(out)}

    def chunk(self, text: str | None, finish: str | None = None, role: bool = False,
              with_usage: bool = False) -> str:
        """One streamed event; `role` opens a chat stream."""
        if self.chat:
            delta = (({"role": "assistant"} if role else {})
                     | ({} if text is None else {"content": text}))
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        body = self._head(True) | {"choices": [choice]}
        return event(body | ({"usage": None} if with_usage else {}))

    def usage_chunk(self, out: Generation) -> str:
        """The last event when the client asked for stream_options.include_usage."""
        return event(self._head(True) | {"choices": [], "usage": usage(out),
                                         "specq": specq_stats(out)})


def usage(out: Generation) -> dict:
    prompt, completion = len(out.prompt_ids), len(out.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def specq_stats(out: Generation) -> dict:
    """specq's own view of the run (an extra field; clients keep it in `model_extra`)."""
    s = out.stats
    return {"draft": out.draft, "steps": s.steps, "drafted": s.drafted, "accepted": s.accepted,
            "acceptance_rate": s.acceptance_rate, "tau": s.tau}


def event(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


DONE = "data: [DONE]\n\n"
