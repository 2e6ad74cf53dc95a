"""Quantization-aware distillation (QAD) of a quantized target: `specq qad`.

The quantized model is trained to match its own float model's next-token distributions (KL on the
float teacher's top-k, the teacher data of `specq distill`), and is written back in exactly its
format: same spec (plus the `-qad` marker), same bits, groups, bf16 scales and integer zero points,
same packed kernels, same bytes; only values change.

Method: the codes and the zero points of the initial quantization (RTN, GPTQ or AWQ) stay; what
trains by default is each group's scale, as its initial bf16 value times exp(`log_gain`), rounded
to bf16 in the forward pass with a straight-through gradient (so the stored scale is the one
trained), and the float vectors (norms, biases). The codes can train too (`code_lr`): continuous
"latent" codes, in units of the group's initial step (one rate fits every bit width), rounded in
the forward pass with a straight-through gradient and clamped to the code range. Short runs on the
built-in target (docs/quantization.md at 4a89039) chose scales: one number per group, moving
smoothly, where Adam moving every latent flips codes by whole steps. Export rounds: the
fake-quantized forward is the exported model's simulated forward, bit for bit
(`tests/training/test_qad.py`).
"""

from __future__ import annotations

import copy
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.types import Model
from ..errors import SpecqError
from ..loading import precision
from ..loading.refs import model_ref
from ..model.llama import Llama
from ..weights.quant.apply import quantized_layers
from ..weights.quant.modules import make_quant_linear
from ..weights.quant.rtn import QuantizedWeight, make_quantized, max_code
from .distill import TeacherSet, _batch, distill, divergences, evaluate
from .train import DATA_SHARE, Budget, DistillSettings, check_run, teacher_data

PULL = 0.49  # a latent starting from a float weight stays this many steps from its initial code
# norms and biases (of order 1) move this much slower than the scales (or codes)
VECTOR_LR_SCALE = 0.05
# methods whose float weights are in the quantized layers' coordinates (AWQ folds per-channel scales
# into norms and weights: its latents start on the grid)
FLOAT_START = ("rtn", "gptq")


class _RoundSTE(torch.autograd.Function):
    """round() forward, identity backward (the straight-through estimator)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad


class _RoundBF16(torch.autograd.Function):
    """Rounding to bfloat16 (the stored scales' precision) forward, identity backward."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.to(torch.bfloat16).float()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad


class FakeQuantLinear(nn.Module):
    """A quantized layer in training: the zero points fixed; the codes continuous (`latent`
    [out, in], signed, in units of the group's initial step: w = round(latent) * scale after the
    clamp to the code range; gradients pass the rounding straight through and stop at the clamp);
    each group's scale its initial one times exp(`log_gain`) [out, groups], rounded to bf16 as
    stored (straight through). `codes` / `scales`: which of the two train."""

    def __init__(self, qw: QuantizedWeight, bias: Tensor | None, start: Tensor | None = None, *,
                 codes: bool = True, scales: bool = True):
        """`start` [out, in]: float weights to begin from, kept within PULL of the initial codes
        (None: begin on the codes)."""
        super().__init__()
        self.out_features, self.in_features = qw.codes.shape
        self.bits, self.group_size = qw.bits, qw.group_size
        self.register_buffer("scales", qw.scales.float())  # [out, groups], bf16 values
        self.register_buffer("zeros", None if qw.zeros is None else qw.zeros.float())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        signed = self._grouped(qw.codes.float()) - self._zero()  # codes relative to the zero point
        latent = signed
        if start is not None:
            latent = signed + (self._grouped(start.float()) / self.scales[..., None]
                               - signed).clamp(-PULL, PULL)
        self.latent = nn.Parameter(latent.reshape(self.out_features, self.in_features).contiguous(),
                                   requires_grad=codes)
        self.log_gain = nn.Parameter(torch.zeros_like(self.scales), requires_grad=scales)

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    def _grouped(self, t: Tensor) -> Tensor:
        return t.view(self.out_features, -1, self.group_size)

    def _zero(self) -> Tensor:
        return 0.0 if self.zeros is None else self.zeros[..., None]

    def _codes(self, rounded: Tensor) -> Tensor:
        """Stored codes (signed, or unsigned from the zero point) [out, groups,
        group] of rounded latents."""
        qmax = max_code(self.bits, self.symmetric)
        if self.zeros is None:
            return rounded.clamp(-qmax, qmax)
        return (rounded + self._zero()).clamp(0, qmax)

    def scale(self) -> Tensor:
        """The groups' steps [out, groups] as stored: bf16 values (exactly the
        initial ones at gain 1)."""
        if not self.log_gain.requires_grad and not self.log_gain.any():
            return self.scales
        return _RoundBF16.apply(self.scales * self.log_gain.exp())

    def signed(self) -> Tensor:
        """The codes relative to the zero point [out, groups, group], rounded and clamped."""
        if not self.latent.requires_grad:  # frozen codes: no rounding to pass gradients through
            with torch.no_grad():
                return self._codes(torch.round(self._grouped(self.latent))) - self._zero()
        return self._codes(_RoundSTE.apply(self._grouped(self.latent))) - self._zero()

    def weight(self) -> Tensor:
        """The fake-quantized weight [out, in]: exactly `QuantizedWeight.dequantize`
        of `quantized()`."""
        return (self.signed() * self.scale()[..., None]).reshape(self.out_features,
                                                                 self.in_features)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight(), self.bias)

    # Frozen codes are the initial ones, which `student` rebuilds: a checkpoint leaves them out
    # (4 bytes a weight, most of its size otherwise).
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if not self.latent.requires_grad:
            del destination[prefix + "latent"]

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if not self.latent.requires_grad and prefix + "latent" in missing_keys:
            missing_keys.remove(prefix + "latent")

    @torch.no_grad()
    def quantized(self) -> QuantizedWeight:
        """The rounded codes on the fixed grid, in the storage format."""
        codes = self._codes(torch.round(self._grouped(self.latent))).reshape(self.out_features,
                                                                             self.in_features)
        return make_quantized(codes, self.scale(), self.zeros, self.bits, self.group_size)


