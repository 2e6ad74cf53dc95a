"""Summary rows -> tables of strings, rendered by the terminal (rich) and the report (Markdown,
HTML) alike, so every view shows the same numbers under the same names."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.gamma import AUTO_MAX_GAMMA
from ..loading.refs import ModelRef, NgramRef, draft_ref, model_ref
from .aggregate import MIN_STEPS

TAU = "tau (bonus incl.)"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    failed: list[bool] = field(default_factory=list)  # rows holding a correctness failure: red
    caption: str = ""

    def add(self, cells: list[str], failed: bool = False) -> None:
        self.rows.append(cells)
        self.failed.append(failed)


def ci(value, spec: str = ".2f") -> str:
    """'mean [low, high]', or the mean alone when there is no spread."""
    if not value:
        return "-"
    mean, low, high = value
    if low == high:
        return format(mean, spec)
    return f"{mean:{spec}} [{low:{spec}}, {high:{spec}}]"


def gamma_label(row: dict) -> str:
    """gamma, and the draft-confidence stop when one was used; a token tree's
    size, depth and topk; '+ suffix cache' where the n-gram draft read earlier prompts' text."""
    suffix = " + suffix cache" if row.get("suffix_cache") else ""
    if row.get("tree"):
        return tree_label(row) + suffix
    stop = row.get("draft_confidence")
    # N, "auto" or -
    gamma = row["gamma"] if isinstance(row["gamma"], str) else num(row["gamma"], "d")
    return gamma + (f" (stop < {stop:g})" if stop else "") + suffix


def tree_label(row: dict, brief: bool = False) -> str:
    """'tree 16 (d4, k4)': a token tree of up to 16 nodes, 4 levels deep ('d auto': each step's
    depth chosen, up to 4), 4 children per expanded node ('tree 16 d4 k4' when `brief`)."""
    depth = f"d {row['gamma']}" if isinstance(row["gamma"], str) else f"d{row['gamma']}"
    return f"tree {row['tree']} {depth} k{row['tree_topk']}" if brief else \
        f"tree {row['tree']} ({depth}, k{row['tree_topk']})"


TREE_NOTE = ("tree N (dD, kK): a token tree (EAGLE-2) of up to N draft nodes, D levels deep ('d "
             f"auto': each step's depth chosen, up to {AUTO_MAX_GAMMA}), K children per expanded "
             "node")


def _trees(rows: list[dict]) -> bool:
    return any(r.get("tree") for r in rows)


def _servers(rows: list[dict]) -> bool:
    """Rows of servers measured over the OpenAI API (their names are no model refs)."""
    return any(r.get("engine", "specq") != "specq" for r in rows)


def _base(row: dict) -> str:
    return row["target"] if _servers([row]) else model_ref(row["target"]).name


