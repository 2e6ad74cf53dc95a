"""Project speculative decoding onto files of 7-8B models' shapes from measured parts, checked
first on the pair that ran (src/specq/bench/tools/projection.py says how). Times nothing: it reads
results files and writes two.

    python benchmarks/project_speed.py    # defaults: the Qwen2.5-Coder pair, the shape files

1. Every speculative chain cell of --target in --cells: its measured decoding speedup beside the
   speedup predicted from its own acceptance, with its own times and with the target's pass costs
   of --passes (--check-out).
2. The cells of the drafts of --draft-models and of draft-free ones, projected onto every file of
   --shapes with specq's measured passes there, over specq's and llama.cpp's plain decoding (--out).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specq.bench.peer_tables import weights_name
from specq.bench.tools import projection

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "docs/results"
CELLS = ["default-draft", "default-draft-512", "ngram-k-auto", "coder-window", "suffix",
         "self-drafts", "projection-pair"]


def _rows(paths: str, machine: str | None) -> list[dict]:
    rows = []
    for path in paths.split(","):
        rows += [r for r in map(json.loads, (ROOT / path).read_text().splitlines())
                 if machine is None or r.get("machine") == machine]
    return rows


def _write(path: str, records: list[dict]) -> None:
    (ROOT / path).write_text("".join(json.dumps(r, separators=(",", ":")) + "\n"
                                     for r in records))
    print(f"{path}: {len(records)} records")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default=",".join(f"{RESULTS}/{c}.jsonl" for c in CELLS),
                    help="bench stores, comma-separated (missing ones are skipped)")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b@gguf", help="the cells' target ref")
    ap.add_argument("--passes", default=f"{RESULTS}/llamacpp-coder.jsonl",
                    help="bench_llamacpp.py rows with the target's forward N passes")
    ap.add_argument("--passes-weights", default="qwen1.5b", help="the target's weights there")
    ap.add_argument("--shapes", default=f"{RESULTS}/llamacpp-shapes.jsonl",
                    help="bench_llamacpp.py rows of the shape files")
    ap.add_argument("--machine", default="epyc-zen4-avx512",
                    help="the rows of this machine in --passes and --shapes")
    ap.add_argument("--draft-models", default="qwen2.5-coder-0.5b",
                    help="models whose drafts are projected (draft-free drafts always are)")
    ap.add_argument("--check-out", default=f"{RESULTS}/projection-check.jsonl")
    ap.add_argument("--out", default=f"{RESULTS}/projection-7b.jsonl")
    args = ap.parse_args()

    cells = []
    for path in args.cells.split(","):
        if (ROOT / path).is_file():
            cells += projection.read_cells(ROOT / path, args.target, name=path)
        else:
            print(f"{path}: not there, skipped")
    if not cells:
        print(f"error: no speculative chain cells of {args.target} in --cells", file=sys.stderr)
        return 2

    passes = _rows(args.passes, args.machine)
    costs = projection.pass_costs(passes, args.passes_weights)
    source = f"{args.passes} {args.passes_weights} ({args.machine})"
    checks = []
    for c in cells:  # a fixed gamma also predicted from a longer one's counts of the same draft
        longer = projection.longest_chain(cells, c, same_stop=True) if c.counted else None
        if longer and longer[0].longest <= int(c.params["gamma"]):
            longer = None
        checks.append(projection.check_record(c, costs, source, longer))
    _write(args.check_out, checks)

    models = set(args.draft_models.split(","))
    shapes = _rows(args.shapes, args.machine)
    files = dict.fromkeys(r["weights"] for r in shapes if r["measurement"] == "forward 1")
    records = [projection.shape_record(c, weights_name(w), shapes, w,
                                       None if c.counted else projection.longest_chain(cells, c))
               for w in files for c in cells
               if c.model is None or c.model.split("@")[0] in models]
    _write(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
