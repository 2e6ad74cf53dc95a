"""Run a sweep: stage 1 baselines (the target alone), stage 2 speculative cells, the peer
baseline (transformers' assisted generation) when asked, and the quality stage (`heldout.py`:
each target precision against fp32 on held-out text). Aggregates are computed later from what is
stored (`aggregate.py`), so a report never needs the models.

Why the numbers can be trusted: every model pair gets an untimed warm-up generation before its
first timed one; the thread count is set per cell and recorded; each cell is appended to the
store the moment it finishes (a killed sweep resumes with nothing lost or duplicated); the run
record holds the config, machine and library versions, and each cell the hashes of its models.
A cell with a suffix cache (`suffix_cache`) gives each repeat its own: prompt i drafts from prompts
0..i-1 of that repeat, never from its own earlier run, the warm-up or the paired plain runs.
What a cell times is an `engines.Engine`: specq's decoding here, transformers' assisted generation,
or a server over the OpenAI API (`openai_engine.py`); pairing, repeats and the store are the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import torch

from .. import api, backends
from ..core.gamma import GammaMemory
from ..core.prompt import encode_prompt
from ..core.types import Draft, Model
from ..drafters.suffix import SuffixCache
from ..errors import SpecqError
from ..kernels import build
from ..loading import kinds, precision
from ..loading.refs import draft_ref, model_ref
from ..version import __version__
from . import heldout, store
from .config import BenchConfig, Cell, plan, registry_draft
from .engines import Engine, SpecqEngine
from .openai_engine import OpenAIEngine
from .prompts import Prompt, load_set
from .servers import running

WARMUP_TOKENS = 8


def environment() -> dict:
    import transformers

    return {"machine": platform.machine(), "processor": platform.processor(),
            "platform": platform.platform(), "cpu": build.cpu_model(), "kernels": build.variant(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "specq": __version__}


def model_hash(model: Model) -> str:
    """sha256 of the state dict's names, dtypes, shapes and bytes, then of the model's file when it
    runs from one (a GGUF file's blocks and embedding are not in the state dict: without its
    bytes, files of one model at different quant types would hash alike). About a second per
    500 MB."""
    h = hashlib.sha256()
    for name, t in sorted(model.net.state_dict().items()):
        t = t.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    source = Path(model.source or "")
    if source.suffix == ".gguf" and source.is_file():
        with source.open("rb") as f:  # read, not mapped: nothing stays resident
            while chunk := f.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()[:16]


def load_prompt_sets(config: BenchConfig) -> dict[str, list[Prompt]]:
    """`prompts` prompts of each set; a set that holds fewer is an error (never silently fewer)."""
    sets = {s: load_set(s, config.prompts, config.prompt_file, config.prompt_field,
                        config.prompt_file_chat)
            for s in config.prompt_sets}
    for name, prompts in sets.items():
        if len(prompts) < config.prompts:
            raise SpecqError(f"bench config 'prompts': the '{name}' set holds {len(prompts)} "
                             f"prompts, fewer than the {config.prompts} asked for")
    return sets


class _Models:
    """Models loaded on demand and kept while the sweep needs them (cells come target-major)."""

    def __init__(self, load: Callable[[str], Model], backend: str):
        self.load = load
        self.backend = backend
        self.loaded: dict[str, tuple[Model, dict]] = {}
        self.memories: dict[str, GammaMemory] = {}  # gamma auto's, per loaded target
        self.hf: dict[str, object] = {}

    def get(self, ref: str) -> tuple[Model, dict]:
        if ref not in self.loaded:
            # a layer-skip draft runs some of a loaded model's layers, on that model's runner
            skips = model_ref(ref).skips
            base = None if skips is None else self.get(skips.text)[0]
            model = self.load(ref) if base is None else self.load(ref, target=base)
            info = {"ref": ref, "precision": model.precision, "source": model.source,
                    "sha256": model_hash(model)}
            if base is None:
                model.runner = backends.runner(model.net, self.backend)
            self.loaded[ref] = (model, info)
        return self.loaded[ref]

    def gamma_memory(self, ref: str) -> GammaMemory:
        """What gamma auto learned in the runs of target `ref` so far (forgotten with the model)."""
        return self.memories.setdefault(ref, GammaMemory())

    def keep_only(self, refs: set[str]) -> None:
        for ref in set(self.loaded) - refs:
            del self.loaded[ref]
            self.memories.pop(ref, None)
        for ref in set(self.hf) - refs:
            del self.hf[ref]

    def hf_model(self, model: Model):
        """The same weights as a transformers model (for the peer baseline)."""
        if model.ref not in self.hf:
            from transformers import AutoModelForCausalLM
            from transformers.utils import logging as hf_logging

            dtype = precision.parse(model.precision).dtype
            hf_logging.disable_progress_bar()  # one progress bar (the sweep's) on the terminal
            try:
                self.hf[model.ref] = AutoModelForCausalLM.from_pretrained(model.source,
                                                                          dtype=dtype).eval()
            finally:
                hf_logging.enable_progress_bar()
        return self.hf[model.ref]


def peer_skip_reason(model: Model | Draft) -> str | None:
    """Why transformers cannot run this model as is (None: it can)."""
    if not precision.is_float(model.precision):
        return f"{model.ref} is quantized"
    kind = kinds.kind_of(model)
    if not kind.transformers:
        return f"{model.ref} is a {kind.name} draft (transformers has no equivalent)"
    source = Path(model.source)
    if not (source / "config.json").is_file() or precision.is_quantized_dir(source):
        return f"{model.ref} is not a Hugging Face directory"
    return None


def run(config: BenchConfig, *, load: Callable[[str], Model] = partial(kinds.load, backend=None),
        generate=api.generate, prompt_sets: dict[str, list[Prompt]] | None = None,
        registry=registry_draft, console=None, log=None, progress: bool = True,
        held_out=heldout.shakespeare_chunks) -> list[dict]:
    """Run every cell of the sweep that the store does not hold yet; return the stored run records,
    this sweep's cells and its quality records. Progress goes to `console` (stderr), notes on the
    sweep to `log` (default: `console`), so that stderr holds only the error when a cell fails.
    `load`, `generate`, `prompt_sets` and `held_out` are injectable (tests use tiny models); models
    go on specq's kernels (`specq.backends`) here unless the config says `eager`. With engine
    "openai" the cells are the config's servers' (`servers.py`), started here when they say how."""
    from rich.console import Console

    console = console or Console(stderr=True)
    log = log or console
    prompt_sets = prompt_sets if prompt_sets is not None else load_prompt_sets(config)
    cells, notes = plan(config, prompt_sets, registry)
    for note in notes:
        # no break inside a name
        log.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    # a file it refuses is left as it is
    done = store.cells(store.read(config.results, complete=True))
    store.repair(config.results)
    pending = [c for c in cells if c.key not in done]
    pool = _Models(load, "eager" if config.eager else backends.DEFAULT)
    if len(pending) < len(cells):
        log.print(f"{len(cells) - len(pending)} of {len(cells)} cells already in {config.results}: "
                  "skipped")
    if pending:
        run_id = uuid.uuid4().hex[:12]
        with _engines(config, pool, generate, console) as setup:
            store.append(config.results, {"type": "run", "run_id": run_id, "started": _now(),
                                          "config": config.to_dict(),
                                          "environment": environment(), "argv": sys.argv})
            _run_cells(pending, prompt_sets, config, run_id, setup, console, progress)
    targets = list(dict.fromkeys(c.target for c in cells))
    if config.quality_chunks:
        console.print(f"quality stage: {len(targets)} target(s) vs fp32 on {config.quality_chunks} "
                      "held-out chunks")
        torch.set_num_threads(config.threads[0])
        heldout.run(targets, config.quality_chunks, config.results, pool.get, held_out,
                    config.resamples, config.seed)
    wanted = {c.key for c in cells} | {heldout.key(t, config.quality_chunks) for t in targets}
    return [r for r in store.read(config.results) if r.get("type") not in ("cell", "quality")
            or r["key"] in wanted]


@dataclass
class Setup:
    """What a cell runs: its record's head, the engine it measures (None: skipped, the record says
    why), the plain engine of its pairs, and each prompt's prefill times by model."""

    record: dict
    measured: Engine | None
    plain: Engine | None = None
    prefill: Callable[[Prompt], dict[str, float]] | None = None