def student(quantized: Llama, reference: Llama | None, *, codes: bool = True,
            scales: bool = True) -> Llama:
    """A trainable copy of a quantized native model: each quantized layer a `FakeQuantLinear`
    (its codes starting from `reference`'s float weight of the same name where given, and training
    only with `codes`; its scales training with `scales`), the float vectors trainable, embeddings
    and a float head frozen."""
    net = copy.deepcopy(quantized)
    for p in net.parameters():
        p.requires_grad_(p.dim() == 1)
    floats = dict(reference.named_parameters()) if reference is not None and codes else {}
    for name, m in quantized_layers(net).items():
        start = floats.get(f"{name}.weight")
        net.set_submodule(name, FakeQuantLinear(m.quantized(), m.bias,
                                                None if start is None else start.detach(),
                                                codes=codes, scales=scales))
    return net.train()


def param_groups(net: Llama, code_lr_scale: float = 1.0, scale_lr_scale: float = 1.0,
                 vector_lr_scale: float = VECTOR_LR_SCALE) -> list[dict]:
    """Optimizer groups of what trains, each at its multiple of the schedule's rate, none decayed
    (decay would pull codes, gains and norms towards zero)."""
    layers = [m for m in net.modules() if isinstance(m, FakeQuantLinear)]
    latents = [m.latent for m in layers if m.latent.requires_grad]
    gains = [m.log_gain for m in layers if m.log_gain.requires_grad]
    known = {id(p) for m in layers for p in (m.latent, m.log_gain)}
    vectors = [p for p in net.parameters() if p.requires_grad and id(p) not in known]
    groups = [(latents, code_lr_scale), (gains, scale_lr_scale), (vectors, vector_lr_scale)]
    return [{"params": ps, "lr_scale": scale, "weight_decay": 0.0} for ps, scale in groups if ps]


def export(net: Llama) -> Llama:
    """A copy of the student as a normal quantized model: every `FakeQuantLinear` rounded onto its
    grid and put on the packed kernels, as `quantize_model` leaves a model."""
    out = copy.deepcopy(net).eval().requires_grad_(False)
    for name, m in [(n, m) for n, m in out.named_modules() if isinstance(m, FakeQuantLinear)]:
        out.set_submodule(name, make_quant_linear(m.quantized(), m.bias, True, torch.float32))
    return out


def qad_forward(net: Llama, data: TeacherSet, rows: list[int]) -> tuple[dict[str, Tensor], Tensor]:
    """`distill`'s forward for a native student: per-position divergences from
    the teacher on `rows`."""
    ids, flat, top_ids, top_logp = _batch(data, rows)
    n = ids.shape[1]
    net._ensure_rope(n)
    x = net._layers(ids, net.rope_cos[:n], net.rope_sin[:n], None, net._local(slice(0, n)))
    # only the teacher positions: the head is large
    hidden = net.norm(x).reshape(-1, x.shape[-1])[flat]
    logq = torch.log_softmax(net.output(hidden).float(), dim=-1)
    return (divergences(logq.gather(-1, top_ids), logq.argmax(-1), top_ids, top_logp),
            logq.new_zeros(()))


