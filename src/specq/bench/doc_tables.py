"""The docs' tables, generated from their raw results files, so no table is typed by hand.

A generated table sits between two markers in a Markdown file; the first names its results files
(comma-separated, from the repository root), the kind of table and its options:

    <!-- table: docs/results/llamacpp-coder.jsonl llamacpp -->
    ...
    <!-- /table -->

`regenerate` rewrites every such block from its files; `benchmarks/doc_tables.py --check` fails
when a doc's table is not what its files give. Every JSON-lines kind takes `machine=NAME` (the
rows whose "machine" field is NAME); the kinds and their own options are in `KINDS`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..core.gamma import sort_key as gamma_order
from ..loading.refs import model_ref
from . import peer_tables, result_tables, store
from .aggregate import summarize
from .tools import llamacpp, projection, roof, serve_storm, versions

BLOCK = re.compile(r"(<!-- table: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@cache
def _summarized(path: Path, by_set: bool) -> tuple[dict, ...]:
    return tuple(summarize(store.read(path), by_set=by_set))


def _ci(value, spec: str = ".2f") -> str:
    if not value:
        return "-"
    mean, low, high = value
    return f"{mean:{spec}} [{low:{spec}}, {high:{spec}}]" if low != high else format(mean, spec)


def draft_label(row: dict) -> str:
    """A summary row's draft: its kind ('self', 'seq', 'feature' or its name), precision, window,
    early stop and tree; a hierarchy's levels cheapest first."""
    stop = f", stop {row['draft_confidence']}" if row.get("draft_confidence") else ""
    tree = f", tree {row['tree']} k{row['tree_topk']}" if row.get("tree") else ""  # gamma: depth
    levels = row["draft"].split(",")
    if len(levels) > 1:
        precisions = [model_ref(level).base.rpartition("@")[2] if "@" in level else None
                      for level in levels]  # None: an n-gram lookup, no model
    else:
        precisions = [row["draft_precision"]]
    target = row["target"].split("@")[0]
    labels = (_level_label(level, p, target) for level, p in zip(levels, precisions))
    suffix = ", suffix cache" if row.get("suffix_cache") else ""
    return " > ".join(labels) + stop + tree + suffix


KINDS_OF_DRAFTS = {"smollm2-135m-draft": "seq", "smollm2-135m-draft-int4-g64-rtn": "seq, int4-cal",
                   "smollm2-135m-feature-draft": "feature"}


def _level_label(level: str, precision: str | None, target: str) -> str:
    lookup, plus, model = level.partition("+")
    if plus and lookup.startswith("ngram"):  # ngram+MODEL: the lookup, then its model's label
        return f"{lookup}+{_level_label(model, precision, target)}"
    ref = model_ref(level)
    if ref.skips is not None:  # MODEL@skip: some of MODEL's own layers
        return f"{_level_label(ref.name, None, target)}, layers skipped"
    name = Path(ref.name).name
    kind = "self" if name == Path(target).name else KINDS_OF_DRAFTS.get(name, name)
    window = f", window {ref.window}" if ref.window else ""
    return kind + (f" @{precision}" if precision else "") + window


def cells(rows: list[dict]) -> str:
    """One row per configuration of a `specq bench` results file: the paired speedup with its CI,
    the analytic prediction, tau, per-position acceptance and the draft's share of the time."""
    width = max((len(r["U"]) for r in rows), default=0)
    lines = ["| target | draft | gamma | tokens | speedup [95% CI] | predicted | tau | "
             + ", ".join(f"U_{i + 1}" for i in range(width)) + " | draft share |", "|" + "---|" * 9]

    def order(r: dict) -> tuple:
        return r["target"], draft_label(r), gamma_order(r["gamma"]), r["max_new_tokens"]

    for r in sorted(rows, key=order):
        predicted = "-" if r["predicted_speedup"] is None else f"{r['predicted_speedup']:.2f}"
        per_position = ", ".join(f"{v[0]:.2f}" for v in r["U"] if v)
        lines.append(f"| {r['target_precision']} | {draft_label(r)} | {r['gamma']} | "
                     f"{r['max_new_tokens']} | {_ci(r['speedup'])} | {predicted} | "
                     f"{r['tau'][0]:.2f} | {per_position} | {r['draft_share'][0]:.2f} |")
    return "\n".join(lines)