@contextmanager
def _engines(config: BenchConfig, pool: _Models, generate, console):
    """A function from (cell, prompts) to its `Setup`, for as long as the sweep runs (the servers
    of engine "openai" are up for that long)."""
    if config.engine == "specq":
        yield partial(_specq_setup, pool=pool, generate=generate)
        return
    servers = config.server_list()
    logs = Path(config.results).with_suffix("")
    with running(servers, logs, log=lambda line: console.print(line, highlight=False,
                                                               soft_wrap=True)):
        by_name = {s.name: s for s in servers}
        made: dict[tuple, OpenAIEngine] = {}

        def engine(name: str, cell: Cell) -> OpenAIEngine:
            key = (name, cell.temperature, cell.seed, cell.ignore_eos)
            if key not in made:
                made[key] = OpenAIEngine(by_name[name], cell.temperature, cell.seed,
                                         cell.ignore_eos)
            return made[key]

        def setup(cell: Cell, prompts: list[Prompt], later: list[Cell] = ()) -> Setup:
            base = servers[0]
            server = by_name[cell.draft] if cell.draft else base
            measured = engine(server.name, cell)
            info = lambda s, model: {  # noqa: E731 (the models table: each server, as started)
                "ref": s.name, "precision": "server", "sha256": "-",
                "source": f"{model} at {s.url}" + (f" (started by: {s.start})" if s.start else "")}
            record = {"type": "cell", "key": cell.key, "cell": cell.params(),
                      "target": info(base, engine(base.name, cell).model),
                      "draft": info(server, measured.model) if cell.draft else None}
            return Setup(record, measured, engine(base.name, cell) if cell.paired else None)

        yield setup


