"""Quantization-aware distillation (QAD) of a quantized target: `specq qad`.

The quantized model is trained to match its own float model's next-token distributions (KL on the
float teacher's top-k, the teacher data of `specq distill`), and is written back in exactly its
format: same spec (plus the `-qad` marker), same bits, groups, scales and zero points, same packed
kernels, same bytes; only code values change.

Method: the grid of the initial quantization (RTN, GPTQ or AWQ: its bf16 group scales and integer
zero points) stays fixed. Each quantized layer's codes become continuous ("latent", in units of
its group's step, so one learning rate fits every bit width), rounded in the forward pass with a
straight-through gradient and clamped to the code range; the float vectors (norms, biases) train
too. Export rounds the latents: the fake-quantized forward is the exported model's simulated
forward, bit for bit (`tests/training/test_qad.py`).
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

from .. import backends
from ..errors import SpecqError
from ..loading import precision
from ..loading.model import Model
from ..loading.refs import split_ref
from ..model.llama import Llama
from ..weights.quant.apply import quantized_layers
from ..weights.quant.modules import make_quant_linear
from ..weights.quant.rtn import QuantizedWeight, make_quantized, max_code
from .distill import TeacherSet, _batch, distill, divergences, evaluate
from .train import DATA_SHARE, Budget, DistillSettings, check_run, teacher_data

PULL = 0.49  # a latent starting from a float weight stays this many steps from its initial code
VECTOR_LR_SCALE = 0.05  # norms and biases (of order 1) move this much slower than latent codes
FLOAT_START = ("rtn", "gptq")  # methods whose float weights are in the quantized layers' coordinates
# (AWQ folds per-channel scales into norms and weights: its latents start on the grid)


class _RoundSTE(torch.autograd.Function):
    """round() forward, identity backward (the straight-through estimator)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad


class FakeQuantLinear(nn.Module):
    """A quantized layer in training: the group scales and zero points fixed, the codes continuous
    (`latent` [out, in], signed, in units of the group's step: w = round(latent) * scale after the
    clamp to the code range); gradients pass the rounding straight through and stop at the clamp."""

    def __init__(self, qw: QuantizedWeight, bias: Tensor | None, start: Tensor | None = None):
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
            latent = signed + (self._grouped(start.float()) / self.scales[..., None] - signed).clamp(-PULL, PULL)
        self.latent = nn.Parameter(latent.reshape(self.out_features, self.in_features).contiguous())

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    def _grouped(self, t: Tensor) -> Tensor:
        return t.view(self.out_features, -1, self.group_size)

    def _zero(self) -> Tensor:
        return 0.0 if self.zeros is None else self.zeros[..., None]

    def _codes(self, rounded: Tensor) -> Tensor:
        """Stored codes (signed, or unsigned from the zero point) [out, groups, group] of rounded latents."""
        qmax = max_code(self.bits, self.symmetric)
        if self.zeros is None:
            return rounded.clamp(-qmax, qmax)
        return (rounded + self._zero()).clamp(0, qmax)

    def weight(self) -> Tensor:
        """The fake-quantized weight [out, in]: exactly `QuantizedWeight.dequantize` of `quantized()`."""
        codes = self._codes(_RoundSTE.apply(self._grouped(self.latent)))
        return ((codes - self._zero()) * self.scales[..., None]).reshape(self.out_features, self.in_features)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight(), self.bias)

    @torch.no_grad()
    def quantized(self) -> QuantizedWeight:
        """The rounded codes on the fixed grid, in the storage format."""
        codes = self._codes(torch.round(self._grouped(self.latent))).reshape(self.out_features, self.in_features)
        return make_quantized(codes, self.scales, self.zeros, self.bits, self.group_size)


def student(quantized: Llama, reference: Llama | None) -> Llama:
    """A trainable copy of a quantized native model: each quantized layer a `FakeQuantLinear`
    (starting from `reference`'s float weight of the same name where given), the float vectors
    trainable, embeddings and a float head frozen."""
    net = backends.plain_copy(quantized)
    for p in net.parameters():
        p.requires_grad_(p.dim() == 1)
    floats = dict(reference.named_parameters()) if reference is not None else {}
    for name, m in quantized_layers(net).items():
        start = floats.get(f"{name}.weight")
        net.set_submodule(name, FakeQuantLinear(m.quantized(), m.bias, None if start is None else start.detach()))
    return net.train()


def param_groups(net: Llama) -> list[dict]:
    """Latent codes at the schedule's rate, the float vectors at VECTOR_LR_SCALE of it."""
    latents = [m.latent for m in net.modules() if isinstance(m, FakeQuantLinear)]
    known = {id(p) for p in latents}
    vectors = [p for p in net.parameters() if p.requires_grad and id(p) not in known]
    return [{"params": latents, "lr_scale": 1.0}, {"params": vectors, "lr_scale": VECTOR_LR_SCALE}]


