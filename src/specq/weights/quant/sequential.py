"""Sequential block-by-block calibration for GPTQ and AWQ on the `specq.model.llama.Llama` layout.

Block inputs are cached once (embeddings for block 0) and advanced through each block after it
is quantized, so block i is calibrated on what the already-quantized blocks < i produce and the
whole model is never re-run. Quantized layers keep running as dequantized float weights until
`quantize_model` swaps in the execution modules. Inputs of the linears are reduced on the fly
to `InputStats` (Hessian and mean|x|), and a calibration pass stops a block's forward as soon as
the linears it collects for have run.

GPTQ is "true sequential" inside a block: each linear (in registration order, which is forward
order for Llama) gets its Hessian from a pass in which the linears before it are quantized.

AWQ folding (each fold is exact in real arithmetic, so execution cost is unchanged):
  wqkv: 1/s into attention_norm.weight;  w13: 1/s into ffn_norm.weight;
  wo:   1/s into the v rows of wqkv (v is not rotated). Under GQA a v channel feeds every query
        head of its group, so wo's scale is tied across those heads (mean|x| is averaged over
        them before the search);
  w2:   1/s into the "up" rows of w13 (silu(gate) * up/s = (silu(gate) * up)/s);
  head (with -head): 1/s into the final norm.
As in the reference, all scales of a block are searched on the float block, then folded, then
each linear is clip-searched (except wqkv, whose q/k rows feed the softmax) and rounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .awq import search_clip, search_scale
from .calibration import embed, run_block
from .gptq import gptq_quantize
from .rtn import QuantizedWeight, quantize_rtn
from .spec import QuantSpec
from .stats import InputStats


@dataclass(frozen=True)
class CalibrationConfig:
    """Knobs of the calibrated methods. Defaults follow the reference code, except act_order,
    which is on: it is free here because groups stay contiguous, and it helps most at 3-4 bits."""

    damp: float = 0.01
    act_order: bool = True
    block_size: int = 128
    awq_grid: int = 20
    awq_clip: bool = True


# Statistics of the inputs of the given linears (by name) over all calibration samples.
Collect = Callable[[dict[str, nn.Linear]], dict[str, InputStats]]


@dataclass(frozen=True)
class Fold:
    """Where a linear's 1/s goes, and which of its input channels must share one scale."""

    apply: Callable[[Tensor], None]
    tie: Callable[[Tensor], Tensor] = lambda act_mean: act_mean  # noqa: E731


def quantize_calibrated(model: nn.Module, spec: QuantSpec, samples: Sequence[Tensor],
                        targets: dict[str, nn.Linear], group_sizes: dict[str, int],
                        config: CalibrationConfig,
                        on_layer: Callable[[str], None]) -> dict[str, QuantizedWeight]:
    """GPTQ or AWQ codes for every target, calibrated block by block on
    `samples` (1-D id tensors)."""
    reachable = {f"layers.{i}.{n}" for i, block in enumerate(model.layers)
                 for n, m in block.named_modules()
                 if isinstance(m, nn.Linear)} | {"output"}
    if unreachable := sorted(set(targets) - reachable):
        raise ValueError(f"{spec.method} calibrates decoder blocks and the head only; cannot reach "
                         f"{unreachable}")
    if not samples:
        raise ValueError(f"{spec.method} needs calibration samples (see calibration_samples)")
    method = _gptq_group if spec.method == "gptq" else _awq_group
    result: dict[str, QuantizedWeight] = {}

    def quantize(prefix: str, linears: dict[str, nn.Linear], collect: Collect,
                 folds: dict[str, Fold]) -> None:
        chosen = {n: m for n, m in linears.items() if prefix + n in targets}
        if chosen:
            groups = {n: group_sizes[prefix + n] for n in chosen}
            for name, qw in method(chosen, groups, collect, folds, spec, config):
                result[prefix + name] = qw
                on_layer(prefix + name)

    with torch.no_grad():
        xs = embed(model, samples)
        for i, block in enumerate(model.layers):
            linears = {n: m for n, m in block.named_modules() if isinstance(m, nn.Linear)}
            quantize(f"layers.{i}.", linears,
                     lambda chosen: _collect(chosen, lambda x: run_block(model, i, x), xs),
                     _llama_folds(block))
            xs = [run_block(model, i, x) for x in xs]
        norm = model.norm
        quantize("", {"output": model.output},
                 lambda chosen: _collect(chosen, lambda x: model.output(norm(x)), xs),
                 {"output": Fold(lambda s: norm.weight.div_(s.to(norm.weight.dtype)))})
    return result


