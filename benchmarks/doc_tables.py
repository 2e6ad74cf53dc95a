"""Regenerate the tables in README.md and docs/*.md from their raw results files in docs/results
(`specq.bench.doc_tables` says how a table is marked and which kinds there are).

    python benchmarks/doc_tables.py            # rewrite the stale tables
    python benchmarks/doc_tables.py --check    # exit 1, with a diff, when a table is stale
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from specq.bench.doc_tables import regenerate

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="report stale tables and exit 1; change nothing")
    args = ap.parse_args()
    stale = 0
    for path in DOCS:
        old = path.read_text()
        new = regenerate(old, ROOT)
        if new == old:
            continue
        stale += 1
        name = str(path.relative_to(ROOT))
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       name, "regenerated"))
        else:
            path.write_text(new)
            print(f"rewrote the tables of {name}")
    if args.check and stale:
        print(f"\n{stale} file(s) hold tables that no longer match their results: "
              "run python benchmarks/doc_tables.py")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