def _run_cells(pending: list[Cell], prompt_sets, config: BenchConfig, run_id: str, setup,
               console, progress: bool) -> None:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    total = sum(c.n_prompts * c.repeats for c in pending)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("generations"), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn())
    warmed: set[tuple] = set()
    # transient, and only on a terminal: an error ends in its one line, not under a stale bar
    with Progress(*columns, console=console, disable=not progress or not console.is_terminal,
                  transient=True) as bar:
        task = bar.add_task("bench", total=total)
        for i, cell in enumerate(pending):
            label = f"{cell.kind} {cell.target}" + (f" + {cell.draft} g={cell.gamma}"
                                                    if cell.draft else "")
            label += f" tree={cell.tree} k={cell.tree_topk}" if cell.tree else ""
            bar.update(task, description=f"{label} {cell.set} n={cell.max_new_tokens}")
            record = _run_cell(cell, prompt_sets[cell.set], setup(cell, prompt_sets[cell.set],
                                                                  later=pending[i:]),
                               warmed, lambda: bar.advance(task))
            record.update(run_id=run_id, finished=_now())
            store.append(config.results, record)


def _specq_setup(cell: Cell, prompts: list[Prompt], pool: _Models, generate,
                 later: list[Cell] = ()) -> Setup:
    """A cell of specq's own engine: its models (loaded once, freed when no `later` cell needs
    them), its decoding as an engine, and the plain decoding of its pairs."""
    pool.keep_only({c.target for c in later} | {
        ref.text for c in later if c.draft
        for ref in draft_ref(c.draft).for_target(c.target).models})  # free what no cell needs
    torch.set_num_threads(cell.threads)
    target, target_info = pool.get(cell.target)
    parsed = draft_ref(cell.draft).for_target(cell.target) if cell.draft else None
    levels = [pool.get(ref.text) for ref in parsed.models] if parsed else []  # cheapest first
    draft = parsed.build(lambda ref: pool.get(ref)[0]) if parsed else None
    # else a hierarchy or an n-gram draft (its models)
    one_model = len(levels) == 1 and draft is levels[0][0]
    draft_info = None if draft is None else levels[0][1] if one_model else {
        "ref": cell.draft, "precision": levels[0][1]["precision"] if levels else None,
        "levels": [i for _, i in levels]}
    record = {"type": "cell", "key": cell.key, "cell": cell.params(), "target": target_info,
              "draft": draft_info, "threads_used": torch.get_num_threads()}
    if cell.kind == "peer":
        reason = peer_skip_reason(target) or ("a draft hierarchy (transformers has no equivalent)"
                                              if isinstance(draft, list)
                                              else peer_skip_reason(draft))
        if reason:
            return Setup({**record, "skipped": reason}, None)
    ids = {p: encode_prompt(target, p.text, p.chat) for p in prompts}
    text = partial(answer_text, target)
    if cell.kind == "peer":
        hf_target, hf_draft = pool.hf_model(target), pool.hf_model(draft)

        def peer(prompt_ids: list[int], n: int, suffix_cache: None = None):  # a peer has none
            return hf_assisted(hf_target, hf_draft, prompt_ids, n, cell.gamma, cell.ignore_eos,
                               target.eos_ids, cell.draft_confidence or 0.0)
        return Setup(record, SpecqEngine(peer, ids, text))
    # a tree cell: the drafter grows trees of this shape (its refusal ends the sweep)
    shape = cell.tree_shape()
    tree = {"tree": shape} if shape else {}
    memory = pool.gamma_memory(cell.target)

    def one(prompt_ids: list[int], n: int, suffix_cache: SuffixCache | None = None,
            alone: bool = False):
        return generate(target, prompt_ids, None if alone else draft, gamma=cell.gamma or 1,
                        max_new_tokens=n, temperature=cell.temperature, seed=cell.seed,
                        ignore_eos=cell.ignore_eos, draft_confidence=cell.draft_confidence or 0.0,
                        gamma_memory=memory, suffix_cache=suffix_cache,
                        **({} if alone else tree))

    def prefill(prompt: Prompt) -> dict[str, float]:
        times = {"target": prefill_ms(target, ids[prompt])}
        if draft is not None:
            times["draft"] = sum(prefill_ms(m, ids[prompt]) for m, _ in levels)
        return times

    # a suffix cache per repeat: prompt i drafts from prompts 0..i-1 of that repeat only
    return Setup(record, SpecqEngine(one, ids, text, suffix_cache=cell.suffix_cache),
                 SpecqEngine(partial(one, alone=True), ids, text), prefill)


