"""Projected speculation (benchmarks/project_speed.py) apart from its command line: measured
speculative cells of a `specq bench` store, pooled per cell, with the plain runs they were paired
with; a target's pass costs from `bench_llamacpp.py`'s rows; each cell projected onto a target's
costs (`bench.projection`), the records of the check on the pair that ran and of the projection
onto files of bigger models' shapes, and the docs' tables of both.

Two projections of one cell, both decode only (prefill left out):
- replayed: the cell's own steps (its verify passes by row count) at the target's pass costs, with
  the drafting and loop time it measured, in milliseconds;
- modelled: each route over the share of the text it covered, the model's route as a chain at its
  cap (a fixed gamma's, else the best for the target's costs) from its per-position acceptance, a
  lookup's and plain steps as measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from ...core.stats import DecodeStats
from ...loading.refs import LookaheadRef, draft_ref, model_ref
from .. import store
from . import shapes
from ..aggregate import merge, predict
from ..config import cell_key, related
from ..projection import (Chain, PassCosts, best_gamma, chain_speed, mix, replay,
                          route_speed)

GOAL = 3.0  # projected decoding speed over llama.cpp's plain decoding, 7-8B targets (issue 53)


# ------------------------------------------------------------------ pass costs (bench_llamacpp)

def _forwards(rows: list[dict], tool: str, weights: str, n: int) -> dict[tuple, float]:
    """(run, round) -> ms of one n-row pass after the script's 128 tokens of context."""
    return {(r.get("run"), r["round"]): r["ms"] for r in rows
            if (r["tool"], r["weights"], r["measurement"]) == (tool, weights, f"forward {n}")}


def pass_costs(rows: list[dict], weights: str, tool: str = "specq") -> PassCosts:
    """A tool's n-row passes on `weights` in its one-row steps: per row count, the median over
    rounds of each round's n-row pass over its one-row pass, each pass priced at most what a pass
    of more rows cost in the same round (a stall on a shared machine only adds time: gamma auto's
    rule)."""
    counts = sorted({int(r["measurement"].split()[1]) for r in rows
                     if r["tool"] == tool and r["weights"] == weights
                     and r["measurement"].startswith("forward") and " at " not in r["measurement"]})
    passes = {n: _forwards(rows, tool, weights, n) for n in counts}
    if not passes.get(1):
        raise ValueError(f"no one-row pass of {weights} by {tool} to price passes in")
    ratios: dict[int, list[float]] = {n: [] for n in counts}
    for key, one in passes[1].items():
        cheapest = float("inf")
        for n in reversed(counts[1:]):
            if key in passes[n]:
                cheapest = min(cheapest, passes[n][key])
                ratios[n].append(cheapest / one)
    return PassCosts({1: 1.0, **{n: statistics.median(r) for n, r in ratios.items() if r}})


def step_ms(rows: list[dict], weights: str, tool: str = "specq") -> float:
    """A tool's one-row step on `weights`: the median over rounds."""
    return statistics.median(_forwards(rows, tool, weights, 1).values())


def llama_cpp_step(rows: list[dict], weights: str) -> float:
    """llama.cpp's one-row step over specq's on the same file, paired by round (median)."""
    mine = _forwards(rows, "specq", weights, 1)
    return statistics.median(ms / mine[k] for k, ms in _forwards(rows, "llama.cpp", weights, 1)
                             .items() if k in mine)


# ------------------------------------------------------------------ measured cells (bench stores)

