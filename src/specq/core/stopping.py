"""When to stop: EOS ids, a token budget, stop strings. Never emits past a stop."""

from __future__ import annotations


class StopChecker:
    def __init__(self, tokenizer, eos_ids: frozenset[int], stop_strings: list[str] | None,
                 max_new_tokens: int):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.stop_strings = [s for s in (stop_strings or []) if s]
        self.max_new_tokens = max_new_tokens
        # A stop string of c characters spans at most c tokens (+ slack for partial characters).
        self.window = max((len(s) for s in self.stop_strings), default=0) + 4

    def first_stop(self, generated: list[int], start: int) -> tuple[int, str] | None:
        """Check tokens generated[start:] in order; return (number of tokens to keep, reason)
        at the first stop, or None. The stop token itself (EOS, end of a stop string) is kept."""
        for i in range(start, len(generated)):
            if generated[i] in self.eos_ids:
                return i + 1, "eos"
            if self.stop_strings:
                tail = self.tokenizer.decode(generated[max(0, i + 1 - self.window): i + 1])
                if any(s in tail for s in self.stop_strings):
                    return i + 1, "stop"
            if i + 1 >= self.max_new_tokens:
                return i + 1, "length"
        return None


def trim_at_stop(text: str, stop_strings: list[str] | None) -> str:
    """Text ends before the first stop string (as in vLLM and the OpenAI API)."""
    cuts = [text.find(s) for s in (stop_strings or []) if s and s in text]
    return text[: min(cuts)] if cuts else text
