"""A benchmark sweep: TOML file and/or flags -> validated `BenchConfig` -> the list of `Cell`s.

Every key of the TOML file is also a flag (`max_new_tokens` <-> `--max-new-tokens`); flags win.
A bad value raises a one-line SpecqError naming its key, before any model is loaded. A cell is
one configuration on one prompt set; its key hashes everything that changes its numbers, so a
re-run skips finished cells and an edited sweep only runs what is new.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..checks import MAX_COUNT, MAX_SEED, MAX_THREADS, writable_parent
from ..core.gamma import AUTO, AUTO_MAX_GAMMA, MAX_GAMMA
from ..data import user_texts
from ..drafters.base import DEFAULT_GAMMA
from ..drafters.sequence import DEFAULT_DRAFT_CONFIDENCE
from ..drafters.tree import DEFAULT_TREE, TreeShape
from ..errors import SpecqError
from ..loading import precision
from ..loading.builtins import BUILTINS
from ..loading.drafts import default
from ..loading.drafts.select import default_draft_ref
from ..loading.refs import LookaheadRef, ModelRef, NgramRef, check_ref, draft_ref, model_ref
from ..loading.vocab import check_names, check_target_ref
from .prompts import SETS, Prompt
from .servers import Server
from .servers import parse as parse_servers

ENGINES = ("specq", "openai")  # specq in this process, or servers that speak the OpenAI API
REGISTRY = "registry"  # a draft entry meaning "the registry's draft for this target"
DEFAULT = "default"  # a draft entry meaning "the target's default draft" (`drafts/default.py`)
# the most nodes (and children per node) of a token tree, as `specq generate --tree`
MAX_TREE = MAX_GAMMA


def registry_draft(target_ref: str, quantizable: bool = False) -> str | None:
    """The draft the registry picks for a target ref at its precision (None: it has none);
    `quantizable`: for a quantized draft precision, so not a feature draft (float only)."""
    return default_draft_ref(target_ref, quantizable)


@dataclass(frozen=True)
class BenchConfig:
    targets: list[str] = dataclasses.field(default_factory=lambda: ["smollm2-135m"])
    target_quant: list[str] = dataclasses.field(default_factory=list)  # crossed with targets
    drafts: list[str] = dataclasses.field(default_factory=lambda: [DEFAULT])
    draft_quant: list[str] = dataclasses.field(default_factory=list)  # crossed with drafts
    # N or "auto"
    gamma: list[int | str] = dataclasses.field(default_factory=lambda: [DEFAULT_GAMMA])
    draft_confidence: list[float] = dataclasses.field(
        default_factory=lambda: [DEFAULT_DRAFT_CONFIDENCE])
    # token tree node counts; 0: a chain
    tree: list[int] = dataclasses.field(default_factory=lambda: [0])
    # crossed with tree
    tree_topk: list[int] = dataclasses.field(default_factory=lambda: [DEFAULT_TREE.topk])
    # n-gram drafts also look in the earlier prompts' text of the cell (a suffix cache): a prompt's
    # numbers then depend on the prompts before it, so off unless asked
    suffix_cache: list[bool] = dataclasses.field(default_factory=lambda: [False])
    max_new_tokens: list[int] = dataclasses.field(default_factory=lambda: [64])
    temperature: list[float] = dataclasses.field(default_factory=lambda: [0.0])
    prompt_sets: list[str] = dataclasses.field(default_factory=lambda: ["chat"])
    prompts: int = 8  # per prompt set
    prompt_file: str | None = None  # for the "file" prompt set
    prompt_field: str = "text"
    prompt_file_chat: bool = True
    repeats: int = 1
    threads: list[int] = dataclasses.field(default_factory=list)  # empty: torch's current count
    seed: int = 0
    ignore_eos: bool = True  # fixed output length: every cell times the same number of tokens
    peer: bool = False  # also time transformers' assisted generation on the same pair
    paired: bool = True  # time a plain run next to every speculative run: speedups immune to drift
    profile: bool = False  # print ms per forward per model and phase
    # plain eager kernels instead of the fast path (fastpath.py), e.g. to compare them
    eager: bool = False
    quality_chunks: int = 4  # held-out text chunks per target precision (0: no quality stage)
    resamples: int = 2000
    confidence: float = 0.95
    results: str = "bench-results.jsonl"
    engine: str = "specq"
    # engine "openai": [[servers]] tables (`servers.py`): name, url, baseline, model, start, ...
    servers: list[dict] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def target_refs(self) -> list[str]:
        return _cross(self.targets, self.target_quant)

    def draft_entries(self) -> list[str]:
        return _cross(self.drafts, self.draft_quant)

    def server_list(self) -> list[Server]:
        """The servers of engine "openai", the baseline first."""
        return parse_servers(self.servers)


HELP = {
    "targets": "target model refs, optionally name@spec",
    "target_quant": "precisions / quant specs crossed with every target (fp32, int8, int4-g64-rtn, "
                    "...)",
    "drafts": "draft model refs, 'default' (each target's default: its registered draft, else a "
              "smaller model with its tokenizer, behind an n-gram lookup), 'registry' (the "
              "registry's draft alone), self@SPEC (the "
              "target's own weights at SPEC), REF:window=W (a model draft reading the prompt's "
              "last W tokens), ngram[:n=N|n=MIN-MAX][:k=K][:c=C] (n-gram lookup, no model; its k, "
              "c where the text copies its source, is the draft length), ngram+REF (the model "
              "REF where nothing matches), "
              "lookahead[:w=W][:n=N][:g=G] (lookahead decoding, no model; its shape sets the "
              "depth), or refs joined by commas, cheapest first (a hierarchy)",
    "draft_quant": "precisions / quant specs crossed with every draft",
    "gamma": ("draft tokens per step (a token tree's depth), or 'auto' (the default: each step's "
              "length chosen from measured costs, up to 4)"),
    "draft_confidence": ("end a proposal early below this draft probability (default "
                         f"{DEFAULT_DRAFT_CONFIDENCE}; 0 = off; the peer gets the same)"),
    "tree": ("token trees (EAGLE-2) of up to N draft nodes, gamma levels deep ('auto': each step's "
             f"depth, up to {AUTO_MAX_GAMMA}); 0 = a chain (default)"),
    "tree_topk": "children per expanded tree node and nodes expanded per level (default "
                 f"{DEFAULT_TREE.topk})",
    "suffix_cache": "n-gram drafts also look in the text (prompt and output) of the prompts run "
                    "before in the same cell and repeat, as `specq serve` does across requests; "
                    "true, false or both (default false: each prompt measured on its own)",
    "max_new_tokens": "output lengths",
    "temperature": "0 = greedy (outputs checked against the baseline token for token)",
    "prompt_sets": "chat, gsm8k, code, edit, long-edit (standard library modules to edit), corpus "
                   "(Shakespeare continuations), file (--prompt-file)",
    "prompts": "prompts per set",
    "prompt_file": "the user prompt file of the 'file' set (.jsonl, or plain text split on blank "
                   "lines)",
    "prompt_field": "the JSONL field holding the prompt (default text)",
    "prompt_file_chat": "apply the chat template to the file's prompts (default true)",
    "repeats": "timed generations per prompt (pooled per prompt)",
    "threads": "torch CPU thread counts (default: torch's current count)",
    "seed": "sampling seed",
    "ignore_eos": "run every output to max_new_tokens (default true)",
    "peer": "also time transformers' assisted generation on the same float pair",
    "eager": "run the plain eager kernels instead of the fast path (specq's and oneDNN's CPU "
             "kernels)",
    "paired": "time the target alone right next to every speculative run, and take speedups from "
              "those pairs",
    "profile": "print ms per forward for each model and phase",
    "quality_chunks": ("held-out text chunks for each target precision's perplexity and top-1 "
                       "agreement with fp32 (0 = skip)"),
    "resamples": "bootstrap resamples per CI",
    "confidence": "CI confidence level",
    "results": "the JSONL results store (appended cell by cell; re-runs resume)",
    "engine": "specq (this process, the default) or openai: the servers of the config file's "
              "[[servers]] tables, each reached over the OpenAI API (vLLM, llama-server, specq "
              "serve, ...); see docs/guide.md, 'Measuring another engine'",
    "servers": "engine openai: [[servers]] tables with name, url, baseline = true for exactly one, "
               "and optionally model, api_key, start (a command that starts it), start_timeout, "
               "body (extra request fields), gamma",
}
FILE_ONLY = {"servers"}  # a list of tables: no flag
# what only specq's own engine has: a server is set by its own command line
SPECQ_ONLY = ("targets", "target_quant", "drafts", "draft_quant", "gamma", "draft_confidence",
              "tree", "tree_topk", "suffix_cache", "threads", "peer", "profile", "eager",
              "quality_chunks")
KEYS = tuple(f.name for f in dataclasses.fields(BenchConfig))
LIST_KEYS = {"targets": str, "target_quant": str, "drafts": str, "draft_quant": str, "gamma": int,
             "draft_confidence": float, "tree": int, "tree_topk": int, "max_new_tokens": int,
             "temperature": float, "prompt_sets": str, "threads": int, "suffix_cache": bool}


def _cross(refs: list[str], specs: list[str]) -> list[str]:
    """Canonical refs `name@spec`: each ref at each spec (or at its own spec when none given). A
    hierarchy (refs joined by commas) keeps each level's own spec; an n-gram draft has no precision
    (its fallback model has)."""
    out = []
    for text in refs:
        if text == REGISTRY:
            out += [REGISTRY if not specs else f"{REGISTRY}@{s}" for s in specs or [None]]
            continue
        if text == DEFAULT:  # its model runs at the precision the default gives it
            out.append(DEFAULT)
            continue
        ref = draft_ref(text)
        if len(ref.levels) > 1:
            out.append(",".join(level.canonical() for level in ref.levels))
        elif ref.lookup_alone:  # no model: no precision to cross
            out.append(ref.lookup.canonical())
        else:
            out += [ref.levels[0].canonical(s) for s in specs or [None]]
    return list(dict.fromkeys(out))


def load_config(path: str | None, overrides: dict | None = None) -> BenchConfig:
    """The sweep from a TOML file (optional) with flag overrides (None values ignored)."""
    raw: dict = {}
    if path:
        file = Path(path)
        if not file.is_file():
            raise SpecqError(f"bench config file not found: {file}")
        try:
            raw = tomllib.loads(file.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise SpecqError(f"bench config {file}: invalid TOML: {e}") from None
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    config = validate(raw)
    if config.engine == "specq":
        check_models_exist(config)
    return config


def validate(raw: dict) -> BenchConfig:
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise SpecqError(f"bench config: unknown key '{unknown[0]}' (valid keys: "
                         f"{', '.join(KEYS)})")
    values = {}
    for key, value in raw.items():
        if key in LIST_KEYS:
            value = _list(key, value, LIST_KEYS[key])
        values[key] = value
    config = BenchConfig(**values)
    _check("engine", config.engine in ENGINES, f"must be one of {', '.join(ENGINES)}")
    if config.engine == "openai":
        config.server_list()
        defaults = BenchConfig()
        given = [k for k in SPECQ_ONLY if k in values and values[k] != getattr(defaults, k)]
        _check(given[0] if given else "engine", not given,
               "is specq's own engine's; with engine 'openai' each server runs as its command "
               "sets it (one row per server)")
        config = dataclasses.replace(config, quality_chunks=0)
    else:
        _check("servers", not config.servers, "needs engine = 'openai'")
    for key in ("prompts", "repeats", "resamples"):
        _check(key, _is(getattr(config, key), int) and 1 <= getattr(config, key) <= MAX_COUNT,
               f"must be an integer in [1, {MAX_COUNT}]")
    _check("seed", _is(config.seed, int) and 0 <= config.seed <= MAX_SEED,
           f"must be an integer in [0, {MAX_SEED}]")
    _check("quality_chunks",
           _is(config.quality_chunks, int) and 0 <= config.quality_chunks <= MAX_COUNT,
           f"must be an integer in [0, {MAX_COUNT}]")
    for key in ("prompt_file_chat", "ignore_eos", "peer", "paired", "profile", "eager"):
        _check(key, _is(getattr(config, key), bool), "must be true or false")
    for key in ("prompt_field", "results"):
        _check(key, isinstance(getattr(config, key), str) and getattr(config, key),
               "must be a non-empty string")
    _check("prompt_file", config.prompt_file is None or isinstance(config.prompt_file, str),
           "must be a path")
    _check("confidence", _is(config.confidence, float) and 0.5 <= config.confidence < 1,
           "must be in [0.5, 1)")
    for key, most in (("gamma", MAX_GAMMA), ("max_new_tokens", MAX_COUNT),
                      ("threads", MAX_THREADS)):
        _check(key, all(v == AUTO or 1 <= v <= most for v in getattr(config, key)),
               f"every value must be in [1, {most}]")
    _check("temperature", all(0 <= t <= 100 for t in config.temperature),
           "every value must be in [0, 100]")
    _check("draft_confidence", all(0 <= c < 1 for c in config.draft_confidence),
           "every value must be in [0, 1)")
    _check("tree", all(0 <= n <= MAX_TREE for n in config.tree),
           f"every value must be 0 (a chain) or a node count in [1, {MAX_TREE}]")
    _check("tree_topk", all(1 <= k <= MAX_TREE for k in config.tree_topk),
           f"every value must be in [1, {MAX_TREE}]")
    _check("results", not Path(config.results).is_dir(),
           f"'{config.results}' is a folder; give a .jsonl file")
    for key in ("targets", "drafts", "gamma", "draft_confidence", "tree", "tree_topk",
                "max_new_tokens", "temperature", "prompt_sets", "suffix_cache"):
        _check(key, bool(getattr(config, key)), "must not be empty")
    for s in config.prompt_sets:
        _check("prompt_sets", s in SETS, f"unknown prompt set '{s}' (valid: {', '.join(SETS)})")
    if "file" in config.prompt_sets:
        _check("prompt_file", config.prompt_file is not None,
               "is required by the 'file' prompt set")
        _check("prompt_file", Path(config.prompt_file).is_file(),
               f"file not found: {config.prompt_file}")
        try:
            user_texts(config.prompt_file, config.prompt_field)
        except SpecqError as e:
            raise SpecqError(f"bench config 'prompt_file': {e}") from None
    _check_specs("targets", config.targets, config.target_quant)
    _check_specs("drafts", config.drafts, config.draft_quant)
    try:
        writable_parent(Path(config.results), "results")
    except SpecqError as e:
        raise SpecqError(f"bench config 'results': {e}") from None
    if not config.threads and config.engine == "specq":
        import torch

        config = dataclasses.replace(config, threads=[torch.get_num_threads()])
    return config


def _check(key: str, ok: bool, why: str) -> None:
    if not ok:
        raise SpecqError(f"bench config '{key}': {why}")


def _is(value, kind: type) -> bool:
    """Type check where a bool is not a number and an int is a float (TOML writes 0 for 0.0)."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, kind) or (kind is float and isinstance(value, int))


