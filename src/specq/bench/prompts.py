"""Prompt sets for benchmarks, deterministic so every cell of a sweep sees the same prompts.

- chat: the held-out built-in chat prompts (never used to train the shipped draft)
- gsm8k: the shipped GSM8K problems, asked in chat form; the reference answer is kept for EM
- code: writing a function from a description (`bench.coding.CODE_TASKS`)
- edit: editing a given file and returning it whole (`bench.coding.EDIT_TASKS`)
- long-edit: the same with modules of Python's standard library, about 1.5-6 thousand tokens each
  (`bench.coding.long_edit_tasks`)
- corpus: continuations of held-out Shakespeare passages (raw text, no chat template)
- file: a user file (`specq.data.user_texts`: .jsonl with one object per line, or plain text)
"""

from __future__ import annotations

from dataclasses import dataclass

SETS = ("chat", "gsm8k", "code", "edit", "long-edit", "corpus", "file")
GSM8K_INSTRUCTION = "Solve this step by step. End with the final answer as '#### <number>'."
CORPUS_CHARS = 600  # about 150 tokens of context per continuation


@dataclass(frozen=True)
class Prompt:
    set: str
    index: int
    text: str
    chat: bool  # apply the tokenizer's chat template
    reference: str | None = None  # the normalised GSM8K answer


def load_set(name: str, n: int, file: str | None = None, field: str = "text",
             file_chat: bool = True) -> list[Prompt]:
    """The first `n` prompts of a set (fewer when the set is smaller)."""
    from .. import data
    from .coding import CODE_TASKS, EDIT_TASKS, long_edit_tasks
    from .quality import reference_answer

    if name == "chat":
        return [Prompt(name, i, t, True) for i, t in enumerate(data.chat_prompts("held_out")[:n])]
    if name == "gsm8k":
        return [Prompt(name, i, f"{p['question']}\n{GSM8K_INSTRUCTION}", True,
                       reference_answer(p["answer"]))
                for i, p in enumerate(data.gsm8k_problems()[:n])]
    if name in ("code", "edit"):
        tasks = CODE_TASKS if name == "code" else EDIT_TASKS
        return [Prompt(name, i, t, True) for i, t in enumerate(tasks[:n])]
    if name == "long-edit":
        return [Prompt(name, i, t, True) for i, t in enumerate(long_edit_tasks()[:n])]
    if name == "corpus":
        return [Prompt(name, i, t, False) for i, t in enumerate(corpus_passages(n))]
    if name == "file":
        return [Prompt(name, i, t, file_chat)
                for i, t in enumerate(data.user_texts(file, field)[:n])]
    raise ValueError(f"unknown prompt set {name!r}")


def corpus_passages(n: int) -> list[str]:
    """`n` passages spread evenly through the held-out plays, each starting at a line start (fewer
    when the plays hold fewer that do not overlap)."""
    from .. import data

    _, plays = data.split(data.shakespeare_texts())
    most = min(len(p) for p in plays) // CORPUS_CHARS - 1  # passages per play that never overlap
    per_play = min(-(-n // len(plays)), most)
    out = []
    for k in range(min(n, per_play * len(plays))):
        text = plays[k % len(plays)]
        offset = len(text) * (k // len(plays) + 1) // (per_play + 1)
        start = text.find("\n", offset) + 1
        passage = text[start: start + CORPUS_CHARS]
        out.append(passage[: passage.rfind("\n")].strip() or passage)
    return out
