"""Calibrate an existing draft to a (quantized) target: let the target answer prompts, fine-tune
the draft on the target's own distributions, and measure acceptance before and after.

A draft distilled from the fp32 target loses acceptance when the target is quantized, because
the quantized target's distribution moved. Training on the quantized target's own outputs and
next-token distributions (top-k, as in `distill`) moves the draft after it.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import checks
from ..core.decode import decode
from ..core.prompt import check_context, encode_prompt
from ..core.stats import bootstrap_ci
from ..core.types import Draft, Model
from ..data import chat_prompts
from ..errors import SpecqError
from ..loading import kinds, precision
from ..loading.drafts import registry
from ..loading.refs import model_ref
from ..loading.vocab import check_compatible
from . import students
from .distill import distill, float_teacher, teacher_continuations


@dataclass(frozen=True)
class CalibrationSettings:
    prompts: int = 48  # training prompts the target answers
    held_out: int = 8  # held-out prompts for acceptance before / after
    max_new_tokens: int = 128
    temperature: float = 0.0  # of the target's answers (their distributions are kept at T=1)
    steps: int = 300
    loss: str = "mix:0.5"  # (1 - W) * KL + W * TV
    lr: float = 5e-4
    batch: int = 8
    gamma: int = 4


def acceptance(target: Model, draft: Model | Draft, prompts: list[str], gamma: int,
               max_new_tokens: int) -> dict:
    """Greedy speculative runs without an early draft stop (so every proposal is gamma tokens):
    per-prompt acceptance rate and tau, with bootstrap CIs."""
    check_compatible(draft, target)
    rates, taus = [], []
    for prompt in prompts:
        ids = encode_prompt(target, prompt, chat=has_chat(target))
        drafter = kinds.for_pair(draft, target, min_confidence=0.0, gamma=gamma)
        check_context(target, drafter.nodes(gamma), max_new_tokens, len(ids))
        stats = decode(target, ids, drafter=drafter, gamma=gamma, max_new_tokens=max_new_tokens)[2]
        rates.append(stats.acceptance_rate)
        taus.append(stats.tau)
    return {"acceptance_rate": bootstrap_ci(rates), "tau": bootstrap_ci(taus), "per_prompt": rates}


def has_chat(model: Model) -> bool:
    return bool(getattr(model.tokenizer, "chat_template", None))


def default_out(draft_ref: str, target_precision: str) -> Path:
    """Where a calibrated draft goes by default: the user's registry, named after
    draft and precision."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model_ref(draft_ref).name).name)
    return registry_dir() / f"{base}-for-{target_precision}"


def ref_precision(target_ref: str) -> str:
    """The precision a target ref loads at, without loading it (a quantized folder's own spec)."""
    ref = model_ref(target_ref)
    name, spec = ref.name, ref.spec
    path = Path(name).expanduser()
    if precision.is_quantized_dir(path):
        from ..weights.quant import read_spec

        try:
            return str(read_spec(path))
        except (ValueError, KeyError, OSError) as e:
            raise SpecqError(f"cannot read the quantization of '{path}': {e}") from None
    return str(precision.parse(spec))


def registry_dir() -> Path:
    """The user's draft registry (docs/guide.md), where calibrated drafts go by default; they are
    registered there only when asked (`register`)."""
    return registry.user_dir()


def checkpoint_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.ckpt"


def check_output(out: Path | str, force: bool = False, resume: bool = False) -> Path:
    """`out` may be written (see `checks.output`), and an unfinished run for it is continued
    only when asked (as `distill --resume`), never silently; asking to resume what is not there
    is an error too."""
    out = checks.output(out, force, "--out")
    unfinished = (checkpoint_dir(out) / "last.pt").exists()
    if unfinished and not resume:
        raise SpecqError(f"'{checkpoint_dir(out)}' holds an unfinished calibration for '{out}': "
                         "add --resume to continue it, or remove it")
    if resume and not unfinished:
        raise SpecqError(f"--resume: no unfinished calibration for '{out}' (no "
                         f"{checkpoint_dir(out) / 'last.pt'})")
    return out


def calibrate(target: Model, draft: Model | Draft,
              settings: CalibrationSettings = CalibrationSettings(), out: Path | str | None = None,
              progress: bool = True, measure: bool = True, *, force: bool = False,
              resume: bool = False, register: bool = False) -> dict:
    """Fine-tune `draft` on `target`'s own outputs and save it (by default into `registry_dir`);
    with `register`, add it to the user's registry for the target's precision, so that `generate`
    and `serve` pick it there. Returns the report, with acceptance before and after on held-out
    prompts unless `measure` is False. An existing `out` is replaced only with `force`; an
    interrupted run continues only with `resume`."""
    check_compatible(draft, target)
    if not precision.is_float(draft.precision):
        raise SpecqError(f"calibrate the float draft (not {draft.precision}); quantize the result "
                         "afterwards")
    kind = kinds.kind_of(draft)
    student_kind = students.of(kind)
    student_kind.check_base(draft, None)
    out = check_output(out or default_out(draft.ref, target.precision), force, resume)
    train_prompts = chat_prompts("train")[: settings.prompts]
    held_prompts = chat_prompts("held_out")[: settings.held_out]
    def measured(d: Model | Draft) -> dict | None:
        return (acceptance(target, d, held_prompts, settings.gamma, settings.max_new_tokens)
                if measure else None)

    before = measured(draft)
    teacher = float_teacher(target.net)  # batched answers; the same weights as the target
    train = teacher_continuations(teacher, target.tokenizer, train_prompts,
                                  max_new_tokens=settings.max_new_tokens,
                                  temperature=settings.temperature, progress=progress)
    held = teacher_continuations(teacher, target.tokenizer, held_prompts,
                                 max_new_tokens=settings.max_new_tokens, progress=progress)
    del teacher
    if student_kind.reads_features:  # it learns from this target's own hidden states
        feats = target.runner or target.net
        train, held = train.with_features(feats), held.with_features(feats)
    student = student_kind.from_base(draft, target, train, None)
    checkpoints = checkpoint_dir(out)  # an interrupted run resumes from here
    result = distill(student, train, held, steps=settings.steps, loss=settings.loss, lr=settings.lr,
                     batch=settings.batch, checkpoint_dir=checkpoints,
                     eval_every=max(1, settings.steps // 5), progress=progress,
                     forward=student_kind.forward)
    net = student_kind.finish(student, draft.net.dtype)
    tuned = kinds.as_kind(kind, Model(ref=str(out), net=net, tokenizer=draft.tokenizer,
                                      eos_ids=draft.eos_ids, source=str(out),
                                      precision=draft.precision))
    after = measured(tuned)
    kinds.save(tuned, out, {"base": draft.ref})
    shutil.rmtree(checkpoints, ignore_errors=True)
    target_name = model_ref(target.ref).name
    report = {"target": target.ref, "target_precision": target.precision, "base_draft": draft.ref,
              "draft": str(out), "settings": settings.__dict__, "before": before, "after": after,
              "held_out_teacher": result["held_out"], "train_positions": train.positions(),
              "registered": register}
    info = {"base": draft.ref, "held_out_beta": result["held_out"]["beta"]}
    if measure:
        info |= {"acceptance_before": before["acceptance_rate"][0],
                 "acceptance_after": after["acceptance_rate"][0]}
    if register:
        registry.register(target_name, target.precision, out, info)
    return report
