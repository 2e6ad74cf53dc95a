"""Quality checks on stored outputs: GSM8K exact match, and lossless-ness (speculative greedy
output must equal the target's own greedy output token for token)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")


def normalize_number(text: str) -> str | None:
    """'$1,200.50' -> '1200.5', '18.0' -> '18', '7.' -> '7'; None if no number."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    raw = match.group().replace("$", "").replace(",", "")
    try:
        value = Decimal(raw)
    except InvalidOperation:
        return None
    value = value.normalize()
    return format(value.quantize(Decimal(1)) if value == value.to_integral() else value, "f")


def reference_answer(answer: str) -> str | None:
    """The number after the last '####' of a GSM8K answer."""
    _, sep, tail = answer.rpartition("####")
    return normalize_number(tail) if sep else None


def extract_answer(text: str) -> str | None:
    """The model's answer: the number after its last '####', else the last number it wrote."""
    _, sep, tail = text.rpartition("####")
    if sep and normalize_number(tail) is not None:
        return normalize_number(tail)
    numbers = _NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def exact_match(text: str, reference: str) -> bool:
    return extract_answer(text) == reference


def first_mismatch(output: list[int], expected: list[int]) -> int | None:
    """Index of the first differing token (a length difference counts); None when equal."""
    for i, (a, b) in enumerate(zip(output, expected)):
        if a != b:
            return i
    return None if len(output) == len(expected) else min(len(output), len(expected))
