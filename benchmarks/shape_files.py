"""Write GGUF files of real 3-8B models' shapes: exact tensor names, shapes, types and metadata,
random valid blocks, a shipped tokenizer (src/specq/bench/tools/shapes.py says how and why).

    python benchmarks/shape_files.py --out benchmarks/results/shapes            # the default set
    python benchmarks/shape_files.py --files qwen2.5-7b:Q4_K_M --out DIR

Each file is DIR/SHAPE-TYPE.gguf (about 25 GB for the default set); one already there is kept.
The Qwen shapes borrow the Qwen2.5-Coder 1.5B file's tokenizer (`make setup-coder`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specq.bench.tools import shapes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = ",".join(f"{s}:{t}" for s, t in shapes.DEFAULT_FILES)
    ap.add_argument("--files", default=default,
                    help=f"SHAPE:TYPE, comma-separated (shapes: {', '.join(shapes.SHAPES)}; "
                         f"types: {', '.join(shapes.FILE_TYPES)}; default {default})")
    ap.add_argument("--out", type=Path, required=True, help="folder of the files")
    args = ap.parse_args()
    wanted = [tuple(item.split(":", 1)) for item in args.files.split(",")]
    for item in wanted:
        if len(item) != 2 or item[0] not in shapes.SHAPES or item[1] not in shapes.FILE_TYPES:
            print(f"error: '{':'.join(item)}' is not SHAPE:TYPE of {', '.join(shapes.SHAPES)} "
                  f"and {', '.join(shapes.FILE_TYPES)}", file=sys.stderr)
            return 2
    for name, kind in wanted:
        out = args.out / f"{name}-{kind}.gguf"
        if out.exists():
            print(f"{out}: there already")
            continue
        shape = shapes.SHAPES[name]
        began = time.perf_counter()
        shapes.write(shape, kind, shapes.tokenizer_file(shape.tokenizer), out)
        print(f"{out}: {out.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
