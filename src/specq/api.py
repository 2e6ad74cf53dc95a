"""The Python API: load models once, generate many times.

    import specq
    target = specq.load("smollm2-135m")
    draft = specq.load("path/to/draft")
    out = specq.generate(target, "The capital of France is", draft=draft, gamma=4)
    print(out.text, out.stats.tau)
    # its own int8 weights
    out = specq.generate(target, "...", draft=specq.load("self@int8-head8", target=target))
    out = specq.generate(target, "...")  # the default draft: out.draft_note says which
    out = specq.generate(target, "...", draft=None)  # plain decoding
    out = specq.generate(target, "...", draft="ngram")  # n-gram lookup: no draft model
    out = specq.generate(target, "...", draft=specq.NgramDraft(k=5, fallback=draft))
    out = specq.generate(target, "...", draft="lookahead")  # the target's own guesses: no model
    memory = specq.GammaMemory()  # gamma auto's estimates, carried from each run to the next
    out = specq.generate(target, "...", draft=draft, gamma_memory=memory)
    earlier = specq.SuffixCache()  # earlier runs' text, where n-gram drafts also look
    out = specq.generate(target, "...", draft="ngram", suffix_cache=earlier)
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from . import checks
from .core.decode import Sequence, run
from .core.gamma import MAX_GAMMA, GammaMemory
from .core.gamma import parse as parse_gamma
from .core.prompt import check_context, encode_prompt, token_ids
from .core.sampling import SamplingConfig
from .core.stats import DecodeStats
from .core.stopping import trim_at_stop
from .core.types import Draft, Model
from .drafters import TreeShape, lookahead, ngram
from .drafters.base import DEFAULT_GAMMA, default_gamma
from .drafters.sequence import DEFAULT_DRAFT_CONFIDENCE
from .drafters.suffix import SuffixCache
from .errors import SpecqError
from .loading.drafts.default import AUTO, load_default
from .loading.kinds import for_levels, load
from .loading.refs import free_ref
from .loading.vocab import check_compatible, check_target

# what `generate` takes as its draft: a model or draft from `specq.load`, an n-gram or lookahead
# draft (or its text spec), or a list of them, cheapest first (a hierarchy); "auto": the target's
# default; None: plain decoding
DraftArg = Model | Draft | ngram.NgramDraft | lookahead.LookaheadDraft | str | list | None
# the default draft per target, loaded once: id(target) -> (draft, note), dropped with the target
_DEFAULTS: dict[int, tuple[DraftArg, str]] = {}


@dataclass
class Generation:
    text: str
    token_ids: list[int]  # new tokens only (the stop token included)
    prompt_ids: list[int]
    finish_reason: str  # 'eos' | 'stop' | 'length' | 'cancelled' (on_tokens returned False)
    stats: DecodeStats
    target: str
    draft: str | None
    draft_note: str | None = None  # how the default draft was chosen (draft "auto")

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "target": self.target, "draft": self.draft, "draft_note": self.draft_note,
                "stats": self.stats.to_dict()}


def check_options(gamma: int | str | None = None, max_new_tokens: int = 128,
                  temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                  stop: list[str] | str | None = None,
                  draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE
                  ) -> tuple[tuple[int, bool], SamplingConfig, list[str] | None]:
    """The options of `generate` that need no model, checked (the CLI calls this before loading):
    ((gamma, adaptive), sampling config, stop strings). gamma None: the default, "auto"."""
    gamma = parse_gamma(DEFAULT_GAMMA if gamma is None else gamma)
    if not gamma[1] and not 1 <= gamma[0] <= MAX_GAMMA:
        raise SpecqError(f"gamma must be between 1 and {MAX_GAMMA}, got {gamma[0]}")
    checks.integer("max_new_tokens", max_new_tokens, 1)
    checks.integer("seed", seed, 0, checks.MAX_SEED)
    if checks.real("draft_confidence", draft_confidence, 0, 1) == 1:
        raise SpecqError("draft_confidence must be below 1")
    checks.real("temperature", temperature)
    checks.integer("top_k", top_k)
    checks.real("top_p", top_p)
    try:
        sampling = SamplingConfig(temperature, top_k, top_p)
    except ValueError as e:
        raise SpecqError(str(e)) from None
    return gamma, sampling, _stop_strings(stop)


def _stop_strings(stop: list[str] | str | None) -> list[str] | None:
    """None, or a list of non-empty strings (a single string is one stop string)."""
    if stop is None:
        return None
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise SpecqError(f"stop must be a list of non-empty strings, got {stop!r}")
    return list(stop)


def generate(target: Model, prompt: str | list[int], draft: DraftArg = AUTO, *,
             gamma: int | str | None = None, max_new_tokens: int = 128, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, chat: bool = False,
             stop: list[str] | None = None, ignore_eos: bool = False,
             draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE, drafter=None,
             tree: TreeShape | None = None, on_tokens=None, gamma_memory: GammaMemory | None = None,
             suffix_cache: SuffixCache | None = None) -> Generation:
    """Generate from `target`, speculatively unless `draft` is None. The output is the target's
    own: token for token when greedy, in distribution when sampling. "auto" (the default) is the
    target's default draft (`loading/drafts/default.py`: its registered draft, else a smaller model
    with its tokenizer, behind an n-gram lookup; loaded once per target), its note in
    `Generation.draft_note`.
    gamma "auto" (the default when greedy) chooses each step's draft length, 0 (plain) to 4, from
    measured acceptance and costs: this run's, starting from what earlier runs of the same target
    and draft kept in `gamma_memory` (a `GammaMemory` the caller keeps per target, across the runs
    it makes; None: this run starts afresh). Sampling defaults to gamma 2, so that a seed repeats
    its output.
    A list of drafts, cheapest first, is a hierarchy: each level verifies what the ones below
    proposed before the target sees it (`drafters/hierarchy.py`). An n-gram draft ("ngram",
    "ngram:n=2-3:k=4" or an `NgramDraft`, maybe with a fallback model) looks its proposals up in the
    prompt and the text so far; its k (its c where the text copies its source) is then the draft
    length, and a fixed gamma only its fallback's. With a `suffix_cache` (a `SuffixCache` the
    caller keeps per target, as gamma_memory) an n-gram draft also looks where the text has no
    match in the earlier runs' text, and this run's prompt and output join it when the run ends.
    Lossless either way; but a sampled run's proposals, and so the tokens its seed draws, then
    depend on what the cache holds.
    A lookahead draft ("lookahead", "lookahead:w=4:n=3:g=3" or a
    `LookaheadDraft`) guesses from the target's own verify passes; its shape sets the depth.
    `tree`: the (lowest) draft proposes dynamic token trees of that shape; a fixed gamma (the
    default with a tree) is then the tree's depth, and "auto" chooses each step's depth up to it.
    `on_tokens`: called with each step's new token ids (streaming); returning False stops the run
    (finish reason 'cancelled')."""
    draft, note = resolve_draft(target, draft, drafter)
    sequence = start(target, prompt, draft, gamma=gamma, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, chat=chat,
                     stop=stop, ignore_eos=ignore_eos, draft_confidence=draft_confidence,
                     drafter=drafter, tree=tree, on_tokens=on_tokens, gamma_memory=gamma_memory,
                     suffix_cache=suffix_cache)
    run(sequence)
    return finish(sequence, _draft(draft), suffix_cache, note)


def resolve_draft(target: Model, draft: DraftArg, drafter=None) -> tuple[DraftArg, str | None]:
    """(the draft, a note on how it was chosen): "auto" as the target's default (unless a ready
    `drafter` is given), loaded on first use and kept while the target lives; any other as is."""
    if not isinstance(draft, str) or draft != AUTO:
        return draft, None
    if drafter is not None:
        return None, None
    check_target(target)
    key = id(target)
    if key not in _DEFAULTS:
        _DEFAULTS[key] = load_default(target.ref, lambda ref: load(ref, target.runner.backend,
                                                                 target=target))
        weakref.finalize(target, _DEFAULTS.pop, key, None)
    return _DEFAULTS[key]


def _draft(draft: DraftArg) -> DraftArg:
    """A draft as given to `generate`: text is an n-gram or lookahead spec (a model draft is
    loaded with `specq.load`); a list is a hierarchy, cheapest first."""
    if isinstance(draft, list):
        return [_draft(level) for level in draft]
    if not isinstance(draft, str):
        return draft
    lookup = free_ref(draft)
    if lookup is None:
        raise SpecqError(f"a draft given as text is an n-gram draft ('{ngram.NAME}', "
                         f"'{ngram.NAME}:n=2-3:k=4') or a lookahead draft ('{lookahead.NAME}'), "
                         f"not '{draft}': load a model draft with specq.load")
    if lookup.fallback is not None:
        raise SpecqError(f"give an n-gram draft's fallback as a loaded model: "
                         f"specq.NgramDraft(..., fallback=specq.load('{lookup.fallback.text}'))")
    return lookup.draft


def start(target: Model, prompt: str | list[int], draft: DraftArg = AUTO, *,
          gamma: int | str | None = None, max_new_tokens: int = 128, temperature: float = 0.0,
          top_k: int = 0, top_p: float = 1.0, seed: int = 0, chat: bool = False,
          stop: list[str] | None = None, ignore_eos: bool = False,
          draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE, drafter=None,
          tree: TreeShape | None = None, on_tokens=None, gamma_memory: GammaMemory | None = None,
          suffix_cache: SuffixCache | None = None) -> Sequence:
    """`generate` up to the decoding (options checked, prompt encoded, drafter built): a `Sequence`
    to prefill and step with `decode.step`, alone or beside others (the server's batching).
    `suffix_cache`: where the drafter also looks (a ready `drafter` keeps its own); `finish` adds
    the run to the cache it is given."""
    check_target(target)
    draft = resolve_draft(target, draft, drafter)[0]
    if suffix_cache is not None and not isinstance(suffix_cache, SuffixCache):
        raise SpecqError(f"suffix_cache must be a specq.SuffixCache, got "
                         f"{type(suffix_cache).__name__}")
    gamma = default_gamma(tree, greedy=temperature == 0) if gamma is None else gamma
    (gamma, adaptive), sampling, stop = check_options(gamma, max_new_tokens, temperature, top_k,
                                                      top_p, seed, stop, draft_confidence)
    prompt_ids = (token_ids(target, prompt)
                  if isinstance(prompt, list) else encode_prompt(target, prompt, chat))
    if tree is not None:
        gamma = min(gamma, tree.depth) if adaptive else tree.depth
    draft = _draft(draft)
    levels = _levels(draft)
    if levels:
        for level in ngram.draft_models(levels):
            check_compatible(level, target)
        drafter = drafter or for_levels(levels, target, draft_confidence, tree, gamma,
                                        suffix_cache)
        # its k (a lookahead draft's shape) is the draft length (a fixed gamma its fallback's)
        if isinstance(draft, (ngram.NgramDraft, lookahead.LookaheadDraft)):
            gamma = draft.longest(gamma)
    check_context(target, drafter.nodes(gamma) if drafter is not None else 0, max_new_tokens,
                  len(prompt_ids))
    # gamma auto starts from the earlier runs (of this target: the caller's memory) with the same
    # draft, as configured and sampled (acceptance follows both), on as many threads (so do the
    # costs)
    memory_key = (f"{_refs(levels)} tree={tree} confidence={draft_confidence} {sampling} "
                  f"threads={torch.get_num_threads()}")
    return Sequence(target, prompt_ids, drafter=drafter, gamma=gamma, adaptive=adaptive,
                    sampling=sampling, max_new_tokens=max_new_tokens, stop_strings=stop,
                    ignore_eos=ignore_eos, generator=torch.Generator().manual_seed(seed),
                    on_tokens=on_tokens, memory=gamma_memory if levels else None,
                    memory_key=memory_key)


def finish(sequence: Sequence, draft: DraftArg, suffix_cache: SuffixCache | None = None,
           note: str | None = None) -> Generation:
    """A finished sequence as a `Generation` (the text ends before a stop string); its prompt and
    output join `suffix_cache`, if given, for later runs to draft from."""
    ids, reason, stats = sequence.result()
    if suffix_cache is not None:
        suffix_cache.add(sequence.prompt_ids + ids)
    text = sequence.target.tokenizer.decode(ids, skip_special_tokens=True)
    if reason == "stop":
        text = trim_at_stop(text, sequence.stopper.stop_strings)
    return Generation(text=text, token_ids=ids, prompt_ids=sequence.prompt_ids,
                      finish_reason=reason, stats=stats, target=sequence.target.ref,
                      draft=_refs(_levels(draft)) or None, draft_note=note)


def _levels(draft: DraftArg) -> list:
    """A draft's levels, cheapest first (none without a draft)."""
    return [] if draft is None else draft if isinstance(draft, list) else [draft]


def _refs(levels: list) -> str:
    return ",".join(level.ref for level in levels)