def num(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def exactness(row: dict, brief: bool = False) -> str:
    """Whether greedy outputs equal the target's: '4/4 identical' ('4/4' when `brief`), a failure,
    sampling (not checkable token for token) or no baseline to check against; '' for baselines."""
    if row["kind"] != "speculative":
        return ""
    if not row["greedy"]:
        return "sampled" if brief else "n/a (sampling)"
    if row["mismatches"]:
        return (f"FAIL {len(row['mismatches'])}"
                if brief else f"FAIL: {len(row['mismatches'])} differ")
    checked = row["prompts"] - row["unchecked"]
    if not checked:
        return "unchecked" if brief else "no baseline"
    text = row.get("compared") == "text"  # a server that returned no token ids
    return f"{checked}/{row['prompts']}" + (" text" * text if brief else
                                           " identical" + " (text)" * text)


def notes(row: dict) -> str:
    out = []
    if row["best_gamma"]:
        out.append("best gamma")
    if row["warmup_dominated"]:
        out.append(f"warm-up dominated ({row['steps_per_prompt']:.1f} < {MIN_STEPS} steps/prompt)")
    if row["kind"] == "speculative" and not row["speedup_paired"]:
        out.append("speedup vs the baseline cell, timed earlier (not paired)")
    if row["peer_skipped"]:
        out.append(f"no HF peer: {row['peer_skipped']}")
    same, compared = row["peer_identical"]
    # transformers' float kernels may break near-ties differently: informative only
    if same < compared:
        out.append(f"HF output differs on {compared - same}/{compared} prompts")
    return "; ".join(out)


def mean(value, spec: str = ".2f") -> str:
    return num(value[0] if value else None, spec)


def _best_only(rows: list[dict]) -> tuple[list[dict], int]:
    """For a gamma sweep, the best gamma of each configuration (and every failing row); how many
    rows that hides."""
    hidden = [r for r in rows if r["gamma_swept"] and not r["best_gamma"] and not r["mismatches"]]
    return [r for r in rows if not any(r is h for h in hidden)], len(hidden)


def summary(rows: list[dict], confidence: float) -> Table:
    """The main table of the report: every row, every column."""
    vary = {k: len({r[k] for r in rows}) > 1 for k in ("temperature", "threads", "set")}
    peer = any(r["peer_tokens_per_s"] for r in rows)
    em = any(r["em"] for r in rows)
    trees = _trees(rows)  # a chain-only table is as it was before token trees
    servers = _servers(rows)  # and one of specq's own engine as it was before servers
    headers = ["target", "draft", "gamma / tree" if trees else "gamma", "new tokens"]
    headers += [h for h, k in (("T", "temperature"), ("threads", "threads"), ("prompt set", "set"))
                if vary[k]]
    headers += ["prompts", "accept rate", TAU] + ["nodes per pass"] * trees
    headers += ["tok/s"] + ["TTFT ms", "ms per token"] * servers
    headers += ["speedup", "predicted", "draft share"]
    headers += (["GSM8K EM"] * em + ["HF assisted tok/s", "vs HF"] * peer
                + ["vs baseline output", "notes"])
    table = Table("specq bench", headers)
    for r in rows:
        cells = [r["target"], r["draft"] or "(target alone)", gamma_label(r),
                 str(r["max_new_tokens"])]
        cells += [str(r[k]) for k in ("temperature", "threads", "set") if vary[k]]
        cells += ([str(r["prompts"]), ci(r["acceptance_rate"]), ci(r["tau"])]
                  + [ci(r.get("nodes_per_pass"))] * trees)
        cells += [ci(r["tokens_per_s"], ".1f")]
        cells += [ci(r.get("ttft_ms"), ".1f"), ci(r.get("itl_ms"), ".2f")] * servers
        cells += [ci(r["speedup"])
                  if r["kind"] == "speculative" else "1 (ref)", num(r["predicted_speedup"]),
                  ci(r["draft_share"])]
        cells += [ci(r["em"])] * em + [ci(r["peer_tokens_per_s"], ".1f"), ci(r["vs_peer"])] * peer
        cells += [exactness(r), notes(r)]
        table.add(cells, failed=bool(r["mismatches"]))
    table.caption = (f"mean [{confidence:.0%} bootstrap CI over prompts]; {TAU} = "
                     "tokens per target pass, the target's own token included; speedup = tokens/s "
                     "over the same target's baseline, per prompt, then mean; predicted = analytic "
                     "(measured accepted tokens per step and costs, no prefill or loop overhead)")
    if servers:
        table.caption += ("; servers (engine openai): target = the baseline server's model, "
                          "draft = the server's name; TTFT = request to first token and ms per "
                          "token = between the first and the last, as the client saw them; "
                          "acceptance from the server's metrics")
    if trees:
        table.caption += ("; " + TREE_NOTE + "; nodes per pass = draft nodes (a chain's tokens) "
                                             "per target pass; "
                          "a tree's accept rate is over all its nodes, of which one path at most "
                          "is accepted")
    return table


def brief(rows: list[dict], confidence: float, best_only: bool = False) -> Table:
    """The terminal's table: few, narrow columns, so it reads in an 80-column terminal (and in a
    log); the report has every column."""
    shown, hidden = _best_only(rows) if best_only else (rows, 0)
    bases = {_base(r) for r in rows}
    lengths = {r["max_new_tokens"] for r in rows}
    trees = _trees(shown)
    headers = ["target", "draft", "gamma"] + ["tokens"] * (len(lengths) > 1)
    title = ("specq bench: " + " ".join(sorted(bases))
             + (f", {lengths.pop()} tokens" if len(lengths) == 1 else ""))
    table = Table(title, headers + [TAU.split()[0], f"speedup [{confidence:.0%} CI]", "lossless"])
    for r in shown:
        target = r["target"] if len(bases) > 1 or _servers([r]) else r["target_precision"]
        stop = f" <{r['draft_confidence']:g}" if r.get("draft_confidence") else ""
        gamma = (r["gamma"] if isinstance(r["gamma"], str) else num(r["gamma"], "d")) + stop
        gamma = (tree_label(r, brief=True) if r.get("tree") else gamma
                 ) + " +suffix" * bool(r.get("suffix_cache"))
        cells = [target, short_draft(r), gamma] + [str(r["max_new_tokens"])] * (len(headers) == 4)
        speedup = ci(r["speedup"]) if r["kind"] == "speculative" else "1 (ref)"
        flag = ("*" if r["warmup_dominated"]
                or (r["kind"] == "speculative" and not r["speedup_paired"]) else "")
        table.add(cells + [mean(r["tau"]), speedup + flag, exactness(r, brief=True)],
                  failed=bool(r["mismatches"]))
    table.caption = ("gamma N <c: proposals end early below draft confidence c; "
                     + ("tree N dD kK: a token tree of up to N nodes, D levels deep, K children "
                        "per node; " * trees)
                     + ("+suffix: the n-gram draft also read the text of the prompts run before "
                        "it (a suffix cache); " * any(r.get("suffix_cache") for r in shown))
                     + "tau = tokens per target pass; "
                     "speedup = tokens/s over the target alone on the same prompt, "
                     f"mean [{confidence:.0%} bootstrap CI over prompts]; * = see the report's "
                     "notes"
                     + (f"; best gamma shown ({hidden} more rows)" if hidden else "")
                     + ". Every column (tok/s, acceptance, predicted, draft share, HF peer, "
                       "notes): specq report")
    return table


def short_draft(row: dict) -> str:
    """The draft's name without its target's prefix or a path ('smollm2-135m-feature-draft' ->
    'feature-draft'), with its precision unless fp32."""
    if not row["draft"]:
        return "(alone)"
    if _servers([row]):
        return row["draft"]
    ref = draft_ref(row["draft"])
    if len(ref.levels) > 1:  # a hierarchy, cheapest level first
        return " > ".join(short_draft({**row, "draft": level.text,
                                       "draft_precision": _precision(level)})
                          for level in ref.levels)
    if ref.lookup is not None:  # its own spec, then its fallback model's short name
        fallback = ref.lookup.fallback
        return ref.lookup.draft.ref + ("" if fallback is None else
                                       "+" + short_draft({**row, "draft": fallback.text}))
    name = ref.levels[0].name.rstrip("/").rsplit("/", 1)[-1]
    base = model_ref(row["target"]).name
    name = "self" if name == base else name[len(base) + 1:] if name.startswith(base + "-") else name
    precision = row.get("draft_precision")
    return name + (f"@{precision}" if precision and precision != "fp32" else "")


def _precision(level: ModelRef | NgramRef) -> str | None:
    return level.spec if isinstance(level, ModelRef) else None  # an n-gram draft has none


def per_position(rows: list[dict]) -> Table:
    """U_i = P(accepted length >= i) and a_i = P(token i accepted | 1..i-1 accepted)."""
    spec = [r for r in rows if r["kind"] == "speculative"]
    width = max((len(r["U"]) for r in spec), default=0)
    trees = _trees(spec)
    table = Table("per-position acceptance",
                  ["target", "draft", "gamma / tree" if trees else "gamma", "new tokens",
                   "convention"] + [str(i + 1) for i in range(width)])
    for r in spec:
        for name, values in (("U_i (unconditional)", r["U"]), ("a_i (conditional)", r["a"])):
            table.add([r["target"], r["draft"], gamma_label(r), str(r["max_new_tokens"]), name]
                      + [num(v[0] if v else None) for v in values] + [""] * (width - len(values)))
    if trees:
        table.caption = ("i = draft position; for a token tree, depth i: P(the accepted path "
                         "reaches depth i), and P(it goes on from depth i-1 to i); a level counts "
                         "once, however many nodes it holds. "
                         + TREE_NOTE)
    return table


def profile(rows: list[dict]) -> Table:
    """Milliseconds per forward for each model and phase, and the split of a decode step."""
    trees = _trees(rows)
    table = Table("profile (ms per forward)",
                  ["target", "draft", "gamma / tree" if trees else "gamma", "new tokens",
                   "target prefill", "draft prefill", "target pass (verify / plain step)",
                   "draft step", "other per step", "step", "draft / verify / other"])
    if trees:
        table.caption = ("draft step: one draft forward (a chain's token); for a token tree, "
                         "growing one whole tree (a forward per level). " + TREE_NOTE)
    for r in rows:
        if _servers([r]):  # a server's times are its own
            continue
        p = r["profile"]
        split = (f"{p['draft_share']:.0%} / {p['verify_share']:.0%} / {p['other_share']:.0%}"
                 if "draft_share" in p else "-")
        table.add([r["target"], r["draft"] or "(target alone)", gamma_label(r),
                   str(r["max_new_tokens"]), num(p["target_prefill_ms"], ".1f"),
                   num(p["draft_prefill_ms"], ".1f"), num(p["target_forward_ms"], ".2f"),
                   num(p["draft_step_ms"], ".2f"), num(p["other_per_step_ms"], ".2f"),
                   num(p["step_ms"], ".2f"), split])
    return table


def quality(rows: list[dict]) -> Table:
    """Task quality per target precision (baseline outputs) and lossless-ness per pair."""
    table = Table("quality per precision",
                  ["target", "precision", "draft", "gamma", "new tokens", "GSM8K EM",
                   "prompts scored", "vs baseline output"])
    for r in rows:
        if r["kind"] == "baseline" or r["mismatches"] or r["em"]:
            table.add([r["target"], r["target_precision"], r["draft"] or "(target alone)",
                       gamma_label(r), str(r["max_new_tokens"]), ci(r["em"]), str(r["em_prompts"]),
                       exactness(r)],
                      failed=bool(r["mismatches"]))
    return table


def heldout(rows: list[dict], confidence: float = 0.95) -> Table:
    """The quality stage (`heldout.py`): each target precision against fp32 on held-out text."""
    table = Table("quality per precision, held-out text",
                  ["target", "tokens", f"perplexity [{confidence:.0%} CI]",
                   f"top-1 = fp32 [{confidence:.0%} CI]"])
    for r in rows:
        table.add([r["target"], str(r["tokens"]), ci(r["ppl"], ".1f"), ci(r["top1"], ".3f")])
    table.caption = ("perplexity of the target on held-out Shakespeare chunks; top-1 = fp32: how "
                     "often its most likely next token is the fp32 model's (the greedy acceptance "
                     "a perfect fp32-trained draft could keep); CIs over chunks. Full divergences: "
                     "specq compare")
    return table