def _run_cell(cell: Cell, prompts: list[Prompt], setup: Setup, warmed: set, advance) -> dict:
    """Time every prompt of a cell `repeats` times (each beside a plain run when paired)."""
    if setup.measured is None:
        for _ in range(cell.n_prompts * cell.repeats):
            advance()
        return setup.record
    # a tree's first pass warms up too
    pair = (cell.kind, cell.target, cell.draft, cell.threads, bool(cell.tree))
    if pair not in warmed:  # first calls pay for allocation and lazy init: never time them
        setup.measured.generate(prompts[0], min(WARMUP_TOKENS, cell.max_new_tokens), repeat=-1)
        warmed.add(pair)
    runs, prefill = [], {"target": [], "draft": []}
    for prompt in prompts:
        for side, ms in (setup.prefill(prompt) if setup.prefill else {}).items():
            prefill[side].append(ms)
        for repeat in range(cell.repeats):
            # alternate the order, so neither side is always first
            plain_first = (prompt.index + repeat) % 2 == 1
            plain = (setup.plain.generate(prompt, cell.max_new_tokens)
                     if cell.paired and plain_first else None)
            out = setup.measured.generate(prompt, cell.max_new_tokens, repeat)
            if cell.paired and not plain_first:
                plain = setup.plain.generate(prompt, cell.max_new_tokens)
            runs.append({"set": prompt.set, "prompt": prompt.index, "repeat": repeat,
                         "reference": prompt.reference, "token_ids": out.token_ids,
                         "text": out.text, "finish_reason": out.finish_reason,
                         "stats": dataclasses.asdict(out.stats)} | out.extra
                        | ({"paired_stats": dataclasses.asdict(plain.stats)}
                           if plain is not None else {}))
            advance()
    return {**setup.record, "runs": runs, "prefill_ms": prefill}


def answer_text(target: Model, token_ids: list[int]) -> str:
    """The text up to the first end-of-sequence token (runs at a fixed length go past it)."""
    cut = next((i for i, t in enumerate(token_ids) if t in target.eos_ids), len(token_ids))
    return target.tokenizer.decode(token_ids[:cut], skip_special_tokens=True)


@torch.inference_mode()
def prefill_ms(model: Model | Draft, prompt_ids: list[int]) -> float:
    """One prompt forward of one model alone (the decode loop times both
    models' prefill together)."""
    ids = torch.tensor(prompt_ids, dtype=torch.long)
    cache = model.runner.new_cache(len(prompt_ids) + 1)
    rows = kinds.kind_of(model).rows
    started = time.perf_counter()
    rows(model.runner, ids, cache)
    return (time.perf_counter() - started) * 1000


def hf_assisted(hf_target, hf_draft, prompt_ids: list[int], n: int, gamma: int,
                ignore_eos: bool, eos_ids, confidence: float = 0.0):
    """transformers' assisted generation, greedy, `gamma` assistant tokens per step (constant), the
    same early-stop `confidence` as specq's cell (0 = off; left unset, transformers would use 0.4),
    timed as a whole call; returns an object shaped like `api.Generation` for the store."""
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    from ..core.stats import DecodeStats

    eos = None if ignore_eos else sorted(eos_ids) or None
    cfg = GenerationConfig(max_new_tokens=n, min_new_tokens=n if ignore_eos else 0, do_sample=False,
                           eos_token_id=eos, pad_token_id=(eos or [0])[0])
    hf_draft.generation_config.num_assistant_tokens = gamma
    hf_draft.generation_config.num_assistant_tokens_schedule = "constant"
    hf_draft.generation_config.assistant_confidence_threshold = confidence
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # assisted generation warns about its own internal calls
    try:
        started = time.perf_counter()
        with torch.inference_mode():
            out = hf_target.generate(torch.tensor([prompt_ids]), generation_config=cfg,
                                     assistant_model=hf_draft)
        elapsed = time.perf_counter() - started
    finally:
        hf_logging.set_verbosity(level)
    token_ids = out[0, len(prompt_ids):].tolist()
    stats = DecodeStats(gamma=gamma, prompt_tokens=len(prompt_ids), new_tokens=len(token_ids),
                        decode_s=elapsed)
    reason = "eos" if token_ids and token_ids[-1] in eos_ids and not ignore_eos else "length"
    return api.Generation(text="", token_ids=token_ids, prompt_ids=prompt_ids, finish_reason=reason,
                          stats=stats, target="hf", draft="hf")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