def _llama_folds(block: nn.Module) -> dict[str, Fold]:
    att, ffn = block.attention, block.feed_forward
    v_rows = slice(att.q_size + att.kv_size, att.q_size + 2 * att.kv_size)
    group = att.n_heads // att.n_kv

    def tie_wo(act_mean: Tensor) -> Tensor:  # wo's input is head-major: [n_kv, group, head_dim]
        heads = act_mean.view(att.n_kv, group, att.head_dim)
        return heads.mean(1, keepdim=True).expand_as(heads).reshape(-1)

    def fold_wo(s: Tensor) -> None:
        s_kv = s.view(att.n_kv, group, att.head_dim)[:, 0].reshape(-1)
        att.wqkv.weight[v_rows] /= s_kv.to(att.wqkv.weight.dtype).unsqueeze(1)

    return {
        "attention.wqkv": Fold(
            lambda s: block.attention_norm.weight.div_(s.to(block.attention_norm.weight.dtype))),
        "attention.wo": Fold(fold_wo, tie_wo),
        "feed_forward.w13": Fold(
            lambda s: block.ffn_norm.weight.div_(s.to(block.ffn_norm.weight.dtype))),
        "feed_forward.w2": Fold(lambda s: ffn.w13.weight[ffn.intermediate:].div_(
            s.to(ffn.w13.weight.dtype).unsqueeze(1))),
    }


class _Collected(Exception):
    """Raised once every watched linear has seen its input: the rest of the
    forward is not needed."""


def _collect(linears: dict[str, nn.Linear], forward: Callable[[Tensor], object],
             xs: Sequence[Tensor]) -> dict[str, InputStats]:
    stats = {name: InputStats(m.in_features) for name, m in linears.items()}
    pending: set[str] = set()

    def hook(name: str, x: Tensor) -> None:
        stats[name].add(x)
        pending.discard(name)
        if not pending:
            raise _Collected

    hooks = [m.register_forward_pre_hook(lambda _m, args, name=name: hook(name, args[0]))
             for name, m in linears.items()]
    try:
        for x in xs:
            pending.update(linears)
            try:
                forward(x)
            except _Collected:
                pass
    finally:
        for h in hooks:
            h.remove()
    return stats


def _set_weight(linear: nn.Linear, weight: Tensor) -> None:
    """Replace (not write into) the parameter, so a tied embedding keeps its own weight."""
    linear.weight = nn.Parameter(weight.to(linear.weight.dtype), requires_grad=False)


def _gptq_group(linears: dict[str, nn.Linear], group_sizes: dict[str, int], collect: Collect,
                _folds: dict[str, Fold], spec: QuantSpec,
                config: CalibrationConfig) -> Iterator[tuple[str, QuantizedWeight]]:
    for name, linear in linears.items():
        hessian = collect({name: linear})[name].hessian
        qw = gptq_quantize(linear.weight, hessian, spec.bits, group_sizes[name], spec.symmetric,
                           config.damp, config.act_order, config.block_size)
        _set_weight(linear, qw.dequantize())
        yield name, qw


def _awq_group(linears: dict[str, nn.Linear], group_sizes: dict[str, int], collect: Collect,
               folds: dict[str, Fold], spec: QuantSpec,
               config: CalibrationConfig) -> Iterator[tuple[str, QuantizedWeight]]:
    if unknown := sorted(set(linears) - set(folds)):
        raise ValueError(f"AWQ does not know where to fold the scales of {unknown}")
    stats = collect(linears)
    scales = {name: search_scale(linear.weight, stats[name].hessian,
                                 folds[name].tie(stats[name].abs_mean), spec.bits,
                                 group_sizes[name], spec.symmetric, config.awq_grid)
              for name, linear in linears.items()}
    for name, s in scales.items():
        _set_weight(linears[name], linears[name].weight.float() * s)
        folds[name].apply(s)
    for name, linear in linears.items():
        w = linear.weight
        if config.awq_clip and name != "attention.wqkv":
            # inputs are x / s
            scaled_hessian = stats[name].hessian / torch.outer(scales[name], scales[name])
            w = search_clip(w, scaled_hessian, spec.bits, group_sizes[name], spec.symmetric,
                            config.awq_grid)
        qw = quantize_rtn(w, spec.bits, group_sizes[name], spec.symmetric)
        _set_weight(linear, qw.dequantize())
        yield name, qw
