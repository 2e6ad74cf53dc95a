"""From stored cells to table rows: per-prompt values, bootstrap CIs, speedups, the analytic
prediction, quality, and flags.

Prompts are the independent units: repeats of a prompt are pooled into one value per prompt,
then the CI is over prompts (never over the correlated tokens of one output). Speedup is per
prompt (speculative tokens/s over the same target's plain tokens/s on the same prompt), then
averaged; the plain runs are those timed right next to each speculative run when the cell is
paired (so a machine that slows down mid-sweep cannot fake a gain), else the baseline cell's.
`decode_speedup` is the same ratio of decode tokens/s alone (the steps after the first token:
the prompt's prefill, and a draft's, left out), what a user streaming a long answer sees.
A greedy speculative output that differs from the baseline's is a correctness failure: it is
listed in every row that holds it, never averaged away. A token tree cell is a row of its own
(`tree`, `tree_topk`; its `gamma` is the tree's depth), compared with the same baseline; so is a
cell whose n-gram draft also read earlier prompts' text (`suffix_cache`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..core.gamma import parse as parse_gamma
from ..core.gamma import sort_key as gamma_order
from ..core.stats import DecodeStats, bootstrap_ci
from ..loading.refs import model_ref
from . import quality, store
from .config import cell_key, related, tree_shape

MIN_STEPS = 6  # fewer speculation cycles per prompt: the numbers are warm-up dominated
SET_PARAMS = ("set", "prompts_sha", "n_prompts")
KIND_ORDER = {"baseline": 0, "speculative": 1, "peer": 2}


def merge(items: list[dict]) -> DecodeStats:
    """Sum the counters and times of several runs (repeats, or prompts) into one DecodeStats."""
    out = DecodeStats(gamma=max(d["gamma"] for d in items))
    for f in fields(DecodeStats):
        if f.name == "gamma":
            continue
        for d in items:
            value = d.get(f.name, {}) if f.name == "routes" else d[f.name]
            if isinstance(value, dict):  # per route: each count summed
                for route, counts in value.items():
                    total = out.routes.setdefault(route, dict.fromkeys(counts, 0))
                    for name, v in counts.items():
                        total[name] = total.get(name, 0) + v
            elif isinstance(value, list):
                total = getattr(out, f.name)
                total += [0] * (len(value) - len(total))
                for i, v in enumerate(value):
                    total[i] += v
            else:
                setattr(out, f.name, getattr(out, f.name) + value)
    return out


@dataclass
class Unit:
    """One prompt of a cell: its runs (repeats), and the matching baseline and peer runs."""

    set: str
    prompt: int
    runs: list[dict]
    base_runs: list[dict]
    peer_runs: list[dict]

    @property
    def stats(self) -> DecodeStats:
        return merge([r["stats"] for r in self.runs])

    def tokens_per_s(self, runs: list[dict], measure: str = "tokens_per_s") -> float | None:
        """The runs' pooled tokens/s: end to end, or `decode_tokens_per_s`."""
        return getattr(merge([r["stats"] for r in runs]), measure) if runs else None

    @property
    def paired_runs(self) -> list[dict]:
        """The plain runs timed next to this prompt's speculative runs (paired cells only)."""
        return [{"stats": r["paired_stats"]} for r in self.runs if "paired_stats" in r]

    @property
    def speedup_reference(self) -> list[dict]:
        return self.paired_runs or self.base_runs

    def ratio(self, other: list[dict], measure: str = "tokens_per_s") -> float | None:
        mine, theirs = self.tokens_per_s(self.runs, measure), self.tokens_per_s(other, measure)
        return mine / theirs if mine and theirs else None

    def em(self) -> float | None:
        ref = self.runs[0].get("reference")
        if ref is None:
            return None
        return sum(quality.exact_match(r["text"], ref) for r in self.runs) / len(self.runs)


def _by_prompt(cell: dict | None) -> dict[tuple[str, int], list[dict]]:
    out: dict[tuple[str, int], list[dict]] = {}
    for r in (cell or {}).get("runs", []):
        out.setdefault((r["set"], r["prompt"]), []).append(r)
    return out