def export(net: Llama) -> Llama:
    """A copy of the student as a normal quantized model: every `FakeQuantLinear` rounded onto its
    grid and put on the packed kernels, as `quantize_model` leaves a model."""
    out = copy.deepcopy(net).eval().requires_grad_(False)
    for name, m in [(n, m) for n, m in out.named_modules() if isinstance(m, FakeQuantLinear)]:
        out.set_submodule(name, make_quant_linear(m.quantized(), m.bias, True, torch.float32))
    return out


def qad_forward(net: Llama, data: TeacherSet, rows: list[int]) -> tuple[dict[str, Tensor], Tensor]:
    """`distill`'s forward for a native student: per-position divergences from the teacher on `rows`."""
    ids, flat, top_ids, top_logp = _batch(data, rows)
    n = ids.shape[1]
    net._ensure_rope(n)
    x = net._layers(ids, net.rope_cos[:n], net.rope_sin[:n], None, net._local(slice(0, n)))
    hidden = net.norm(x).reshape(-1, x.shape[-1])[flat]  # only the teacher positions: the head is large
    logq = torch.log_softmax(net.output(hidden).float(), dim=-1)
    return divergences(logq.gather(-1, top_ids), logq.argmax(-1), top_ids, top_logp), logq.new_zeros(())


def qad_spec(spec_text: str):
    """The `-qad` spec of a quantization spec given with or without the marker; float specs are refused."""
    spec = precision.parse(spec_text)
    if spec.is_float:
        raise SpecqError(f"'{spec_text}' is a float precision: QAD recovers what integer weights lose "
                         "(give e.g. int4-g64-rtn)")
    return type(spec)(**(asdict(spec) | {"qad": True}))


def checkpoint_name(spec) -> str:
    """The work folder's checkpoint subfolder of one spec (teacher data is shared by every spec)."""
    return f"ckpt-{spec}"


def run(target: Model, quantized: Model, spec, out: Path, work: Path, settings: DistillSettings, *,
        resume: bool = False, force: bool = False, since: float | None = None) -> dict:
    """Train `quantized` (a native model at the plain form of `spec`) towards `target` (its float
    model) and write the result to `out` as a quantized model directory at `spec` (`-qad`), with
    its provenance in quant_config.json; returns that provenance. The time budget
    (`settings.minutes`) counts from `since` (default now): teacher data takes at most DATA_SHARE."""
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
        print(f"specq: the time budget stopped teacher data after {data_s / 60:.1f} of {settings.minutes:g} minutes: "
              f"{budget.skipped} shards left out, training on the {len(train)} sequences there are",
              file=sys.stderr, flush=True)
    net = student(quantized.net, target.net if spec.method in FLOAT_START else None)
    evaluated = time.monotonic()
    before = evaluate(net, held, forward=qad_forward)
    eval_s = time.monotonic() - evaluated  # the final evaluation costs as much: kept out of training's budget
    train_budget_s = None if deadline is None else max(0.0, deadline - time.monotonic() - eval_s)
    result = distill(net, train, held, steps=settings.steps, time_budget_s=train_budget_s, loss=settings.loss,
                     lr=settings.lr, batch=settings.batch, checkpoint_dir=ckpt,
                     checkpoint_every=settings.checkpoint_every, eval_every=settings.eval_every, seed=settings.seed,
                     forward=qad_forward, groups=param_groups(net))
    provenance = {
        "method": "qad", "from": f"{split_ref(quantized.ref)[0]}@{quantized.precision}",
        "teacher": f"{split_ref(target.ref)[0]}@{target.precision}",
        "trained": "latent codes on the initial grid (straight-through rounding) and the float norms and biases",
        "settings": {k: v for k, v in asdict(settings).items() if k in SETTINGS} | settings.extra,
        "train_sequences": len(train), "train_positions": train.positions(), "held_out_positions": held.positions(),
        "teacher_data_s": round(data_s, 1), "train_s": round(result["elapsed_s"], 1), "steps": result["steps"],
        "budget": None if deadline is None else {"minutes": settings.minutes,
                                                 "teacher_shards_left_out": budget.skipped},
        "held_out_before": before, "held_out_after": result["held_out"], "history": result["history"],
        "threads": torch.get_num_threads(),
    }
    precision.save_quantized_dir(export(net), spec, target.tokenizer, target.eos_ids, out, provenance)
    shutil.rmtree(ckpt, ignore_errors=True)  # finished: a later run of this spec starts afresh
    return provenance | {"out": str(out)}


SETTINGS = ("texts", "prompts", "temperatures", "new_tokens", "text_windows", "seq_len", "steps", "minutes", "loss",
            "lr", "batch", "eval_every", "checkpoint_every", "gen_batch", "seed")  # what a QAD run uses
