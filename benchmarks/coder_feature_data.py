"""Training text for a feature draft of the Qwen2.5-Coder 1.5B target, from what is installed.

Writes OUT/code.jsonl (one Python module per line, from third-party packages of this environment;
the standard library is left out: `long-edit` prompts edit its modules) and OUT/code-prompts.txt
(coding tasks made from public functions' docstrings: "Write a Python function `name(args)` that
...", none of them the bench's own `bench/coding.py` tasks). Deterministic for one environment.

    python benchmarks/coder_feature_data.py --out /tmp/coder-data
    specq distill --target qwen2.5-coder-1.5b --arch feature --texts /tmp/coder-data/code.jsonl \
        --prompts chat /tmp/coder-data/code-prompts.txt ...
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
from pathlib import Path

from specq.bench.coding import CODE_TASKS

PACKAGES = ["fastapi", "jinja2", "click", "httpx2", "anyio", "pydantic", "rich", "matplotlib", "numpy",
            "transformers", "tokenizers", "huggingface_hub", "scipy", "starlette", "uvicorn", "gguf", "tqdm"]
MAX_FILE_CHARS = 20_000  # longer modules are cut (a window is 256 tokens; variety beats length)


def package_files(name: str) -> list[Path]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(list(spec.submodule_search_locations)[0])
    return sorted(p for p in root.rglob("*.py") if "test" not in p.as_posix().lower())


def tasks(tree: ast.Module) -> list[str]:
    """Coding tasks from a module's public, documented top-level functions."""
    out = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = (ast.get_docstring(node) or "").strip().split("\n")[0].strip().rstrip(".")
        if len(doc) < 20 or len(doc) > 160:
            continue
        args = ", ".join(a.arg for a in node.args.args)
        out.append(f"Write a Python function `{node.name}({args})` that does this: {doc[0].lower() + doc[1:]}.")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-prompts", type=int, default=400)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    docs, prompts = [], []
    for name in PACKAGES:
        for path in package_files(name):
            text = path.read_text(encoding="utf-8", errors="replace")
            if len(text) < 400:
                continue
            docs.append(text[:MAX_FILE_CHARS])
            try:
                prompts += tasks(ast.parse(text))
            except SyntaxError:
                pass
    bench = {t.split("`")[1].split("(")[0] for t in CODE_TASKS if "`" in t}
    prompts = [p for p in dict.fromkeys(prompts) if p.split("`")[1].split("(")[0] not in bench]
    prompts = prompts[::max(1, len(prompts) // args.max_prompts)][:args.max_prompts]
    with open(args.out / "code.jsonl", "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}) + "\n")
    (args.out / "code-prompts.txt").write_text("\n".join(prompts) + "\n", encoding="utf-8")
    print(f"{len(docs)} modules ({sum(map(len, docs)) / 1e6:.1f} M characters), {len(prompts)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