def summarize(records: list[dict], *, resamples: int = 2000, confidence: float = 0.95,
              seed: int = 0, by_set: bool = False) -> list[dict]:
    """One row per configuration: per prompt set (`by_set`) or pooled over the sets."""
    cells = store.cells(records)
    groups: dict[tuple, list[dict]] = {}
    for cell in cells.values():
        params = cell["cell"]
        if params["kind"] == "peer":
            continue  # joined into the speculative rows
        group = {k: v for k, v in params.items() if by_set or k not in SET_PARAMS}
        groups.setdefault(tuple(sorted(group.items())), []).append(cell)
    ci = lambda values: _ci(values, confidence, resamples, seed)  # noqa: E731
    rows = [_row(members, cells, ci) for members in groups.values()]
    _mark_best_gamma(rows)
    rows.sort(key=lambda r: (r["target"], r["max_new_tokens"], r["temperature"],
                             r["threads"], r["set"], KIND_ORDER[r["kind"]], r["draft"] or "",
                             r["tree"], r["tree_topk"] or 0, r["draft_confidence"] or 0,
                             r["suffix_cache"], gamma_order(r["gamma"])))
    return rows


def _ci(values, confidence: float, resamples: int, seed: int) -> list[float] | None:
    data = [v for v in values if v is not None and math.isfinite(v)]
    return list(bootstrap_ci(data, confidence, resamples, seed)) if data else None


def _row(members: list[dict], cells: dict[str, dict], ci) -> dict:
    first = members[0]
    params = first["cell"]
    speculative = params["kind"] == "speculative"
    units: list[Unit] = []
    peer_skipped = None
    for cell in sorted(members, key=lambda c: c["cell"]["set"]):
        base = cells.get(cell_key(related(cell["cell"], "baseline"))) if speculative else None
        peer = cells.get(cell_key(related(cell["cell"], "peer"))) if speculative else None
        peer_skipped = peer_skipped or (peer or {}).get("skipped")
        base_runs, peer_runs = _by_prompt(base), _by_prompt(peer)
        for pid, runs in _by_prompt(cell).items():
            units.append(Unit(pid[0], pid[1], runs, base_runs.get(pid, []), peer_runs.get(pid, [])))
    per_prompt = [u.stats for u in units]
    pooled = merge([r["stats"] for u in units for r in u.runs])
    # a server's draft length: as its cell says, else the positions its metrics counted
    gamma = parse_gamma(params["gamma"])[0] if params["gamma"] else pooled.gamma
    tree = tree_shape(params)
    engine = params.get("engine", "specq")
    row = {
        "kind": params["kind"], "engine": engine, "target": params["target"],
        "target_precision": first["target"]["precision"], "draft": params["draft"],
        "draft_precision": (first["draft"] or {}).get("precision"), "gamma": params["gamma"],
        "draft_confidence": params.get("draft_confidence"),
        # tree: gamma is its depth
        "tree": tree.size if tree else 0, "tree_topk": tree.topk if tree else None,
        "suffix_cache": params.get("suffix_cache", False),
        "max_new_tokens": params["max_new_tokens"],
        "temperature": params["temperature"], "threads": params["threads"],
        "set": "+".join(sorted({c["cell"]["set"] for c in members})), "prompts": len(units),
        "repeats": params["repeats"],
        "tokens_per_s": ci([s.tokens_per_s for s in per_prompt]),
        # the client's view for a server (HTTP included); specq's own: its prefill and steps
        "ttft_ms": ci([s.prefill_s * 1000 for s in per_prompt]),
        "itl_ms": ci([s.decode_s * 1000 / (s.new_tokens - 1) if s.new_tokens > 1 else None
                      for s in per_prompt]),
        "em": ci([u.em() for u in units]), "em_prompts": sum(u.em() is not None for u in units),
        "steps_per_prompt": sum(s.steps for s in per_prompt) / max(1, len(units))
        / params["repeats"], "profile": _profile(members, pooled, tree is not None),
        # speculative only:
        "acceptance_rate": None, "tau": None, "U": [], "a": [], "nodes_per_pass": None,
        "draft_share": None, "speedup": None, "decode_speedup": None,
        "predicted_speedup": None, "warmup_dominated": False, "greedy": params["temperature"] == 0,
        "mismatches": [], "unchecked": 0, "compared": None, "peer_tokens_per_s": None,
        "vs_peer": None,
        "peer_identical": [0, 0], "peer_skipped": None, "speedup_paired": False,
    }
    if not speculative:
        return row
    base_pooled = [r["stats"] for u in units for r in u.speedup_reference]
    mismatches, unchecked = _mismatches(units) if row["greedy"] else ([], 0)
    return {
        **row,
        "acceptance_rate": ci([s.acceptance_rate for s in per_prompt]),
        "tau": ci([s.tau for s in per_prompt]),
        "U": [ci([_at(s.per_position_unconditional, i) for s in per_prompt])
              for i in range(gamma)],
        "a": [ci([_at(s.per_position_conditional, i) for s in per_prompt]) for i in range(gamma)],
        "nodes_per_pass": ci([s.drafted / s.steps if s.steps else None for s in per_prompt]),
        # a server's draft and verify times are its own
        "draft_share": ci([s.draft_share for s in per_prompt]) if engine == "specq" else None,
        "speedup": ci([u.ratio(u.speedup_reference) for u in units]),
        "decode_speedup": ci([u.ratio(u.speedup_reference, "decode_tokens_per_s")
                              for u in units]),
        "speedup_paired": all(u.paired_runs for u in units),
        "predicted_speedup": predict(pooled, merge(base_pooled)) if base_pooled else None,
        # a server that counts no steps: unknown, not few
        "warmup_dominated": row["steps_per_prompt"] < MIN_STEPS and (engine == "specq"
                                                                     or pooled.steps > 0),
        "mismatches": mismatches, "unchecked": unchecked,
        "compared": compared([r for u in units for r in u.runs + u.base_runs[:1]]),
        "peer_tokens_per_s": ci([u.tokens_per_s(u.peer_runs) for u in units]),
        "vs_peer": ci([u.ratio(u.peer_runs) for u in units]),
        "peer_identical": [sum(_same(u.peer_runs, u.base_runs) for u in units if u.peer_runs),
                           sum(bool(u.peer_runs and u.base_runs) for u in units)],
        "peer_skipped": peer_skipped,
    }