@dataclass(frozen=True)
class Measured:
    """A speculative chain cell of a `specq bench` store, its runs pooled over prompts and repeats,
    and the plain runs it is compared with (timed beside it when paired, else its baseline's)."""

    file: str
    record: dict
    spec: DecodeStats
    plain: DecodeStats
    runs: int
    plain_runs: int

    @property
    def params(self) -> dict:
        return self.record["cell"]

    @property
    def fixed(self) -> bool:
        return self.params["gamma"] != "auto"

    @property
    def method(self) -> str:
        """The draft's kind: a lookup's ref, a model's name (and window), or both joined by '+'."""
        ref = draft_ref(self.params["draft"])
        lookup = [ref.lookup.draft.ref] if ref.lookup is not None else []
        return "+".join(lookup + ([self.model] if self.model else []))

    @property
    def model(self) -> str | None:
        """The draft's model: its file's name, precision and window as its ref gives them (None:
        draft-free)."""
        models = draft_ref(self.params["draft"]).models
        if not models:
            return None
        ref = models[0]
        spec = f"@{ref.spec}" if ref.has_spec else ""
        window = f":window={ref.window}" if ref.window else ""
        return Path(ref.name).name + spec + window

    @property
    def tokens(self) -> int:
        """Tokens of the decode phase: all but each run's first (prefill's)."""
        return self.spec.new_tokens - self.runs

    @property
    def step_ms(self) -> float:
        """The plain runs' one-row step."""
        return self.plain.verify_s * 1000 / self.plain.steps

    @property
    def plain_overhead_ms(self) -> float:
        return self.plain.other_s * 1000 / self.plain.steps

    @property
    def overhead_ms(self) -> float:
        return self.spec.other_s * 1000 / self.spec.steps

    @property
    def model_route(self) -> str | None:
        """The route the model drafted on: 'model' beside a lookup, 'draft' alone (None: no
        model)."""
        if self.model is None:
            return None
        return "model" if draft_ref(self.params["draft"]).lookup else "draft"

    @property
    def counted(self) -> bool:
        """A fixed gamma and one drafter: its per-position counts are per step."""
        return self.fixed and len(self.spec.routes.keys() - {"plain"}) <= 1

    @property
    def draft_ms(self) -> float | None:
        """Drafting time per token the model drafted (its catching up on the tokens it missed
        included); a lookup's own time is counted with it. A lookup alone: per token drafted."""
        route = self.model_route
        if route in self.spec.routes:
            drafted = self.spec.routes[route]["drafted"]
        elif route == "model":  # stored without its routes: the model's tokens are not known
            return None
        else:
            drafted = self.spec.drafted
        return self.spec.draft_s * 1000 / drafted if drafted else None

    def speedup(self) -> float:
        """Measured decoding speed over plain decoding: tokens over decode time, pooled."""
        plain_tokens = self.plain.new_tokens - self.plain_runs
        return (self.tokens / self.spec.decode_s) / (plain_tokens / self.plain.decode_s)

    def own_prediction(self) -> float | None:
        """`aggregate.predict`: the cell's own draft and verify times, no loop overhead."""
        return predict(self.spec, self.plain)

    def passes(self) -> dict[int, int]:
        """Verify passes by row count (a chain's rows: 1 + the tokens it drafted)."""
        at_least = [self.spec.steps, *self.spec.drafted_at, 0]
        return {1 + k: at_least[k] - at_least[k + 1] for k in range(len(at_least) - 1)
                if at_least[k] > at_least[k + 1]}

    def chain(self) -> Chain | None:
        """The model's chain: counted per step at a fixed gamma with one drafter, else chained from
        each position's acceptance given the ones before (pooled over the routes)."""
        s = self.spec
        if self.counted:
            return Chain.from_counts(s.drafted_at, s.accepted_at, s.steps)
        rates = []
        for a in s.per_position_conditional:
            if a is None:
                break
            rates.append(a)
        return Chain.from_rates(rates) if rates else None

    def shares(self) -> dict[str, float]:
        """Each route's share of the tokens the steps emitted."""
        emitted = {r: c["steps"] + c["accepted"] for r, c in self.spec.routes.items()}
        total = sum(emitted.values())
        return {r: e / total for r, e in emitted.items()} if total else {}


def read_cells(path: Path, target: str, name: str | None = None) -> list[Measured]:
    """The speculative chain cells of `target` in a bench store (no trees, no lookahead, specq's own
    engine), each with its plain runs; `name`: the file as records name it (default its path)."""
    records = store.read(path)
    cells = store.cells(records)
    out = []
    for record in cells.values():
        params = record["cell"]
        if (params["kind"] != "speculative" or params["target"] != target or params.get("tree")
                or params.get("engine", "specq") != "specq" or not record.get("runs")
                or isinstance(draft_ref(params["draft"]).lookup, LookaheadRef)
                or len(draft_ref(params["draft"]).models) > 1):
            continue
        runs = record["runs"]
        if all("paired_stats" in r for r in runs):
            plain = [r["paired_stats"] for r in runs]
        else:
            base = cells.get(cell_key(related(params, "baseline")))
            plain = [r["stats"] for r in (base or {}).get("runs", [])]
        if plain:
            spec = merge([r["stats"] for r in runs])
            out.append(Measured(name or str(path), record, spec, merge(plain), len(runs),
                                len(plain)))
    return out


# ------------------------------------------------------------------ projecting