def qad_spec(spec_text: str):
    """The `-qad` spec of a quantization spec given with or without the marker;
    float specs are refused."""
    spec = precision.parse(spec_text)
    if spec.is_float:
        raise SpecqError(f"'{spec_text}' is a float precision: QAD recovers what integer weights "
                         "lose (give e.g. int4-g64-rtn)")
    return type(spec)(**(asdict(spec) | {"qad": True}))


def checkpoint_name(spec) -> str:
    """The work folder's checkpoint subfolder of one spec (teacher data is shared by every spec)."""
    return f"ckpt-{spec}"


def run(target: Model, quantized: Model, spec, out: Path, work: Path, settings: DistillSettings, *,
        code_lr: float = 0.0, resume: bool = False, force: bool = False,
        since: float | None = None) -> dict:
    """Train `quantized` (a native model at the plain form of `spec`) towards `target` (its float
    model) and write the result to `out` as a quantized model directory at `spec` (`-qad`), with
    its provenance in quant_config.json; returns that provenance. The time budget
    (`settings.minutes`) counts from `since` (default now): teacher data takes at most DATA_SHARE.
    `settings.lr`: the peak rate of the log group scales (0: they stay); `code_lr`: of the codes, in
    grid steps (0: they stay); the norms and biases train at VECTOR_LR_SCALE of the larger."""
    since = time.monotonic() if since is None else since
    deadline = None if settings.minutes is None else since + settings.minutes * 60
    if not isinstance(target.net, Llama) or not isinstance(quantized.net, Llama):
        raise SpecqError("QAD needs a Llama-architecture model (the native module)")
    ckpt = work / checkpoint_name(spec)
    check_run(out, work, force, resume, ckpt.name)
    started = time.perf_counter()
    budget = Budget(None if deadline is None else since + DATA_SHARE * settings.minutes * 60)
    train, held = teacher_data(target, settings, work, budget=budget)
    data_s = time.perf_counter() - started
    if budget.skipped:
        print(f"specq: the time budget stopped teacher data after {data_s / 60:.1f} of "
              f"{settings.minutes:g} minutes: {budget.skipped} shards left out, training on the "
              f"{len(train)} sequences there are",
              file=sys.stderr, flush=True)
    if settings.lr <= 0 and code_lr <= 0:
        raise SpecqError("nothing to train: give the scales or the codes a learning rate")
    net = student(quantized.net, target.net if spec.method in FLOAT_START else None,
                  codes=code_lr > 0, scales=settings.lr > 0)
    lr = max(settings.lr, code_lr)  # the schedule's peak; each group at its fraction of it
    evaluated = time.monotonic()
    before = evaluate(net, held, forward=qad_forward)
    # the final evaluation costs as much: kept out of training's budget
    eval_s = time.monotonic() - evaluated
    train_budget_s = None if deadline is None else max(0.0, deadline - time.monotonic() - eval_s)
    result = distill(net, train, held, steps=settings.steps, time_budget_s=train_budget_s,
                     loss=settings.loss, lr=lr, batch=settings.batch, checkpoint_dir=ckpt,
                     checkpoint_every=settings.checkpoint_every, eval_every=settings.eval_every,
                     seed=settings.seed, forward=qad_forward,
                     groups=param_groups(net, code_lr / lr, settings.lr / lr, VECTOR_LR_SCALE))
    provenance = {
        "method": "qad", "from": f"{model_ref(quantized.ref).name}@{quantized.precision}",
        "teacher": f"{model_ref(target.ref).name}@{target.precision}",
        "trained": " and ".join(
            name for name, on in (("group scales (bf16, straight-through)", settings.lr > 0),
                                  ("codes (straight-through rounding)", code_lr > 0)) if on)
        + ", the float norms and biases",
        "settings": {k: v for k, v in asdict(settings).items() if k in SETTINGS}
        | {"code_lr": code_lr}
        | settings.extra,
        "train_sequences": len(train), "train_positions": train.positions(),
        "held_out_positions": held.positions(), "teacher_data_s": round(data_s, 1),
        "train_s": round(result["elapsed_s"], 1), "steps": result["steps"],
        "budget": None if deadline is None else {"minutes": settings.minutes,
                                                 "teacher_shards_left_out": budget.skipped},
        "held_out_before": before, "held_out_after": result["held_out"],
        "history": result["history"], "threads": torch.get_num_threads(),
    }
    precision.save_quantized_dir(export(net), spec, target.tokenizer, target.eos_ids, out,
                                 provenance)
    shutil.rmtree(ckpt, ignore_errors=True)  # finished: a later run of this spec starts afresh
    return provenance | {"out": str(out)}


SETTINGS = ("texts", "prompts", "temperatures", "new_tokens", "text_windows", "seq_len", "steps",
            "minutes", "loss",
            # what a QAD run uses
            "lr", "batch", "eval_every", "checkpoint_every", "gen_batch", "seed")