def _list(key: str, value, kind: type) -> list:
    items = value if isinstance(value, list) else [value]
    for v in items:
        if key == "gamma" and v == AUTO:
            continue
        _check(key, _is(v, kind), f"expected {kind.__name__} values"
               + " or 'auto'" * (key == "gamma") + f", got {v!r}")
    return list(dict.fromkeys(float(v) if kind is float else v for v in items))


def _check_specs(key: str, refs: list[str], specs: list[str]) -> None:
    for spec in specs:
        try:
            precision.canonical(spec)
        except SpecqError as e:
            raise SpecqError(f"bench config '{key[:-1]}_quant': {e}") from None
    for text in refs:
        try:
            ref = draft_ref(text)
            for model in ref.models:
                model.parsed_spec  # noqa: B018 (a bad spec is an error here)
        except SpecqError as e:
            raise SpecqError(f"bench config '{key}': {e}") from None
        if specs and len(ref.levels) > 1:
            raise SpecqError(f"bench config '{key}': the hierarchy '{text}' sets each level's "
                             f"precision; drop '{key[:-1]}_quant'")
        if specs and any(model.has_spec for model in ref.models):
            raise SpecqError(f"bench config '{key}': '{text}' has its own @spec; drop it or drop "
                             f"'{key[:-1]}_quant'")