BASELINE_KEY = ("target", "max_new_tokens", "set", "threads", "temperature")  # its own baseline


def target_label(row: dict) -> str:
    """A summary row's target: its file or folder name (a path's last part) at its precision."""
    ref = model_ref(row["target"])
    return f"{Path(ref.name).name}@{row['target_precision']}"


def sets(rows: list[dict], baselines: list[dict]) -> str:
    """One row per target, draft and prompt set of a `specq bench` results file: the target's
    plain tokens/s, then per gamma the paired speedup with its CI (the row's best in bold) and
    tau, and the best gamma's speedup of decoding alone (prefill left out)."""
    plain = {tuple(b[k] for k in BASELINE_KEY): b["tokens_per_s"][0] for b in baselines}
    gammas = sorted({r["gamma"] for r in rows}, key=gamma_order)
    keyed: dict[tuple, dict] = {}
    for r in rows:
        key = (r["target"], draft_label(r), r["set"], tuple(r[k] for k in BASELINE_KEY))
        keyed.setdefault(key, {})[r["gamma"]] = r
    lines = ["| target | draft | prompts | plain tok/s | "
             + " | ".join(f"gamma {g}" for g in gammas) + " | "
             + " | ".join(f"tau, gamma {g}" for g in gammas) + " | decode alone |",
             "|" + "---|" * (5 + 2 * len(gammas))]
    for (_, draft, prompt_set, key), by in sorted(keyed.items(), key=lambda kv: kv[0][:3]):
        best = max(by, key=lambda g: by[g]["speedup"][0])
        speedups = ["-" if g not in by else f"**{_ci(by[g]['speedup'])}**" if g == best
                    else _ci(by[g]["speedup"]) for g in gammas]
        taus = [f"{by[g]['tau'][0]:.2f}" if g in by else "-" for g in gammas]
        base, decode = plain.get(key), by[best].get("decode_speedup")
        lines.append(f"| {target_label(next(iter(by.values())))} | {draft} | {prompt_set} | "
                     f"{'-' if base is None else f'{base:.1f}'} | " + " | ".join(speedups + taus)
                     + f" | {'-' if decode is None else _ci(decode)} |")
    return "\n".join(lines)


