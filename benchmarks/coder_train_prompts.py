"""The bench's code and edit prompts that no measurement uses (past the first HELD_OUT of each), as
a prompt file for `specq distill --prompts` (one JSON object a line, a `prompt` field): what the
Qwen2.5-Coder chat adapter of docs/drafts.md was trained on beside the built-in chat prompts.

    python benchmarks/coder_train_prompts.py --out coder-train-prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from coder_head_tokens import HELD_OUT


def main() -> None:
    from specq.bench.coding import CODE_TASKS, EDIT_TASKS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    tasks = CODE_TASKS[HELD_OUT:] + EDIT_TASKS[HELD_OUT:]
    args.out.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in tasks))
    print(f"{len(tasks)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