@dataclass(frozen=True)
class Projection:
    """A cell on a target: its speed over specq's plain decoding there, replayed and modelled."""

    replayed: float
    modelled: float | None
    gamma: int | None  # the model's cap in the modelled projection
    plain: float  # plain decoding's tokens per one-row step

    @property
    def speed(self) -> float:
        """Tokens per one-row step: modelled where there is one, else replayed."""
        return (self.replayed if self.modelled is None else self.modelled) * self.plain


def project(m: Measured, costs: PassCosts, step: float, choose: bool,
            chain: Chain | None = None) -> Projection:
    """Cell `m` on a target whose passes cost `costs` (one-row steps) and whose step takes `step`
    ms, the draft's and the loop's milliseconds as measured. `choose`: the model's best cap for
    these costs (else a fixed gamma's own); `chain`: the model's chain counted in another cell
    (`longest_chain`)."""
    plain = 1.0 / (1.0 + m.plain_overhead_ms / step)
    extra = (m.spec.draft_s + m.spec.other_s) * 1000 / step
    replayed = replay(m.passes(), m.tokens, costs, extra)
    speed, gamma = _modelled(m, costs, step, choose, chain)
    modelled = None if speed is None else speed / plain
    return Projection(replayed / plain, modelled, gamma, plain)


def _modelled(m: Measured, costs: PassCosts, step: float, choose: bool,
              chain: Chain | None) -> tuple[float | None, int | None]:
    """(tokens per one-row step, the model's cap) of `project`'s modelled projection; (None, None)
    where the cell lacks what it needs (its routes, its model's tokens, any acceptance)."""
    draft, overhead, routes = m.draft_ms, m.overhead_ms / step, m.spec.routes
    if draft is None:
        return None, None
    draft /= step
    if m.model is None:  # a lookup alone: its proposals as measured
        if not routes:
            return None, None
        speeds = {r: route_speed(c["steps"], c["drafted"], c["accepted"], costs, draft, overhead)
                  for r, c in routes.items()}
        return mix(m.shares(), speeds), None
    chain = chain or m.chain()
    if chain is None:
        return None, None
    if choose or not m.fixed:
        gamma = best_gamma(chain, costs, draft, overhead)
    else:
        gamma = min(int(m.params["gamma"]), chain.longest)
    model = chain_speed(chain, gamma, costs, draft, overhead)
    if m.counted:
        return model, gamma  # the chain counted every step, an early stop's plain ones too
    if not routes:
        return None, None
    speeds = {r: model if r == m.model_route else
              route_speed(c["steps"], c["drafted"], c["accepted"], costs, 0.0, overhead)
              for r, c in routes.items()}
    return mix(m.shares(), speeds), gamma


def longest_chain(cells: list[Measured], m: Measured,
                  same_stop: bool = False) -> tuple[Chain, Measured] | None:
    """The chain of `m`'s model alone on `m`'s prompts at the longest fixed gamma of `cells`,
    counted per step (with `same_stop`, at `m`'s early stop): the model's drafting where `m` did
    not count it (gamma auto, a lookup beside it) or at gammas `m` did not run."""
    found = [(c.chain(), c) for c in cells
             if c.counted and c.model_route == "draft" and c.model == m.model
             and c.params["set"] == m.params["set"]
             and c.params["max_new_tokens"] == m.params["max_new_tokens"]
             and (not same_stop or c.params.get("draft_confidence")
                  == m.params.get("draft_confidence"))]
    return max(found, key=lambda f: f[0].longest, default=None)


# ------------------------------------------------------------------ records

def _source(m: Measured) -> dict:
    p = m.params
    return {"file": m.file, "key": m.record["key"], "finished": m.record.get("finished"),
            "target": p["target"], "draft": p["draft"], "method": m.method, "gamma": p["gamma"],
            "draft_confidence": p.get("draft_confidence"),
            "suffix_cache": p.get("suffix_cache", False), "set": p["set"],
            "max_new_tokens": p["max_new_tokens"], "threads": p["threads"],
            "prompts": p.get("n_prompts"), "runs": m.runs}


def _inputs(m: Measured, costs: PassCosts, step: float) -> dict:
    chain = m.chain()
    return {"step_ms": step, "passes_in_steps": {str(n): c for n, c in costs.table.items()},
            "draft_ms_per_token": m.draft_ms,
            "draft_in_steps": None if m.draft_ms is None else m.draft_ms / step,
            "overhead_ms": m.overhead_ms, "plain_overhead_ms": m.plain_overhead_ms,
            "route_shares": m.shares(), "routes": m.spec.routes,
            "acceptance": m.spec.per_position_conditional,
            "chain": None if chain is None else
            {"counted" if m.counted else "chained":
             {"drafted": chain.drafted, "accepted": chain.accepted}}}


