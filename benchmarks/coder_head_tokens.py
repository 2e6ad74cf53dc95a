"""The ranked token list behind a narrowed draft head for the Qwen2.5-Coder vocabulary
(`qwen2.5-coder-0.5b@gguf-head32k`, `loading/file_spec.py`): which tokens the 1.5B target writes.

    python benchmarks/coder_head_tokens.py answers   # the target's greedy answers (resumable JSONL)
    python benchmarks/coder_head_tokens.py rank      # rank tokens, write src/specq/assets/heads/

Ranking: tokens of the target's own greedy answers (128 new tokens, chat template) on the bench's
code and edit prompts *past the first HELD_OUT of each* (those are where acceptance is measured) and on
the first CHAT chat prompts of the training split, by count; then every other token by its count in the Python
sources of the installed packages (sorted paths, up to SOURCE_CHARS characters); ties towards lower
ids. The loader always adds the file's special tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

import numpy as np

HELD_OUT = 4  # the first code and edit prompts: acceptance is measured there, not ranked on
CHAT = 24  # chat prompts of the training split answered
SOURCE_CHARS = 24_000_000
RANKED = 65536  # ids written: any head up to 64k tokens takes a prefix
ANSWERS = Path("benchmarks/results/coder-head-answers.jsonl")
HEADS = Path("src/specq/assets/heads")
NAME = "qwen2.5-coder"  # HEADS / NAME.npy (ranked ids, int32) and NAME.json (what they were made for)


def prompts() -> list[tuple[str, int, str]]:
    from specq.bench.coding import CODE_TASKS, EDIT_TASKS
    from specq.data import chat_prompts

    return ([("code", i, t) for i, t in enumerate(CODE_TASKS) if i >= HELD_OUT]
            + [("edit", i, t) for i, t in enumerate(EDIT_TASKS) if i >= HELD_OUT]
            + [("chat", i, t) for i, t in enumerate(chat_prompts("train")[:CHAT])])


def answers(limit: int) -> None:
    """Append the target's greedy answers not yet in ANSWERS (speculative with the 0.5B: the same tokens)."""
    import torch

    import specq

    torch.set_num_threads(2)
    done = {(r["set"], r["index"]) for r in map(json.loads, ANSWERS.read_text().splitlines())} if ANSWERS.exists() else set()
    todo = [p for p in prompts() if p[:2] not in done][:limit]
    target, draft = specq.load("qwen2.5-coder-1.5b"), specq.load("qwen2.5-coder-0.5b")
    ANSWERS.parent.mkdir(parents=True, exist_ok=True)
    for kind, index, text in todo:
        out = specq.generate(target, text, draft, gamma=2, max_new_tokens=128, chat=True)
        with ANSWERS.open("a") as f:
            f.write(json.dumps({"set": kind, "index": index, "ids": out.token_ids}) + "\n")
        print(kind, index, len(out.token_ids), file=sys.stderr, flush=True)


def source_text() -> str:
    """Python sources of the installed packages, in sorted path order, up to SOURCE_CHARS characters."""
    parts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["purelib"]).rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(text)
        size += len(text)
        if size >= SOURCE_CHARS:
            break
    return "".join(parts)


def rank() -> None:
    from specq.loading import gguf_io
    from specq.loading.builtins import BUILTIN_GGUF
    from specq.loading.file_spec import vocabulary_digest
    from specq.loading.gguf_load import tokenizer as gguf_tokenizer

    path = BUILTIN_GGUF["qwen2.5-coder-1.5b"]()
    tok = gguf_tokenizer(path)
    vocab = gguf_io.read(path).config.vocab_size  # the head's rows (the tokenizer's ids and padding)
    answer_counts = np.zeros(vocab, dtype=np.int64)
    rows = [json.loads(line) for line in ANSWERS.read_text().splitlines()]
    for r in rows:
        answer_counts += np.bincount(r["ids"], minlength=vocab)
    text = source_text()
    chunks = [text[i:i + 1_000_000] for i in range(0, len(text), 1_000_000)]
    source_counts = np.zeros(vocab, dtype=np.int64)
    for ids in tok(chunks, add_special_tokens=False)["input_ids"]:
        source_counts += np.bincount(ids, minlength=vocab)
    order = np.lexsort((np.arange(vocab), -source_counts, -answer_counts))[:RANKED]
    HEADS.mkdir(parents=True, exist_ok=True)
    np.save(HEADS / f"{NAME}.npy", order.astype(np.int32))
    meta = {"vocabulary_sha256": vocabulary_digest(tok), "vocab_size": vocab, "ranked": RANKED,
            "answers": len(rows), "answer_tokens": int(answer_counts.sum()),
            "answer_distinct": int((answer_counts > 0).sum()), "source_chars": len(text),
            "source_tokens": int(source_counts.sum()), "how": "benchmarks/coder_head_tokens.py"}
    (HEADS / f"{NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("answers", "rank"))
    parser.add_argument("--limit", type=int, default=1000, help="answers: at most this many new prompts")
    args = parser.parse_args()
    answers(args.limit) if args.step == "answers" else rank()


if __name__ == "__main__":
    main()