def _at(values: list, i: int):
    """Position i of a run's per-position values; None past its end (a server's run that drafted
    fewer positions than others)."""
    return values[i] if i < len(values) else None


def _same(runs: list[dict], base_runs: list[dict]) -> bool:
    return (bool(runs and base_runs)
            and all(r["token_ids"] == base_runs[0]["token_ids"] for r in runs))


def _mismatches(units: list[Unit]) -> tuple[list[dict], int]:
    """Every greedy run whose tokens differ from the baseline's, and how many
    prompts had no baseline. Where either side has no token ids (a server that returns text
    alone), the texts are compared, and the position is a character's."""
    found, unchecked = [], 0
    for u in units:
        if not u.base_runs:
            unchecked += 1
            continue
        expected = u.base_runs[0]
        for r in u.runs:
            unit = "token" if r["token_ids"] and expected["token_ids"] else "character"
            field = "token_ids" if unit == "token" else "text"
            position = quality.first_mismatch(r[field], expected[field])
            if position is not None:
                found.append({"set": u.set, "prompt": u.prompt, "repeat": r["repeat"],
                              "position": position} | ({"unit": unit} if unit != "token" else {}))
    return found, unchecked


def compared(units_runs: list[dict]) -> str:
    """How a row's outputs were compared with the baseline's: "tokens", or "text" where a run
    carries no token ids."""
    return "tokens" if all(r["token_ids"] for r in units_runs) else "text"


def predict(spec: DecodeStats, base: DecodeStats) -> float | None:
    """Analytic speedup from measured parts: tokens per step / (step cost / baseline token cost),
    with tokens per step = 1 + accepted draft tokens per step, step cost = draft time per step
    (the tokens actually drafted: the early stop and the token budget shorten proposals below
    gamma) + verify time per pass, and the baseline's forward time per token. It leaves out
    prefill and loop overhead: the gap to the measured speedup is what they cost."""
    if not (spec.steps and spec.drafted and base.steps and base.verify_s > 0):
        return None
    expected = 1.0 + spec.accepted / spec.steps
    step_cost = (spec.draft_s + spec.verify_s) / spec.steps
    return expected / (step_cost / (base.verify_s / base.steps))