def check_models_exist(config: BenchConfig) -> None:
    """Local model paths exist and hold loadable folders (`check_ref`), and bare names are built-ins
    (hub ids are left to load), so a typo or a broken folder fails before the sweep starts rather
    than after its first stage."""
    drafts = [model for ref in config.drafts for model in draft_ref(ref).models]
    for key, refs in (("targets", [model_ref(ref) for ref in config.targets]), ("drafts", drafts)):
        for ref in refs:
            name = ref.name
            path_like = name.startswith((".", "/", "~")) or name.endswith(".gguf")
            hub_id = "/" in name and not path_like
            named_later = key == "drafts" and (name in (REGISTRY, DEFAULT) or ref.is_self)
            if named_later or name in BUILTINS or hub_id:
                continue
            if name and Path(name).expanduser().exists():
                _checked(key, ref)
                continue
            raise SpecqError(f"bench config '{key}': model '{name}' not found (not a built-in "
                             f"({', '.join(BUILTINS)}), an existing path or a hub id org/name)")
    paired = [model for model in drafts if model.name not in (REGISTRY, DEFAULT)
              and not model.is_self]
    for target in config.target_refs():  # what the refs and file headers show, before a load
        try:
            check_target_ref(target)
        except SpecqError as e:
            raise SpecqError(f"bench config 'targets': {e}") from None
        for model in paired:
            try:
                check_names(model, target)
            except SpecqError as e:
                raise SpecqError(f"bench config 'drafts': {e}") from None