def acceptance(rows: list[dict], order: list[str]) -> str:
    """One row per target precision, draft and temperature of a `specq bench` results file, a
    column group per prompt set: the acceptance rate with its CI, per-position acceptance U_1..
    and tau, none of which a fixed gamma's timing moves (speedups: `sets`). Targets in the order
    the sweep listed them (`order`)."""
    kinds = sorted({r["set"] for r in rows})
    keyed: dict[tuple, dict] = {}
    for r in rows:
        key = (r["target"], draft_label(r), r["temperature"], r["gamma"])
        keyed.setdefault(key, {})[r["set"]] = r
    head = ["target", "draft", "T"] + [f"{k}: {c}" for k in kinds
                                       for c in ("acceptance", "U_1..U_g", "tau")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rank = {t: i for i, t in enumerate(order)}
    for key in sorted(keyed, key=lambda k: (rank.get(k[0], len(rank)), k[0], k[1], k[2])):
        by = keyed[key]
        cells = []
        for k in kinds:
            r = by.get(k)
            per_position = "-" if r is None else " ".join(f"{u[0]:.2f}" for u in r["U"] if u)
            cells += (["-"] * 3 if r is None else
                      [_ci(r["acceptance_rate"], ".3f"), per_position, f"{r['tau'][0]:.2f}"])
        lines.append(f"| {target_label(next(iter(by.values())))} | {key[1]} | {key[2]:g} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def servers(rows: list[dict], baselines: list[dict]) -> str:
    """One row per server and prompt set of an `engine = "openai"` results store (one engine
    measured from outside): the baseline server's tokens/s and ms per token after the first, then
    each speculative server's paired speedup, tau, acceptance, ms per token, time to the first
    token (medians over prompts) and how its outputs compared with the baseline's."""
    plain = {tuple(b[k] for k in BASELINE_KEY): b for b in baselines}
    lines = ["| prompts | server | plain tok/s | speedup [95% CI] | tau | acceptance | "
             "ms per token, plain / speculative | first token ms, plain / speculative | outputs |",
             "|" + "---|" * 9]
    for r in sorted(rows, key=lambda r: (r["set"], r["draft"])):
        base = plain.get(tuple(r[k] for k in BASELINE_KEY))
        same = "differ" if r["mismatches"] else f"identical ({r['compared']})"

        def both(field: str) -> str:
            ours = f"{r[field][0]:.1f}" if r.get(field) else "-"
            return f"{base[field][0]:.1f} / {ours}" if base and base.get(field) else f"- / {ours}"

        acceptance = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate'][0]:.2f}"
        tau = "-" if r["tau"] is None else f"{r['tau'][0]:.2f}"
        rate = "-" if base is None else f"{base['tokens_per_s'][0]:.1f}"
        lines.append(f"| {r['set']} | {r['draft']} | {rate} | "
                     f"{_ci(r['speedup'])} | {tau} | {acceptance} | {both('itl_ms')} | "
                     f"{both('ttft_ms')} | {same} |")
    return "\n".join(lines)


def _bench(paths: list[Path], options: dict, by_set: bool) -> tuple[list[dict], list[dict]]:
    """The speculative rows (`tokens=N`, `gamma=G` keep those) and the baselines of one results
    store, those at `temperature=T` alone when given."""
    [path] = paths
    summary = [r for r in _summarized(path, by_set) if "temperature" not in options
               or r["temperature"] == float(options["temperature"])]
    rows = [r for r in summary if r["kind"] == "speculative"
            and ("tokens" not in options or r["max_new_tokens"] == int(options["tokens"]))
            and ("gamma" not in options or str(r["gamma"]) == options["gamma"])]
    return rows, [r for r in summary if r["kind"] == "baseline"]


def _sweep_targets(paths: list[Path]) -> list[str]:
    """The target refs of a results store's sweep, in the order its config listed them."""
    for record in store.read(paths[0]):
        if record.get("type") == "run":
            return list(record.get("config", {}).get("targets", []))
    return []


def _rows(paths: list[Path], options: dict) -> list[dict]:
    """The JSON-lines files' rows, one list, those of `machine=` alone when given."""
    return [r for path in paths for r in _each(path, options)]


def _each(path: Path, options: dict) -> list[dict]:
    rows = jsonl(path)
    if "machine" not in options:
        return rows
    return [r for r in rows if r.get("machine") == options["machine"]]


def _clients(options: dict) -> set[int] | None:
    """`clients=1,16`: the cells of those client counts."""
    return {int(c) for c in options["clients"].split(",")} if "clients" in options else None


def _files(paths: list[Path], options: dict) -> list[list[dict]]:
    return [_each(path, options) for path in paths]


SPECQ_FLAGS = {"plain": "--no-speculative", "ngram": "--draft ngram", "gamma auto": ""}
# "generate gamma auto" is the registered draft alone with gamma auto: the default until the
# n-gram lookup went in front of it (commit 8dc8929)
HEADLINE_ROWS = ["llama.cpp, plain decoding", "llama.cpp, its fastest speculative mode",
                 "specq, plain decoding (`--no-speculative`)",
                 "specq, the registered draft with gamma `auto`",
                 "specq, its fastest mode"]


def specq_flags(measurement: str) -> str:
    """A specq mode of the peer comparison as `specq generate`'s flags: 'generate gamma 2' ->
    `--gamma 2`, 'generate gamma auto, draft REF' -> `--draft REF`; the registered draft with
    gamma auto: 'the registered draft'."""
    parts = measurement.removeprefix("generate ").split(", ")
    flags = " ".join(f for p in parts if (f := SPECQ_FLAGS.get(p, f"--{p}")))
    return f"`{flags}`" if flags else "the registered draft"


def headline(files: list[list[dict]], weights: str = "qwen1.5b") -> str:
    """The README's table: one column per peer comparison file (a prompt kind), one row per
    configuration, each cell tokens/s (the median over rounds) and the median of the rounds' ratios
    to llama.cpp's plain decoding, as `llamacpp.summary` pairs them; the fastest modes by that
    ratio, named."""
    columns = [[r for r in rows if r["weights"] == weights] for rows in files]
    for rows in columns:
        if len({r.get("run") for r in rows}) > 1:  # their rounds are not one another's
            raise SystemExit(f"headline: a file holds several runs of {weights}: name machine=")
    names = [", ".join(sorted({r.get("prompt_set", "-") for r in rows})) or "-" for rows in columns]
    lines = [f"| {weights} | " + " | ".join(names) + " |", "|---|" + "---|" * len(columns)]
    if any(columns):
        cells = [_headline_column(rows, weights) for rows in columns]
        lines += [f"| {label} | " + " | ".join(c[i] for c in cells) + " |"
                  for i, label in enumerate(HEADLINE_ROWS)]
    return "\n".join(lines)


def _headline_column(rows: list[dict], weights: str) -> list[str]:
    """One file's cells of `headline`, in the order of HEADLINE_ROWS ("-": not measured)."""
    plain = llamacpp._rates(rows, "llama.cpp", weights, "generate plain")

    def cell(rates: dict) -> str:
        ratio = llamacpp._paired(rates, plain)
        return llamacpp._median(rates, " tok/s") + (f" ({ratio}x)" if ratio != "-" else "")

    def fastest(tool: str, modes, name: Callable[[str], str]) -> str:
        rates = {m: r for m in modes if (r := llamacpp._rates(rows, tool, weights, m))}
        if not rates:
            return "-"
        best = max(rates, key=lambda m: llamacpp._ratio(rates[m], plain))
        return f"{cell(rates[best])}, {name(best)}"

    generations = [r["measurement"] for r in rows
                   if r["tool"] == "specq" and r["measurement"].startswith("generate")]
    return [llamacpp._median(plain, " tok/s"),
            fastest("llama.cpp", llamacpp.LLAMA_CPP_SPECULATIVE,
                    lambda m: m.removeprefix("llama.cpp ")),
            cell(llamacpp._rates(rows, "specq", weights, "generate plain")),
            cell(llamacpp._rates(rows, "specq", weights, llamacpp.DEFAULT_MODE)),
            fastest("specq", dict.fromkeys(generations), specq_flags)]


def _projected(paths: list[Path], options: dict) -> list[dict]:
    """project_speed.py's records, those of cells measured in `results=STEM,...` (results files'
    names), on `sets=SET,...` (prompt sets), with `drafts=DRAFT,...` (the cells' draft refs) and
    projected onto `shapes=SHAPE,...` alone when given."""
    wanted = {key: options[key].split(",") for key in ("results", "sets", "drafts", "shapes")
              if key in options}
    out = []
    for r in _rows(paths, {}):
        cell = r.get("source", r)  # a projection's measured cell, or the checked cell itself
        values = {"results": Path(cell["file"]).stem, "sets": cell["set"],
                  "drafts": cell["draft"], "shapes": r.get("shape")}
        if all(values[key] in allowed for key, allowed in wanted.items()):
            out.append(r)
    return out


@dataclass(frozen=True)
class Kind:
    """A kind of table: how it is made from its files and options, and the options it takes."""

    make: Callable[[list[Path], dict], str]
    options: tuple[str, ...] = ()


KINDS = {
    # specq beside llama.cpp (bench_llamacpp.py): one run in full; the README's, a column per file;
    # runs of several files, one line each; pass costs by rows; set-ups of one file; step profiles
    # (profile_step.py at 4a89039)
    "llamacpp": Kind(lambda p, o: llamacpp.summary(_rows(p, o)), ("machine",)),
    "headline": Kind(lambda p, o: headline(_files(p, o)), ("machine",)),
    "peers": Kind(lambda p, o: peer_tables.peers(_files(p, o)), ("machine",)),
    "passes": Kind(lambda p, o: peer_tables.passes(_files(p, o)), ("machine",)),
    "llamacpp-ngram": Kind(lambda p, o: llamacpp.ngram_summary(_rows(p, o)), ("machine",)),
    "llamacpp-setups": Kind(lambda p, o: llamacpp.setups_summary(_rows(p, o)), ("machine",)),
    "step-profile": Kind(lambda p, o: peer_tables.step_profile(_rows(p, o)), ("machine",)),
    # `specq bench` results stores: every configuration; per prompt set against gamma
    "cells": Kind(lambda p, o: cells(_bench(p, o, False)[0]), ("tokens", "gamma", "temperature")),
    "sets": Kind(lambda p, o: sets(*_bench(p, o, True)), ("tokens", "gamma", "temperature")),
    "servers": Kind(lambda p, o: servers(*_bench(p, o, True)), ("tokens",)),
    # acceptance against the target's precision (sweep order), per prompt set and temperature
    "acceptance": Kind(lambda p, o: acceptance(_bench(p, o, True)[0], _sweep_targets(p)),
                       ("tokens", "gamma", "temperature")),
    # the other scripts' rows and `specq compare --json`
    "gamma-interleaved": Kind(lambda p, o: result_tables.gamma_interleaved(_rows(p, o)),
                              ("machine",)),
    "load": Kind(lambda p, o: result_tables.load(_rows(p, o)), ("machine",)),
    "serve-modes": Kind(lambda p, o: result_tables.serve_modes(_rows(p, o), _clients(o)),
                        ("machine", "clients")),
    # bench_serve.py --storm: one line per run (clients' outcomes, 429s, equal answers, memory)
    "serve-storm": Kind(lambda p, o: serve_storm.table(_rows(p, o)), ("machine",)),
    "compare": Kind(lambda p, o: result_tables.compare(_rows(p, o)), ("machine",)),
    "verify": Kind(lambda p, o: result_tables.verify(_rows(p, o)), ("machine",)),
    "versions": Kind(lambda p, o: versions.summary(_rows(p, o)), ("machine",)),
    # benchmarks/project_speed.py: the check on the pair that ran; the projection onto shape files
    "projection-check": Kind(lambda p, o: projection.check_table(_projected(p, o)),
                             ("results", "sets", "drafts")),
    "projection": Kind(lambda p, o: projection.shape_table(_projected(p, o)),
                       ("results", "sets", "drafts", "shapes")),
    # shape files' passes (bench_llamacpp.py) against the int8 roof (bench_kernels.py roof)
    "roof": Kind(lambda p, o: roof.table(_rows(p, o)), ("machine",)),
}


def render(spec: str, root: Path) -> str:
    """The table a marker's spec names: `FILES KIND [OPTION=VALUE ...]`."""
    files, name, *args = spec.split()
    kind = KINDS.get(name)
    if kind is None:
        raise SystemExit(f"table '{spec}': unknown kind {name!r} ({', '.join(KINDS)})")
    options = dict(a.split("=", 1) for a in args)
    unknown = set(options) - set(kind.options)
    if unknown:
        raise SystemExit(f"table '{spec}': kind {name!r} takes no option "
                         f"{', '.join(sorted(unknown))}")
    table = kind.make([root / f for f in files.split(",")], options)
    if len(table.splitlines()) < 3:
        raise SystemExit(f"table '{spec}': no rows")
    return table


def regenerate(text: str, root: Path) -> str:
    """`text` with every table block rewritten from its results files."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("spec"), root) + "\n" + m.group(4), text)