def _error(predicted: float | None, measured: float) -> float | None:
    return None if predicted is None else predicted / measured - 1.0


def check_record(m: Measured, costs: PassCosts, pass_source: str,
                 chain: tuple[Chain, Measured] | None = None) -> dict:
    """One cell's measured decoding speedup beside its predictions from its acceptance: with its
    own times (`aggregate.predict`), and with the pass table's costs (replayed, modelled: from
    `chain`, a longer fixed gamma's counts of the same draft, where given)."""
    p = project(m, costs, m.step_ms, choose=False, chain=None if chain is None else chain[0])
    measured = m.speedup()
    predicted = {"own": m.own_prediction(), "replayed": p.replayed, "modelled": p.modelled}
    # end to end, prefill as measured: the bench tables' speedups
    plain = (m.plain.prefill_s + m.plain.decode_s) / m.plain.new_tokens
    decode = m.tokens / (p.replayed * p.plain) * m.step_ms / 1000
    return {"type": "projection-check", **_source(m), "pass_costs": pass_source,
            "inputs": _inputs(m, costs, m.step_ms), "measured": measured,
            "predicted": predicted, "modelled_gamma": p.gamma,
            "model_chain_from": None if chain is None else _source(chain[1]),
            "error": {k: _error(v, measured) for k, v in predicted.items()},
            "end_to_end": {"measured": plain / (m.spec.total_s / m.spec.new_tokens),
                           "replayed": plain / ((m.spec.prefill_s + decode) / m.spec.new_tokens)},
            "assumes": CHECK_ASSUMES}


CHECK_ASSUMES = [
    "decode only: prefill left out; speeds pooled over the cell's prompts (tokens over time)",
    "the target's one-row step is the plain runs' measured one; n-row passes cost what the pass "
    "table says in one-row steps (its own rounds, another day: the machine's drift is in the "
    "error)",
    "drafting and loop time as the cell measured them, in milliseconds",
    "modelled: each route over the share of the text it covered; the model's chain from per-"
    "position acceptance (counted per step at a fixed gamma, else chained from each position's "
    "acceptance given the ones before, pooled over routes, drafting every position to the cap); "
    "gamma auto's cells at the best cap for the costs, 0 to the positions measured",
]


def shape_record(m: Measured, shape: str, rows: list[dict], weights: str,
                 chain: tuple[Chain, Measured] | None = None) -> dict:
    """Cell `m` projected onto a file of a bigger model's shapes: its measured pass costs and step,
    the draft's and loop's milliseconds as measured beside the smaller target, speeds over specq's
    and llama.cpp's plain decoding of the same file."""
    costs, step = pass_costs(rows, weights), step_ms(rows, weights)
    llama = llama_cpp_step(rows, weights)
    p = project(m, costs, step, choose=True, chain=None if chain is None else chain[0])
    speedup = p.modelled if p.modelled is not None else p.replayed
    over_llama = speedup * p.plain * llama
    run = next(r for r in rows if r["weights"] == weights)
    return {"type": "projection", "shape": shape, "weights": weights,
            "machine": run.get("machine"), "kernels": run.get("kernels"),
            "threads": run.get("threads"), "shapes_run": run.get("run"),
            "source": {**_source(m), "measured": m.speedup()},
            "model_chain_from": None if chain is None else _source(chain[1]),
            "inputs": _inputs(m, costs, step), "llama_cpp_step_in_specq_steps": llama,
            "replayed": p.replayed, "modelled": p.modelled, "gamma": p.gamma,
            "vs_specq_plain": speedup, "vs_llama_cpp_plain": over_llama,
            "tokens_per_s": p.speed * 1000 / step,
            "llama_cpp_plain_tokens_per_s": 1000 / (step * llama), "goal": GOAL,
            "meets_goal": over_llama >= GOAL, "assumes": shape_assumes(m, shape)}