def _checked(key: str, ref: ModelRef) -> None:
    try:
        check_ref(ref)
    except SpecqError as e:
        raise SpecqError(f"bench config '{key}': {e}") from None


# ---------------------------------------------------------------------------------- cells


@dataclass(frozen=True)
class Cell:
    kind: str  # baseline | speculative | peer
    target: str
    draft: str | None
    gamma: int | str | None  # N or "auto"
    draft_confidence: float | None
    max_new_tokens: int
    temperature: float
    threads: int
    set: str
    prompts_sha: str  # the prompt texts themselves: a changed prompt file is a new cell
    n_prompts: int
    repeats: int
    seed: int
    ignore_eos: bool
    paired: bool = False  # speculative cells: a plain run timed next to each speculative run
    kernels: str = "fast"  # "fast" (fastpath.py) or "eager"
    # speculative cells: a token tree of up to this many nodes, `gamma` levels deep (0: a chain)
    tree: int = 0
    tree_topk: int | None = None  # ... with this many children per expanded node
    # n-gram cells: each prompt also drafts from the text of the prompts before it (per repeat)
    suffix_cache: bool = False
    # engine "openai": the baseline server's identity (`Server.identity`), in every cell, and the
    # measured server's, in speculative cells; `target` and `draft` are the servers' names then
    engine: str = "specq"
    baseline_server: str | None = None
    server: str | None = None

    def params(self) -> dict:
        """The cell's parameters as stored and hashed; a chain's hold no tree fields, a cell
        without a suffix cache no `suffix_cache`, and specq's own cells no server fields, so its
        key and record are those it had before any of them existed."""
        params = dataclasses.asdict(self)
        if not self.tree:
            del params["tree"], params["tree_topk"]
        if not self.suffix_cache:
            del params["suffix_cache"]
        if self.engine == "specq":
            del params["engine"], params["baseline_server"], params["server"]
        elif self.server is None:
            del params["server"]
        return params

    def tree_shape(self) -> TreeShape | None:
        """The TreeShape a tree cell drafts with: `gamma` levels ('auto': each step's depth, up to
        AUTO_MAX_GAMMA); None for a chain."""
        return tree_shape(self.params())

    @property
    def key(self) -> str:
        return cell_key(self.params())


