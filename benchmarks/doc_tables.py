"""Regenerate the tables in the docs from their raw results files, so no table is typed by hand.

A generated table sits between two markers in a Markdown file; the first names its results file,
the kind of table and its filters:

    <!-- table: docs/results/sweep.jsonl pivot value=speedup by=gamma tokens=64 -->
    ...
    <!-- /table -->

Kinds: `pivot` (one row per target and draft, one column per value of `by`: gamma or
max_new_tokens; `value` speedup or tau; `ci=1` adds the 95% CIs; the best speedup of a row is in
bold), `cells` (one row per configuration: speedup with CI, predicted, tau, U_i, draft share) and
`summary` (the README's: per configuration the target's plain tokens/s, the speculative tokens/s,
the paired speedup with CI and tau), `sets` (one row per target, draft and prompt set: plain
tokens/s, then per gamma the paired speedup with CI and tau), with the filters `tokens=N` and
`gamma=N` (or `auto`);
`calibration` (the calibration experiment's JSON, rows in the order `order=spec,spec,...`);
`verify` (benchmarks/bench_verify.py's rows: ms per forward by precision, path and token count);
`tree-verify` (benchmarks/bench_tree_verify.py's rows: ms per tree verify pass by precision and
node count);
`llamacpp` (benchmarks/bench_llamacpp.py's rows: llama.cpp and specq side by side), `llamacpp-setups`
(its rows of runs labelled by set-up: one line per set-up), `goals` (the speculation goals met or
not by its runs: results files comma-separated, one per prompt kind, `kinds=code,edit,chat` naming
them), `gamma-interleaved`
(benchmarks/bench_gamma.py's rows: gamma `auto` and fixed gammas, each run paired with a plain run of
its prompt and round), `versions`
(benchmarks/bench_versions.py's rows: two commits side by side).
`serve-batch` (benchmarks/bench_serve.py's rounds: tokens/s, latency and TTFT per precision,
clients, mode and --max-batch); `load` and `load-forms` (benchmarks/bench_load.py's rows: load time and
memory per file; its packed weights by format); `coder-drafts` (benchmarks/bench_coder_drafts.py's
rows: acceptance of drafts for the 1.5B coder target, with CIs); `step-profile`
(benchmarks/profile_step.py's rows: a step and an 8-row pass, whole and linear layers alone, and
the machine's read rate).
`qad` (docs/results/qad.jsonl: `part=settings`, benchmarks/qad_settings.py's short trainings;
`part=runs`, the `specq qad` runs' held-out KL and top-1 before and after; `part=compare`,
`specq compare` of the float target with plain and QAD targets; `part=acceptance`, the shipped
drafts' acceptance on them).

    python benchmarks/doc_tables.py            # rewrite the tables in README.md and docs/*.md
    python benchmarks/doc_tables.py --check    # exit 1, with a diff, when a table is stale
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from functools import cache
from pathlib import Path

from sweep_tables import draft_label, pivot

from specq.bench import store
from specq.bench.aggregate import summarize
from specq.core.gamma import sort_key as gamma_order

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- table: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


@cache
def summarized(results: str, by_set: bool = False) -> tuple[dict, ...]:
    return tuple(summarize(store.read(ROOT / results), by_set=by_set))


def _filtered(rows, options: dict) -> list[dict]:
    out = list(rows)
    if "tokens" in options:
        out = [r for r in out if r["max_new_tokens"] == int(options["tokens"])]
    if "gamma" in options:
        out = [r for r in out if str(r["gamma"]) == options["gamma"]]
    return out


def _ci(value, spec: str = ".2f") -> str:
    if not value:
        return "-"
    mean, low, high = value
    return f"{mean:{spec}} [{low:{spec}}, {high:{spec}}]" if low != high else format(mean, spec)


def cells_table(rows: list[dict]) -> str:
    width = max((len(r["U"]) for r in rows), default=0)
    head = ("| target | draft | gamma | tokens | speedup [95% CI] | predicted | tau | "
            + ", ".join(f"U_{i + 1}" for i in range(width)) + " | draft share |")
    lines = [head, "|" + "---|" * 9]
    for r in sorted(rows, key=lambda r: (r["target"], draft_label(r), gamma_order(r["gamma"]), r["max_new_tokens"])):
        u = ", ".join(f"{v[0]:.2f}" for v in r["U"] if v)
        predicted = "-" if r["predicted_speedup"] is None else f"{r['predicted_speedup']:.2f}"
        lines.append(f"| {r['target_precision']} | {draft_label(r)} | {r['gamma']} | {r['max_new_tokens']} | "
                     f"{_ci(r['speedup'])} | {predicted} | {r['tau'][0]:.2f} | {u} | {r['draft_share'][0]:.2f} |")
    return "\n".join(lines)


BASELINE_KEY = ("target", "max_new_tokens", "set", "threads", "temperature")  # a configuration's own baseline


def _plain_rates(baselines: list[dict]) -> dict[tuple, float]:
    """Each baseline's tokens/s by its BASELINE_KEY values."""
    return {tuple(b[k] for k in BASELINE_KEY): b["tokens_per_s"][0] for b in baselines}