def _profile(members: list[dict], pooled: DecodeStats, tree: bool = False) -> dict:
    """Milliseconds per forward for each model and phase, and where a decode step's time goes. The
    draft step of a chain is one draft forward (one token); of a token tree, growing one whole tree
    (a forward per level grown, some of which the kept tree may not reach), over the steps that
    drafted one (depth 1 reached)."""
    prefill = {side: [x for c in members for x in c.get("prefill_ms", {}).get(side, [])]
               for side in ("target", "draft")}
    ms = lambda total, n: total * 1000 / n if n else None  # noqa: E731
    # trees grown, or forwards
    drafts = pooled.drafted_at[0] if tree and pooled.drafted_at else pooled.drafted
    out = {"target_prefill_ms": _mean(prefill["target"]),
           "draft_prefill_ms": _mean(prefill["draft"]),
           # a verify pass (plain: one token)
           "target_forward_ms": ms(pooled.verify_s, pooled.steps),
           # one draft forward (a chain), one tree grown
           "draft_step_ms": ms(pooled.draft_s, drafts),
           "other_per_step_ms": ms(pooled.other_s, pooled.steps),
           "step_ms": ms(pooled.decode_s, pooled.steps)}
    if pooled.decode_s > 0:
        out.update(draft_share=pooled.draft_s / pooled.decode_s,
                   verify_share=pooled.verify_s / pooled.decode_s,
                   other_share=pooled.other_s / pooled.decode_s)
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _mark_best_gamma(rows: list[dict]) -> None:
    """Flag the fastest gamma of each configuration that sweeps gamma."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        r["best_gamma"] = r["gamma_swept"] = False
        # a tree shape's depths are swept apart from the chain's gammas
        if r["kind"] == "speculative":
            key = (r["target"], r["draft"], r["draft_confidence"], r["tree"], r["tree_topk"],
                   r["suffix_cache"], r["max_new_tokens"], r["temperature"], r["threads"],
                   r["set"])
            groups.setdefault(key, []).append(r)
    for group in groups.values():
        if len({r["gamma"] for r in group}) > 1:
            for r in group:
                r["gamma_swept"] = True
            best = max(group, key=lambda r: r["speedup"][0] if r["speedup"] else -math.inf)
            best["best_gamma"] = True


def run_records(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("type") == "run"]


def failures(rows: list[dict]) -> list[str]:
    """One line per correctness failure (greedy speculative output != baseline output)."""
    out = []
    for r in rows:
        tree = f" tree={r['tree']} topk={r['tree_topk']}" if r.get("tree") else ""
        tree += " suffix_cache" if r.get("suffix_cache") else ""
        for m in r.get("mismatches", []):
            out.append(f"{r['target']} + {r['draft']} gamma={r['gamma']}{tree} "
                       f"n={r['max_new_tokens']}: {m['set']} prompt {m['prompt']} repeat "
                       f"{m['repeat']} differs from the baseline at {m.get('unit', 'token')} "
                       f"{m['position']}")
    return out


def heldout_rows(records: list[dict]) -> list[dict]:
    """The quality stage's records (`heldout.py`): one row per target ref (the first record of a
    key wins), fp32 first."""
    seen: dict[str, dict] = {}
    for r in records:
        if r.get("type") == "quality":
            seen.setdefault(r["key"], r)
    out = [{"target": r["target"]["ref"], "precision": model_ref(r["target"]["ref"]).spec,
            "reference": r["reference"]["ref"],
            "tokens": r["result"]["tokens"], "chunks": r["result"]["chunks"],
            "ppl": _triple(r["result"]["ppl_b"]), "top1": _triple(r["result"]["top1"]),
            "kl": _triple(r["result"]["kl_ab"])} for r in seen.values()]
    return sorted(out, key=lambda r: (r["precision"] != "fp32", r["target"]))


def _triple(value: dict) -> list[float]:
    return [value["mean"], value["low"], value["high"]]
