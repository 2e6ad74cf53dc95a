"""`specq distill`: make a draft for a target from text and from the target's own answers.

Stages, each cached in a work directory so that an interrupted run continues where it stopped:
1. teacher data: the target's top-k distributions on text windows (teacher forcing) and on
   its own answers to prompts (sequence-level distillation), written shard by shard;
2. training (`distill.distill`), checkpointed every few steps;
3. export of the draft (native layout, chosen dtype) with `distill.json`: settings, data,
   held-out beta / top-1, acceptance and tau in real speculative runs, and the draft's cost
   relative to the target; with `register`, the draft is added to the user's registry for the
   target's precision.
A time budget (`minutes`) bounds all three: teacher data may take up to `DATA_SHARE` of it (no
new shard starts after that; training uses the shards there are, and the report says how many
were left out), training the rest, less an estimate of the final measurements.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .. import atomic, backends, checks, data
from ..core.types import Draft, Model
from ..errors import SpecqError
from ..loading import kinds
from ..loading.drafts import adapter, registry
from ..loading.refs import model_ref
from ..loading.vocab import check_compatible, check_target
from ..model.llama import Llama
from . import lora, native_teacher, students
from .calibrate import acceptance
from .distill import (
    TeacherSet,
    atomic_save,
    chunk_tokens,
    distill,
    float_teacher,
    teacher_continuations,
    teacher_on_text,
)

# synthetic prompts: far more than any run uses, far fewer than the templates can make
MAX_SYNTHETIC = 100_000
# of a time budget, the most teacher data may take: the rest goes to training and measuring
DATA_SHARE = 0.5


@dataclass(frozen=True)
class DistillSettings:
    texts: tuple[str, ...] = ("shakespeare",)  # 'shakespeare' or .txt / .jsonl files
    # 'chat', 'synthetic:N', or a file (one prompt per line / .jsonl)
    prompts: tuple[str, ...] = ("chat",)
    temperatures: tuple[float, ...] = (0.0,)  # one target answer per prompt per temperature
    new_tokens: int = 128
    text_windows: int = 160  # training windows of `seq_len` tokens, spread over the corpora
    seq_len: int = 256
    steps: int = 2000
    # the whole run's time budget (DATA_SHARE of it for teacher data); lr decays to fit
    minutes: float | None = None
    loss: str = "mix:0.5"
    lr: float = 2e-3
    batch: int = 8
    eval_every: int = 100
    checkpoint_every: int = 50
    gen_batch: int = 48  # prompts the target answers at once (one cached shard)
    accept_prompts: int = 10  # held-out chat prompts for the final speculative runs
    gamma: int = 4
    # training's matrix products: fp32, or bf16 under autocast (`distill.distill`)
    compute: str = "fp32"
    # feature drafts: tokens the head covers (the most frequent in the data); a new draft's default
    # is NEW_HEAD_VOCAB, a base's head is kept unless this is given
    head_vocab: int | None = None
    # train a LoRA adapter of this rank on the base and save it alone (`lora.py`)
    lora_rank: int | None = None
    seed: int = 0
    extra: dict = field(default_factory=dict, compare=False)


# ------------------------------------------------------------------------------ data sources


def prompt_list(source: str) -> list[str]:
    if source == "chat":
        return data.chat_prompts("train")
    # synthetic:N, or synthetic:A-B (items A..B-1 of the same list)
    if source.startswith("synthetic:"):
        first, _, last = source.split(":", 1)[1].partition("-")
        try:
            start, end = (int(first), int(last)) if last else (0, int(first))
        except ValueError:
            start, end = 0, 0
        if not 0 <= start < end <= MAX_SYNTHETIC:
            raise SpecqError(f"prompt source '{source}': use synthetic:N or synthetic:A-B with 0 "
                             f"<= A < B <= {MAX_SYNTHETIC}")
        return data.synthetic_chat_prompts(end)[start:]
    path = Path(source)
    if not path.is_file():
        raise SpecqError(f"prompt source '{source}' is neither 'chat', 'synthetic:N' nor a "
                         "readable file")
    if path.suffix == ".jsonl":
        items = data.user_texts(path, field="prompt")
    else:
        items = [line for line in checks.read_text(path, "prompt file").splitlines()
                 if line.strip()]
    if not items:
        raise SpecqError(f"prompt file '{source}' holds no prompts")
    return items


def text_list(source: str) -> tuple[list[str], list[str]]:
    """(train, held-out) documents of a text source."""
    docs = data.shakespeare_texts() if source == "shakespeare" else data.user_texts(source)
    if len(docs) < 2:  # one document: hold out its last eighth
        text = docs[0] if docs else ""
        cut = len(text) * 7 // 8
        return [text[:cut]], [text[cut:]]
    return data.split(docs)


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class Budget:
    """When teacher data must stop starting new shards (None: never), and the shards it left out."""

    deadline: float | None = None  # time.monotonic()
    skipped: int = 0

    def allows(self) -> bool:
        if self.deadline is None or time.monotonic() < self.deadline:
            return True
        self.skipped += 1
        return False


def _sharded(directory: Path, items: list, shard: int, make, label: str, features_of=None,
             budget: Budget | None = None) -> TeacherSet:
    """Teacher data for `items`, computed `shard` items at a time; finished shards are kept, and
    a shard not there yet is made only while the budget allows it. With `features_of` (the
    target's native module) each shard also gets the target's hidden states, cached beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    out = TeacherSet([], [], [], [])
    n_shards = (len(items) + shard - 1) // shard
    for s in range(n_shards):
        path = directory / f"shard_{s:03d}.pt"
        # the target's hidden states, beside the shard
        cached = path.with_name(f"{path.stem}.features.pt")
        if not path.exists():
            if budget is not None and not budget.allows():
                continue
            print(f"{label}: shard {s + 1}/{n_shards}", file=sys.stderr, flush=True)
            made = make(items[s * shard:(s + 1) * shard])
            if made.features:  # a native teacher computes them in the same pass
                atomic_save(made.features, cached)
            TeacherSet(made.ids, made.start, made.top_ids, made.top_logp).save(path)
        part = TeacherSet.load(path)
        if features_of is not None:
            if not cached.exists():
                atomic_save(part.with_features(features_of).features, cached)
            part.features = torch.load(cached, weights_only=True)
        out += part
    return out


def teacher_data(target: Model, settings: DistillSettings, work: Path, features: bool = False,
                 budget: Budget | None = None) -> tuple[TeacherSet, TeacherSet]:
    """(train, held-out) teacher sets, from the cache in `work/teacher` where possible; with
    `features`, each record also holds the target's hidden states (for a feature draft). The
    budget limits the training shards; the held-out ones are always made."""
    teacher = None

    def model():
        nonlocal teacher
        if teacher is None:
            teacher = float_teacher(target.net)
        return teacher

    native = native_teacher.wanted(target.net)  # quantized: answered on specq's kernels
    tok, who = target.tokenizer, [model_ref(target.ref).name, target.precision]
    feats = (target.runner or target.net) if features else None

    def answers(prompts: list[str], t: float = 0.0, seed: int = 0) -> TeacherSet:
        if native:
            return native_teacher.continuations(target, prompts, max_new_tokens=settings.new_tokens,
                                                temperature=t, batch=settings.gen_batch, seed=seed)
        return teacher_continuations(model(), tok, prompts, max_new_tokens=settings.new_tokens,
                                     temperature=t, batch=settings.gen_batch, seed=seed)

    def on_text(windows: list) -> TeacherSet:
        return (native_teacher.on_text(target.runner, windows)
                if native else teacher_on_text(model(), windows))

    train, held = TeacherSet([], [], [], []), TeacherSet([], [], [], [])
    for source in settings.prompts:
        prompts = prompt_list(source)
        for t in settings.temperatures:
            where = work / "teacher" / f"answers-{_key(who, source, t, settings.new_tokens)}"
            train += _sharded(where, prompts, settings.gen_batch,
                              lambda p, t=t: answers(p, t, settings.seed),
                              f"answers to {source} (T={t})", feats, budget)
    held_prompts = data.chat_prompts("held_out")
    held += _sharded(work / "teacher" / f"held-answers-{_key(who, settings.new_tokens)}",
                     held_prompts, settings.gen_batch, answers, "held-out answers", feats)
    per_source = max(1, settings.text_windows // max(1, len(settings.texts)))
    for source in settings.texts:
        train_docs, held_docs = text_list(source)
        windows = chunk_tokens(tok, train_docs, settings.seq_len)
        windows = windows[::max(1, len(windows) // per_source)][:per_source]
        held_windows = chunk_tokens(tok, held_docs, settings.seq_len)
        held_windows = held_windows[::max(1, len(held_windows) // 16)][:16]
        key = _key(who, source, settings.seq_len, per_source)
        train += _sharded(work / "teacher" / f"text-{key}", windows, 16,
                          on_text, f"text {source}", feats, budget)
        held += _sharded(work / "teacher" / f"held-text-{key}", held_windows, 16,
                         on_text, f"held-out text {source}", feats)
    if not len(train):
        raise SpecqError("no training data: give --texts and/or --prompts"
                         if not (budget and budget.skipped) else
                         "the time budget ran out before the first shard of training data: give "
                         "more --minutes")
    return train, held


# ------------------------------------------------------------------------------ the run


def step_ms(model: Model | Draft, steps: int = 20) -> float:
    """Median latency of one cached decode step after a 128-token prefix (overhead included)."""
    rows, net = kinds.kind_of(model).rows, model.runner
    ids = torch.randint(0, model.vocab_size, (129,), generator=torch.Generator().manual_seed(0))
    cache = net.new_cache(256)
    times = []
    with torch.inference_mode():
        rows(net, ids[:128], cache)
        for _ in range(steps + 3):
            cache.crop(128)
            started = time.perf_counter()
            rows(net, ids[128:129], cache)
            times.append(time.perf_counter() - started)
    return statistics.median(times[3:]) * 1e3


def check_run(out: Path, work: Path, force: bool = False, resume: bool = False,
              ckpt: str = "ckpt") -> None:
    """`out` may be written (`checks.output`), `work` is a writable folder, and an unfinished run
    in it (checkpoints in `work/ckpt`) is continued only with `resume`."""
    checks.output(out, force, "--out")
    if work.exists() and not work.is_dir():
        raise SpecqError(f"--work '{work}' is a file, not a folder")
    checks.writable_parent(work / ckpt, "--work")
    unfinished = (work / ckpt / "last.pt").exists()
    if unfinished and not resume:
        raise SpecqError(f"'{work}' holds an unfinished run: add --resume to continue it, or "
                         "remove the directory")
    if resume and not unfinished and not any((work / "teacher").glob("*/shard_*.pt")):
        raise SpecqError(f"--resume: nothing to resume in '{work}' (no training checkpoint and no "
                         "teacher data)")


def check_sources(texts: list[str], prompts: list[str]) -> None:
    """Read every text and prompt source once, so a bad file fails before a model loads."""
    for source in prompts:
        prompt_list(source)
    for source in texts:
        if source != "shakespeare":
            data.user_texts(source)


def _check_lengths(target: Model, settings: DistillSettings) -> None:
    """Text windows and answers fit in the target's context (longer ones would be silently dropped
    or run past the positions the target was trained on)."""
    context = getattr(target.net.config, "max_position_embeddings", None)
    for flag, tokens in (("--seq-len", settings.seq_len), ("--new-tokens", settings.new_tokens)):
        if context and tokens >= context:
            raise SpecqError(f"{flag} {tokens} does not fit the context of '{target.ref}' "
                             f"({context} tokens)")


def run(target: Model, out: Path, work: Path, settings: DistillSettings, *,
        base: Model | Draft | None = None, arch: str = "small", dtype: torch.dtype = torch.bfloat16,
        resume: bool = False, force: bool = False, register: bool = False,
        since: float | None = None) -> dict:
    """Distil a draft for `target` into `out`; returns the report also saved as out/distill.json.
    An existing `out` is replaced only with `force`; an unfinished run continues only with `resume`;
    with `register` the draft is added to the user's registry for the target's precision. The time
    budget counts from `since` (a `time.monotonic()`, e.g. before the models
    loaded; default: now)."""
    since = time.monotonic() if since is None else since
    deadline = None if settings.minutes is None else since + settings.minutes * 60
    check_target(target)
    check_run(out, work, force, resume)
    _check_lengths(target, settings)
    kind = kinds.kind_of(base) if base is not None else students.arch_kind(arch)
    student_kind = students.LORA if settings.lora_rank else students.of(kind)
    if base is not None:
        check_compatible(base, target)
        student_kind.check_base(base, settings.head_vocab)
    elif settings.lora_rank:
        raise SpecqError("--lora trains an adapter on a base model: give --from")
    if settings.head_vocab is not None and not student_kind.head_vocab:
        raise SpecqError("--head-vocab is for feature drafts (--arch feature, or --from a feature "
                         "draft)")
    if (settings.head_vocab or 0) > target.vocab_size:
        raise SpecqError(f"--head-vocab {settings.head_vocab} is more than the {target.vocab_size} "
                         f"tokens of the vocabulary of '{target.ref}'")
    if student_kind.reads_features and not isinstance(target.net, Llama):
        raise SpecqError(f"a {kind.name} draft reads the target's hidden states: '{target.ref}' "
                         "must be a Llama model")
    if base is None:
        students.check_arch(arch)
    if native_teacher.wanted(target.net) and "backend" not in target.info:  # loaded without one
        # a file's own blocks: the teacher answers on specq's kernels
        target.runner = backends.runner(target.net)
    started = time.perf_counter()
    budget = Budget(None if deadline is None else since + DATA_SHARE * settings.minutes * 60)
    train, held = teacher_data(target, settings, work, features=student_kind.reads_features,
                               budget=budget)
    data_s = time.perf_counter() - started
    if budget.skipped:
        print(f"specq: the time budget stopped teacher data after {data_s / 60:.1f} of "
              f"{settings.minutes:g} minutes: {budget.skipped} shards left out, training on the "
              f"{len(train)} sequences there are",
              file=sys.stderr, flush=True)
    target_ms = step_ms(target)
    # the final speculative runs, estimated at twice the target's plain decoding time
    reserve_s = settings.accept_prompts * settings.new_tokens * 2 * target_ms / 1e3
    if settings.lora_rank:
        student = lora.student(base, settings.lora_rank, seed=settings.seed)
    elif base is not None:
        student = student_kind.from_base(base, target, train, settings.head_vocab)
    else:
        student = student_kind.new(target, train, settings, arch)
    train_budget_s = None if deadline is None else max(0.0, deadline - time.monotonic() - reserve_s)
    result = distill(student, train, held, steps=settings.steps, time_budget_s=train_budget_s,
                     loss=settings.loss, lr=settings.lr, batch=settings.batch,
                     checkpoint_dir=work / "ckpt", checkpoint_every=settings.checkpoint_every,
                     eval_every=settings.eval_every, seed=settings.seed,
                     forward=student_kind.forward, compute=settings.compute)
    # measured as it will run: merged into its base at the base's default precision
    if settings.lora_rank:
        adapter_dir = work / "adapter"
        shutil.rmtree(adapter_dir, ignore_errors=True)
        lora.save(student, adapter_dir, lora.base_name(base.ref),
                  torch.float32 if dtype == torch.float32 else torch.float16)
        draft = kinds.load(str(adapter_dir))
    else:
        draft = kinds.as_kind(kind, Model(ref=str(out), net=student_kind.finish(student, dtype),
                                          tokenizer=target.tokenizer, eos_ids=target.eos_ids,
                                          source=str(out),
                                          precision={torch.bfloat16: "bf16",
                                                     torch.float16: "fp16"}.get(dtype, "fp32")))
    spec = acceptance(target, draft, data.chat_prompts("held_out")[:settings.accept_prompts],
                      settings.gamma, settings.new_tokens) if settings.accept_prompts else None
    draft_ms = step_ms(draft)
    unused = (({"extra"} if student_kind.head_vocab else {"extra", "head_vocab"})
              | ({"lora_rank"} if not settings.lora_rank else set()))
    report = {
        "target": target.ref, "target_precision": target.precision,
        "base": base.ref if base else f"new:{arch}", "kind": kind.name,
        "draft_config": draft.net.config.to_dict(), "dtype": draft.precision,
        "parameters": lora.trainable(student)
        if settings.lora_rank else sum(p.numel() for p in draft.net.parameters()),
        "settings": {k: v for k, v in asdict(settings).items() if k not in unused} | settings.extra,
        "train_sequences": len(train), "train_positions": train.positions(),
        "held_out_positions": held.positions(), "teacher_data_s": round(data_s, 1),
        "train_s": round(result["elapsed_s"], 1), "steps": result["steps"],
        "budget": None if deadline is None else {"minutes": settings.minutes,
                                                 "teacher_shards_left_out": budget.skipped,
                                                 "train_budget_s": round(train_budget_s, 1),
                                                 "reserved_for_measurement_s": round(reserve_s, 1)},
        "held_out": result["held_out"], "history": result["history"],
        "speculative": None if spec is None else {"gamma": settings.gamma, "greedy": True,
                                                  "prompts": settings.accept_prompts,
                                                  "acceptance_rate": spec["acceptance_rate"],
                                                  "tau": spec["tau"]},
        "step_ms": {"target": target_ms, "draft": draft_ms, "ratio": draft_ms / target_ms,
                    "threads": torch.get_num_threads()},
    }

    def write(tmp: Path) -> None:
        if settings.lora_rank:
            for name in (adapter.CONFIG, adapter.WEIGHTS):
                shutil.copyfile(work / "adapter" / name, tmp / name)
        else:
            kind.write(draft, tmp, None)
        card = out / "MODEL_CARD.md"  # a hand-written card survives re-training
        if card.exists():
            (tmp / card.name).write_text(card.read_text(encoding="utf-8"), encoding="utf-8")
        (tmp / "distill.json").write_text(json.dumps(report, indent=1), encoding="utf-8")

    atomic.write_dir(out, write)
    if register:
        registry.register(model_ref(target.ref).name, target.precision, out,
                          {"base": report["base"], "held_out_beta": result["held_out"]["beta"]})
    report["registered"] = register
    # finished: a later run in `work` starts afresh
    shutil.rmtree(work / "ckpt", ignore_errors=True)
    return report
