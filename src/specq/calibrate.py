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

import torch

from . import registry
from .api import encode_prompt, generate
from .data import chat_prompts
from .distill import TOP_K, TeacherSet, _topk, distill, init_draft, to_native
from .errors import SpecqError
from .models import Model, cache_dir, check_compatible, save_native, split_ref
from .stats import bootstrap_ci


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


@torch.inference_mode()
def target_teacher(target: Model, prompts: list[str], max_new_tokens: int, temperature: float,
                   seed: int = 0) -> TeacherSet:
    """The target's answers to chat prompts, with its top-k next-token distributions."""
    data = TeacherSet([], [], [], [])
    for i, prompt in enumerate(prompts):
        ids = encode_prompt(target, prompt, chat=has_chat(target))
        answer = generate(target, ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + i).token_ids
        full = torch.tensor(ids + answer)
        logits = target.net(full, None)[len(ids) - 1: len(full) - 1]
        top_ids, top_logp = _topk(logits, TOP_K)
        data += TeacherSet([full], [len(ids) - 1], [top_ids], [top_logp])
    return data


def acceptance(target: Model, draft: Model, prompts: list[str], gamma: int, max_new_tokens: int) -> dict:
    """Greedy speculative runs: per-prompt acceptance rate and tau, with bootstrap CIs."""
    rates, taus = [], []
    for prompt in prompts:
        stats = generate(target, prompt, draft, gamma=gamma, max_new_tokens=max_new_tokens,
                         chat=has_chat(target)).stats
        rates.append(stats.acceptance_rate)
        taus.append(stats.tau)
    return {"acceptance_rate": bootstrap_ci(rates), "tau": bootstrap_ci(taus), "per_prompt": rates}


def has_chat(model: Model) -> bool:
    return bool(getattr(model.tokenizer, "chat_template", None))


def default_out(draft: Model, target: Model) -> Path:
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(split_ref(draft.ref)[0]).name)
    return cache_dir() / "drafts" / f"{base}-for-{target.precision}"


def calibrate(target: Model, draft: Model, settings: CalibrationSettings = CalibrationSettings(),
              out: Path | str | None = None, progress: bool = True) -> dict:
    """Fine-tune `draft` on `target`'s own outputs; save it and register it for the target's
    precision (in the manifest of the output's parent directory). Returns the report."""
    check_compatible(draft, target)
    if draft.precision not in ("fp32", "bf16", "fp16"):
        raise SpecqError(f"calibrate the float draft (not {draft.precision}); quantize the result afterwards")
    source = Path(draft.source)
    if not (source / "config.json").is_file():
        raise SpecqError(f"draft '{draft.ref}' must be a local model directory to calibrate")
    out = Path(out) if out else default_out(draft, target)
    train_prompts = chat_prompts("train")[: settings.prompts]
    held_prompts = chat_prompts("held_out")[: settings.held_out]
    before = acceptance(target, draft, held_prompts, settings.gamma, settings.max_new_tokens)
    train = target_teacher(target, train_prompts, settings.max_new_tokens, settings.temperature)
    held = target_teacher(target, held_prompts, settings.max_new_tokens, 0.0, seed=10_000)
    draft_hf = init_draft(None, from_dir=source)
    checkpoints = out.parent / f".{out.name}.ckpt"  # an interrupted run resumes from here
    result = distill(draft_hf, train, held, steps=settings.steps, loss=settings.loss, lr=settings.lr,
                     batch=settings.batch, checkpoint_dir=checkpoints,
                     eval_every=max(1, settings.steps // 5), progress=progress)
    tuned = Model(ref=str(out), net=to_native(draft_hf, draft.net.dtype), tokenizer=draft.tokenizer,
                  eos_ids=draft.eos_ids, source=str(out), precision=draft.precision)
    after = acceptance(target, tuned, held_prompts, settings.gamma, settings.max_new_tokens)
    save_native(tuned, out)
    shutil.rmtree(checkpoints, ignore_errors=True)
    target_name = split_ref(target.ref)[0]
    report = {"target": target.ref, "target_precision": target.precision, "base_draft": draft.ref,
              "draft": str(out), "settings": settings.__dict__, "before": before, "after": after,
              "held_out_teacher": result["held_out"], "train_positions": train.positions()}
    registry.add(out.parent, registry.Entry(target_name, target.precision, out.name,
                                            {"base": draft.ref, "acceptance_before": before["acceptance_rate"][0],
                                             "acceptance_after": after["acceptance_rate"][0]}))
    return report
