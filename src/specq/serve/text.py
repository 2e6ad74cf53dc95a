"""Streamed text: token ids arrive a step at a time, text leaves as deltas that
are never taken back.

Held back until the next tokens decide: a tail that could be the start of a stop string (the stop
string itself is never sent, as in the OpenAI API), and an incomplete UTF-8 character (a byte-level
tokenizer decodes half a character as U+FFFD).
"""

from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stop: list[str] | str | None):
        self.tokenizer = tokenizer
        self.stop = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
        self.ids: list[int] = []
        self.sent = 0  # characters sent so far

    def push(self, ids: list[int]) -> str:
        """The text that is safe to send after these new tokens ('' when all of it is held back)."""
        self.ids += ids
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        return self._emit(text, self._safe_end(text))

    def finish(self, text: str) -> str:
        """The rest of the generation's final text (already cut before any stop string)."""
        return self._emit(text, len(text))

    def _emit(self, text: str, end: int) -> str:
        if end <= self.sent:
            return ""
        delta, self.sent = text[self.sent:end], end
        return delta

    def _safe_end(self, text: str) -> int:
        cuts = [text.find(s) for s in self.stop if s in text]
        if cuts:
            return min(cuts)
        end = len(text)
        while end > self.sent and text[end - 1] == "\ufffd":
            end -= 1
        hold = 0  # the longest tail that starts some stop string
        for s in self.stop:
            hold = max([hold] + [k for k in range(1, min(len(s) - 1, end) + 1)
                                 if text[:end].endswith(s[:k])])
        return end - hold
