"""`specq bench` and `specq report`, registered on the main parser by `specq.cli`:

    add_bench_parser(sub)
    add_report_parser(sub)

Every key of a bench TOML file but `servers` (a list of tables) is also a flag (`max_new_tokens`
<-> `--max-new-tokens`), and values are validated by the same function, so a bad flag and a bad
key fail the same way.
"""

from __future__ import annotations

import argparse
import dataclasses

from ..checks import arg_float, arg_int, arg_path
from .config import FILE_ONLY, HELP, KEYS, LIST_KEYS, BenchConfig


def add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="measure speculative decoding over a sweep (resumable)",
                       description="Baseline, speculative and (optionally) transformers-assisted "
                                   "runs over a sweep; results are appended cell by cell and a "
                                   "re-run resumes.")
    b.add_argument("config", nargs="?",
                   help="TOML sweep (e.g. benchmarks/presets/demo.toml); flags override it")
    for f in dataclasses.fields(BenchConfig):
        if f.name in FILE_ONLY:  # the file's alone
            b.set_defaults(**{f.name: None})
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.name in LIST_KEYS:
            kind = LIST_KEYS[f.name]
            kind = (_int_or_word if f.name == "gamma" else _truth if kind is bool
                    else None if kind is str else kind)
            b.add_argument(flag, nargs="+", type=kind, help=HELP[f.name])
        elif isinstance(f.default, bool):
            b.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                           help=HELP[f.name])
        else:
            kind = None if f.default is None or isinstance(f.default, str) else type(f.default)
            b.add_argument(flag, type=kind, help=HELP[f.name])
    b.add_argument("--all-rows", action="store_true",
                   help="show every gamma of a gamma sweep, not just the best")
    b.set_defaults(func=cmd_bench)


def _int_or_word(text: str) -> int | str:
    """gamma values: numbers become ints, words ("auto", or a typo) are left for `validate`."""
    return int(text) if text.lstrip("-").isdigit() else text


def _truth(text: str) -> bool:
    """true / false values (TOML's spelling), as `--suffix-cache false true`."""
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")
    return text.lower() == "true"


def add_report_parser(sub) -> None:
    r = sub.add_parser("report",
                       help="Markdown and self-contained HTML report of a bench results file")
    r.add_argument("results", help="a results JSONL file written by specq bench")
    r.add_argument("--out", type=arg_path, default=None,
                   help="output prefix (default: RESULTS without .jsonl): writes PREFIX.md and "
                        "PREFIX.html")
    r.add_argument("--resamples", type=arg_int(1), default=None,
                   help="bootstrap resamples (default: as in the run)")
    r.add_argument("--confidence", type=arg_float(0.5, 1, below_maximum=True), default=None,
                   help="CI confidence in [0.5, 1) (default: as in the run)")
    r.add_argument("--force", action="store_true",
                   help="replace PREFIX.md and PREFIX.html if they exist")
    r.set_defaults(func=cmd_report)


def cmd_bench(args) -> int:
    from rich.console import Console

    from . import aggregate, runner, tables, terminal
    from .config import load_config

    config = load_config(args.config, {k: getattr(args, k) for k in KEYS})
    status = Console(stderr=True)
    try:
        records = runner.run(config, console=status, log=Console())
    except KeyboardInterrupt:
        status.print(f"interrupted: finished cells are saved in {config.results}; "
                     "run the same command again to resume")
        raise
    rows = aggregate.summarize(records, resamples=config.resamples, confidence=config.confidence,
                               seed=config.seed)
    console = Console()
    terminal.print_table(tables.brief(rows, config.confidence, best_only=not args.all_rows),
                         console)
    if config.profile:
        terminal.print_table(tables.profile(rows), console)
    quality = aggregate.heldout_rows(records)
    if quality:
        terminal.print_table(tables.heldout(quality), console)
    failures = aggregate.failures(rows)
    terminal.print_failures(failures, console)
    console.print(f"results: {config.results}; full report: specq report {config.results}",
                  highlight=False)
    return 1 if failures else 0


def cmd_report(args) -> int:
    from .report import write_report

    md, html = write_report(args.results, args.out, resamples=args.resamples,
                            confidence=args.confidence, force=args.force)
    print(f"wrote {md} and {html}")
    return 0