def shape_assumes(m: Measured, shape: str) -> list[str]:
    """What a projection of `m` onto `shape` takes for granted, in words."""
    target = model_ref(m.params["target"]).name
    out = [
        f"acceptance as {m.method} measured with {target} (prompts '{m.params['set']}', "
        f"{m.params['threads']} threads): a {shape} target agrees with the draft more or less "
        "often than that target; no acceptance was measured on this shape (random weights)",
        "drafting time in milliseconds as measured beside the smaller target, same machine and "
        "threads (the draft's cost does not depend on the target); so are the loop's overhead "
        "and each route's share of the text",
        "pass costs: specq's n-row passes on the file in its one-row steps (median over rounds of "
        "each round's ratio, each pass at most what more rows cost in its round), linear between "
        "the counts measured, never below fewer rows'",
        "the model's cap chosen for these costs, from 0 to the positions its chain counted (gamma "
        "auto's cells count 4 at most)",
        "decode only, prefill left out; llama.cpp's plain decoding at its one-row pass on the same "
        "file (median over rounds of its ratio to specq's)",
    ]
    if m.model and not _same_family(shape, target):
        out.append(f"{shape}: a draft of {m.model}'s cost and acceptance with this model's "
                   f"tokenizer, which {m.model} has not; its own family's smallest model is larger")
    return out


def _same_family(shape: str, target: str) -> bool:
    """Whether a shape file ('qwen2.5-7b-Q4_K_M') and a target share architecture and tokenizer,
    as `shapes.SHAPES` knows them."""
    mine, theirs = shapes.SHAPES.get(shape.rsplit("-", 1)[0]), shapes.SHAPES.get(target)
    return (mine is not None and theirs is not None
            and (mine.arch, mine.tokenizer) == (theirs.arch, theirs.tokenizer))


# ------------------------------------------------------------------ tables

def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.0f}%"


def check_table(rows: list[dict]) -> str:
    """One line per checked cell: its decoding speedup as measured and as predicted from its own
    times, its steps at the pass table's costs, and its per-position acceptance (at the gamma
    chosen, from a longer gamma's counts where named); then the mean absolute error of each."""
    lines = ["| results | prompts | draft | gamma | tokens | measured | own times | "
             "replayed | modelled (gamma) | error: own / replayed / modelled |",
             "|" + "---|" * 10]
    for r in rows:
        e = r["error"]
        gamma = "" if r["modelled_gamma"] is None else f" ({r['modelled_gamma']}{_from(r)})"
        lines.append(f"| {Path(r['file']).stem} | {r['set']} | {_label(r)} | {r['gamma']} | "
                     f"{r['max_new_tokens']} | {_x(r['measured'])} | "
                     f"{_x(r['predicted']['own'])} | {_x(r['predicted']['replayed'])} | "
                     f"{_x(r['predicted']['modelled'])}{gamma} | "
                     f"{_pct(e['own'])} / {_pct(e['replayed'])} / {_pct(e['modelled'])} |")
    means = []
    for key in ("own", "replayed", "modelled"):
        errors = [abs(r["error"][key]) for r in rows if r["error"][key] is not None]
        means.append(f"{statistics.mean(errors) * 100:.0f}% ({len(errors)})" if errors else "-")
    lines.append(f"| mean absolute error (cells) | | | | | | | | | {' / '.join(means)} |")
    return "\n".join(lines)


def _from(r: dict) -> str:
    """Where a record's model chain was counted, when not in its own cell."""
    source = r.get("model_chain_from")
    return "" if source is None else f", from {Path(source['file']).stem} gamma {source['gamma']}"


def _label(r: dict) -> str:
    extra = ", suffix cache" if r.get("suffix_cache") else ""
    confidence = r.get("draft_confidence")
    return r["method"] + (f", stop {confidence}" if confidence else "") + extra


def shape_table(rows: list[dict]) -> str:
    """One line per projected cell and shape: the draft's token in the shape's one-row steps, the
    cap chosen, the speed over specq's plain decoding (the source's steps replayed; modelled) and
    over llama.cpp's, and whether that meets the goal."""
    lines = ["| shape | prompts | draft | measured on | speedup there | draft token, steps | "
             "gamma | replayed | modelled | tok/s | over llama.cpp plain | "
             f">= {GOAL:g}x |", "|" + "---|" * 12]
    for r in rows:
        s = r["source"]
        draft = r["inputs"]["draft_in_steps"]
        lines.append(f"| {r['shape']} | {s['set']} | {_label(s)} | "
                     f"{Path(s['file']).stem}, gamma {s['gamma']}{_from(r)} | "
                     f"{_x(s['measured'])} | "
                     f"{'-' if draft is None else f'{draft:.3f}'} | "
                     f"{'-' if r['gamma'] is None else r['gamma']} | {_x(r['replayed'])} | "
                     f"{_x(r['modelled'])} | {r['tokens_per_s']:.1f} | "
                     f"{_x(r['vs_llama_cpp_plain'])} | {'yes' if r['meets_goal'] else 'no'} |")
    return "\n".join(lines)