def cell_key(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:20]


def tree_shape(params: dict) -> TreeShape | None:
    """The token tree of a cell's (or summary row's) params, or None for a chain
    (no tree fields, or 0)."""
    if not params.get("tree"):
        return None
    depth = AUTO_MAX_GAMMA if params["gamma"] == AUTO else int(params["gamma"])
    return TreeShape(params["tree"], depth, params["tree_topk"])


def related(params: dict, kind: str) -> dict:
    """The params of the baseline (or peer) cell a speculative cell is compared with."""
    if kind == "baseline":
        params = {k: v for k, v in params.items()
                  if k not in ("tree", "tree_topk", "suffix_cache", "server")}
        return {**params, "kind": "baseline", "draft": None, "gamma": None,
                "draft_confidence": None, "paired": False}
    if kind == "peer":
        return {**params, "kind": kind, "paired": False}
    return {**params, "kind": kind}


def prompts_sha(prompts: list[Prompt]) -> str:
    return hashlib.sha256(json.dumps([[p.text, p.chat] for p in prompts]).encode()).hexdigest()[:16]


def plan(config: BenchConfig, prompt_sets: dict[str, list[Prompt]], registry=registry_draft
         ) -> tuple[list[Cell], list[str]]:
    """All cells in run order (per target: baselines, then each draft's speculative and peer
    cells, so each model is loaded once), and notes on what is left out and why."""
    if config.engine == "openai":
        return plan_servers(config, prompt_sets)
    cells: list[Cell] = []
    notes: list[str] = []
    for target in config.target_refs():
        common = [dict(max_new_tokens=n, temperature=t, threads=th, set=s,
                       prompts_sha=prompts_sha(prompt_sets[s]), n_prompts=len(prompt_sets[s]),
                       repeats=config.repeats, seed=config.seed, ignore_eos=config.ignore_eos,
                       kernels="eager" if config.eager else "fast")
                  for th in config.threads for n in config.max_new_tokens
                  for t in config.temperature
                  for s in config.prompt_sets]
        cells += [Cell(kind="baseline", target=target, draft=None, gamma=None,
                       draft_confidence=None, **c)
                  for c in common]
        for draft in _drafts_for(target, config, registry, notes):
            parsed = draft_ref(draft)
            alone = parsed.lookup_alone  # its k (shape) is the draft length; it has no early stop
            # only an n-gram draft reads a suffix cache
            caches = config.suffix_cache if isinstance(parsed.lookup, NgramRef) else [False]
            gammas = config.gamma if not alone else list(dict.fromkeys(
                g if g == AUTO else parsed.lookup.draft.longest(g) for g in config.gamma))
            if 0 in config.tree:  # chains
                peer = config.peer and parsed.lookup is None
                for kind in ("speculative", "peer") if peer else ("speculative",):
                    for g in gammas:
                        for conf in [None] if alone else config.draft_confidence:
                            cells += [Cell(kind=kind, target=target, draft=draft, gamma=g,
                                           draft_confidence=conf, suffix_cache=cache,
                                           paired=config.paired and kind == "speculative", **c)
                                      for c in common if kind == "speculative"
                                      or c["temperature"] == 0 and g != AUTO
                                      for cache in caches]
            # token trees: `gamma` is the depth; a tree has no early stop, so no draft_confidence
            cells += [Cell(kind="speculative", target=target, draft=draft, gamma=g,
                           draft_confidence=None, paired=config.paired, tree=n, tree_topk=k,
                           suffix_cache=cache, **c)
                      for n in config.tree if n and not alone for k in config.tree_topk
                      for g in config.gamma
                      for c in common for cache in caches]
    if config.peer and any(t > 0 for t in config.temperature):
        notes.append("peer baseline (transformers assisted generation) runs greedy only: skipped "
                     "for temperature > 0")
    if config.peer and AUTO in config.gamma:
        notes.append("peer baseline runs at fixed gammas only: none for gamma 'auto'")
    if any(isinstance(draft_ref(d).lookup, NgramRef) for d in config.drafts):
        notes.append("n-gram drafts: an n-gram alone drafts k tokens (one cell per fixed gamma's "
                     "k), grows no trees and has no early stop"
                     + "; no peer baseline for them" * config.peer)
    if True in config.suffix_cache and any(draft_ref(d).lookup is None for d in config.drafts):
        notes.append("suffix_cache: only n-gram drafts read one; other drafts' cells run without")
    if any(isinstance(draft_ref(d).lookup, LookaheadRef) for d in config.drafts):
        notes.append("lookahead drafts: the depth is their shape's (one cell for the fixed "
                     "gammas), they grow their own trees and have no early stop"
                     + "; no peer baseline for them" * config.peer)
    if any(config.tree):
        if config.peer:
            notes.append("peer baseline drafts chains only: none for token tree cells")
        if any(config.draft_confidence):
            notes.append("token trees have no early stop: tree cells ignore draft_confidence")
    return list(dict.fromkeys(cells)), notes