def summary_table(rows: list[dict], baselines: list[dict]) -> str:
    """What a user compares: the target alone against speculative decoding, per configuration."""
    plain = _plain_rates(baselines)
    lines = ["| target | plain tok/s | draft | gamma | speculative tok/s | speedup [95% CI] | tau |",
             "|" + "---|" * 7]
    for r in sorted(rows, key=lambda r: (r["target"], draft_label(r), gamma_order(r["gamma"]))):
        base = plain.get(tuple(r[k] for k in BASELINE_KEY))
        lines.append(f"| {r['target_precision']} | {'-' if base is None else f'{base:.1f}'} | {draft_label(r)} | "
                     f"{r['gamma']} | {r['tokens_per_s'][0]:.1f} | {_ci(r['speedup'])} | {r['tau'][0]:.2f} |")
    return "\n".join(lines)


def sets_table(rows: list[dict], baselines: list[dict]) -> str:
    """One row per target, draft and prompt set: the target's plain tokens/s, then per gamma the
    paired speedup with its CI (the row's best in bold) and tau."""
    plain = _plain_rates(baselines)
    gammas = sorted({r["gamma"] for r in rows}, key=gamma_order)
    keyed: dict[tuple, dict] = {}
    for r in rows:
        keyed.setdefault((r["target"], draft_label(r), r["set"], tuple(r[k] for k in BASELINE_KEY)), {})[r["gamma"]] = r
    lines = ["| target | draft | prompts | plain tok/s | " + " | ".join(f"gamma {g}" for g in gammas)
             + " | " + " | ".join(f"tau, gamma {g}" for g in gammas) + " |", "|" + "---|" * (4 + 2 * len(gammas))]
    for (target, draft, prompt_set, key), by in sorted(keyed.items(), key=lambda kv: kv[0][:3]):
        best = max(by, key=lambda g: by[g]["speedup"][0])
        speedups = [("**" + _ci(by[g]["speedup"]) + "**" if g == best else _ci(by[g]["speedup"])) if g in by else "-"
                    for g in gammas]
        taus = [f"{by[g]['tau'][0]:.2f}" if g in by else "-" for g in gammas]
        base = plain.get(key)
        lines.append(f"| {next(iter(by.values()))['target_precision']} | {draft} | {prompt_set} | "
                     f"{'-' if base is None else f'{base:.1f}'} | " + " | ".join(speedups + taus) + " |")
    return "\n".join(lines)


def jsonl(results: str) -> list[dict]:
    """The rows of a JSON-lines results file (a path from the repository root)."""
    return [json.loads(line) for line in (ROOT / results).read_text().splitlines() if line.strip()]


def calibration_table(results: str, order: list[str]) -> str:
    from calibration_experiment import table

    rows = json.loads((ROOT / results).read_text())["rows"]
    return table({spec: rows[spec] for spec in order})


def verify_table(results: str) -> str:
    from bench_verify import table

    return table(jsonl(results))


def tree_verify_table(results: str) -> str:
    from bench_tree_verify import table

    return table(jsonl(results))


def llamacpp_table(results: str) -> str:
    from bench_llamacpp import summary

    return summary(jsonl(results))


def goals_table(results: str, kinds: list[str]) -> str:
    from bench_llamacpp import goals_summary

    files = results.split(",")
    if len(files) != len(kinds):
        raise SystemExit(f"table 'goals': {len(files)} results files for {len(kinds)} kinds")
    return goals_summary([(kind, jsonl(f)) for kind, f in zip(kinds, files)])


def llamacpp_setups_table(results: str) -> str:
    from bench_llamacpp import setups_summary

    return setups_summary(jsonl(results))


def gamma_interleaved_table(results: str) -> str:
    from bench_gamma import summary

    return summary(jsonl(results))


def versions_table(results: str) -> str:
    from bench_versions import summary

    return summary(jsonl(results))


def serve_batch_table(results: str) -> str:
    from bench_serve import load_table

    return load_table(jsonl(results))


def bench_load_table(results: str, forms: bool) -> str:
    from bench_load import forms_table, table

    rows = jsonl(results)
    return forms_table(rows) if forms else table(rows)


def _mean_ci(m: dict, digits: int) -> str:
    return f"{m['mean']:.{digits}f} [{m['low']:.{digits}f}, {m['high']:.{digits}f}]"