def _drafts_for(target: str, config: BenchConfig, registry, notes: list[str]) -> list[str]:
    out = []
    for entry in config.draft_entries():
        ref = draft_ref(entry)
        first = ref.levels[0]
        if entry == DEFAULT:
            choice = default.choose(target)
            notes.append(f"default draft for {target}: {choice.ref} ({choice.note})")
            out.append(draft_ref(choice.ref).for_target(target).text)
            continue
        if len(ref.levels) > 1 or ref.lookup is not None or first.name != REGISTRY:
            out.append(ref.for_target(target).text)  # self resolved, n-gram spelled in full
            continue
        quant = first.spec if first.has_spec else ""
        chosen = registry(target, bool(quant) and not precision.is_float(quant))
        if chosen is None:
            notes.append(f"the registry has no draft for {target}: its 'registry' cells are "
                         "skipped")
            continue
        notes.append(f"registry draft for {target}: {chosen}")
        out.append(model_ref(chosen).canonical(quant or None))
    return list(dict.fromkeys(out))


def plan_servers(config: BenchConfig, prompt_sets: dict[str, list[Prompt]]
                 ) -> tuple[list[Cell], list[str]]:
    """Engine "openai": per length, temperature and prompt set, the baseline server's cell, then
    one speculative cell per other server (paired: a baseline request beside each of its requests).
    `target` is the baseline's model (else its name), `draft` the server's name."""
    servers = config.server_list()
    base = servers[0]
    common = [dict(target=base.model or base.name, max_new_tokens=n, temperature=t, threads=0,
                   set=s, prompts_sha=prompts_sha(prompt_sets[s]), n_prompts=len(prompt_sets[s]),
                   repeats=config.repeats, seed=config.seed, ignore_eos=config.ignore_eos,
                   kernels="server", engine="openai", baseline_server=base.identity())
              for n in config.max_new_tokens for t in config.temperature
              for s in config.prompt_sets]
    cells = [Cell(kind="baseline", draft=None, gamma=None, draft_confidence=None, **c)
             for c in common]
    cells += [Cell(kind="speculative", draft=server.name, gamma=server.gamma,
                   draft_confidence=None, paired=config.paired, server=server.identity(), **c)
              for server in servers[1:] for c in common]
    notes = ["engine openai: requests run one at a time (the servers' metrics are read around "
             "each); nothing else should use the servers meanwhile"]
    return cells, notes