def qad_table(results: str, part: str) -> str:
    """docs/results/qad.jsonl: `settings` (benchmarks/qad_settings.py's short trainings), `runs`
    (one row per `specq qad` run: held-out KL and top-1 against the float teacher before and after)
    `compare` (one row per `specq compare` of the float target with a quantized one: perplexities,
    top-1 and KL with 95% CIs) or `acceptance` (benchmarks/qad_acceptance.py's rows)."""
    rows = jsonl(results)

    def moved(r: dict, key: str, digits: int = 3) -> str:
        return f"{r['held_out_before'][key]:.{digits}f} -> {r['held_out_after'][key]:.{digits}f}"

    def training(r: dict, name: str, lrs: dict, fourth, s_per_step: float) -> str:
        """A training's line: its rates, one more column, steps, seconds a step, held-out moves."""
        return (f"| {name} | {lrs['lr']:g} | {lrs['code_lr']:g} | {fourth:g} | {r['steps']} | {s_per_step:.1f} | "
                f"{moved(r, 'kl')} | {moved(r, 'top1')} |")

    if part == "settings":
        out = ["| from | scales' lr | codes' lr | norms' lr | steps | s / step | held-out KL | held-out top-1 |",
               "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["kind"] == "qad_setting":
                c = r["config"]
                norms = c.get("vec", 0.05 * max(c["lr"], c["code_lr"]))
                out.append(training(r, r["spec"], c, norms, r["s_per_step"]))
    elif part == "runs":
        out = ["| result | scales' lr | codes' lr | threads | steps | s / step | held-out KL | held-out top-1 |",
               "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["kind"] == "qad_run":
                out.append(training(r, r["result"], r["settings"], r["threads"], r["train_s"] / max(1, r["steps"])))
    elif part == "compare":
        out = ["| B | ppl A (fp32) | ppl B | top-1 vs fp32 | KL(A, B) |", "|---|---|---|---|---|"]
        for r in rows:
            if r["kind"] == "compare":
                out.append(f"| {r['b']} | {_mean_ci(r['ppl_a'], 1)} | {_mean_ci(r['ppl_b'], 1)} | {_mean_ci(r['top1'], 3)} | "
                           f"{_mean_ci(r['kl_ab'], 3)} |")
    elif part == "acceptance":
        out = ["| target | draft | acceptance rate | tau |", "|---|---|---|---|"]
        for r in rows:
            if r["kind"] == "qad_acceptance":
                rate, tau = ({"mean": m, "low": lo, "high": hi} for m, lo, hi in (r["acceptance_rate"], r["tau"]))
                out.append(f"| {r['target']} | {r['draft']} | {_mean_ci(rate, 3)} | {_mean_ci(tau, 2)} |")
    else:
        raise SystemExit(f"qad table: unknown part {part!r} (settings, runs, compare or acceptance)")
    return "\n".join(out)


def step_profile_table(results: str) -> str:
    from profile_step import table

    return table(jsonl(results))


def coder_drafts_table(results: str) -> str:
    from bench_coder_drafts import table

    return table(jsonl(results))


def render(spec: str) -> str:
    results, kind, *args = spec.split()
    options = dict(a.split("=", 1) for a in args)
    if kind == "calibration":
        return calibration_table(results, options["order"].split(","))
    if kind == "verify":
        return verify_table(results)
    if kind == "tree-verify":
        return tree_verify_table(results)
    if kind == "llamacpp":
        return llamacpp_table(results)
    if kind == "llamacpp-setups":
        return llamacpp_setups_table(results)
    if kind == "goals":
        return goals_table(results, options["kinds"].split(","))
    if kind == "gamma-interleaved":
        return gamma_interleaved_table(results)
    if kind == "versions":
        return versions_table(results)
    if kind == "serve-batch":
        return serve_batch_table(results)
    if kind == "coder-drafts":
        return coder_drafts_table(results)
    if kind == "step-profile":
        return step_profile_table(results)
    if kind in ("load", "load-forms"):
        return bench_load_table(results, kind == "load-forms")
    if kind == "qad":
        return qad_table(results, options.get("part", "runs"))
    summary = summarized(results, by_set=kind == "sets")  # per prompt set, or pooled over the sets
    rows = _filtered((r for r in summary if r["kind"] == "speculative"), options)
    if not rows:
        raise SystemExit(f"table '{spec}': no matching rows in {results}")
    baselines = [r for r in summary if r["kind"] == "baseline"]
    if kind == "cells":
        return cells_table(rows)
    if kind == "summary":
        return summary_table(rows, baselines)
    if kind == "sets":
        return sets_table(rows, baselines)
    if kind != "pivot":
        raise SystemExit(f"table '{spec}': unknown kind {kind!r}")
    by = options.get("by", "gamma")
    columns = sorted({r[by] for r in rows}, key=gamma_order if by == "gamma" else None)
    text = pivot(rows, by, columns, options.get("value", "speedup"), "", with_ci=options.get("ci") == "1")
    return "\n".join(text.splitlines()[2:])  # without pivot's title: the doc's prose introduces it


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("spec")) + "\n" + m.group(4), text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report stale tables and exit 1; change nothing")
    args = ap.parse_args()
    stale = 0
    for path in DOCS:
        old = path.read_text()
        new = regenerate(old)
        if new == old:
            continue
        stale += 1
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       str(path.relative_to(ROOT)), "regenerated"))
        else:
            path.write_text(new)
            print(f"rewrote the tables of {path.relative_to(ROOT)}")
    if args.check and stale:
        print(f"\n{stale} file(s) hold tables that no longer match their results: "
              "run python benchmarks/doc_tables.py")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
