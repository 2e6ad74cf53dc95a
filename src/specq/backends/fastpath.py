"""The kernels backend's table: which of specq's kernels runs each linear layer of a loaded model
(`kernels`), and where every linear layer of a native decoder is on them, its whole cached passes,
the work between the linear layers included, in one C call (`layer_stack`). The modules are never
changed: a kernel holds the weight in its own layout beside the module's, and `Runner.linear` looks
it up by module.

Why: `F.linear` on CPU goes to MKL's sgemm, whose small-batch path costs about linearly more per
row up to a few rows, so a verify pass of 2-5 rows costs about two one-token steps and
speculation loses. oneDNN (which inductor also uses for frozen CPU linears) takes the weight
pre-packed into its blocked layout once, and its GEMM grows far less with the row count; specq's
`f32dot` streams the weights faster still at the few rows of decoding (docs/design.md). torch's
packed int8 / int4 ops have the same problem in another form (they dequantize to float, so every
row costs float FMAs); where the int8-activation kernel builds and takes the shape, integer layers
run on it instead.

A float kernel's packed weight is a second copy in the kernel's layout; the module's weight stays
for saving, hashing and the embedding it may be tied to. Load weights before making the table: it
does not follow later changes to them.
"""

from __future__ import annotations

import functools
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..kernels import decoder, f32dot, int8dot
from ..kernels.rows import ROW_BY_ROW_MAX
from ..model.llama import Llama
from ..weights.quant.modules import FileBlocks, Int8DotForm

# oneDNN packs for an expected number of rows; any row count runs on the packed weight.
PACK_ROWS_HINT = 4


class Kernel(Protocol):
    """A linear layer's weight in one kernel's layout: x [..., in] -> [...,
    out], and what runs it."""

    name: str  # for --explain

    def __call__(self, x: Tensor) -> Tensor: ...


class FloatKernel:
    """A float linear layer without bias on the fast path's float kernels, same dtype in and out as
    the weight: float32 weights on this CPU's AVX2 up to `ROW_BY_ROW_MAX` rows on specq's `f32dot`
    panels, more rows (prefills) on torch's `F.linear`; otherwise (bf16, or no AVX2 or compiler) on
    oneDNN's pre-packed GEMM."""

    def __init__(self, weight: Tensor):
        self.weight = weight.detach()
        self.out_features, self.in_features = weight.shape
        use_panels = weight.dtype == torch.float32 and f32dot.available()
        self.panels = f32dot.FloatPanels(self.weight) if use_panels else None
        self._packed = (None if self.panels
                        else torch.ops.mkldnn._reorder_linear_weight(self.weight, PACK_ROWS_HINT))

    @property
    def name(self) -> str:
        if self.panels is not None:
            return f"specq f32dot panels (up to {ROW_BY_ROW_MAX} rows; F.linear beyond)"
        return "oneDNN packed GEMM"

    def __call__(self, x: Tensor) -> Tensor:
        if self.panels is not None:
            if x.numel() <= ROW_BY_ROW_MAX * self.in_features:
                return f32dot.linear(x, self.panels)
            return F.linear(x, self.weight)
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self._packed, None,
                                               "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)


class Int8DotKernel:
    """A 2- to 8-bit layer (specq's own or a file's blocks) on the int8-activation kernel, its bias
    (if any) added after, in the output's dtype."""

    def __init__(self, weight: int8dot.Int8DotWeight, bias: Tensor | None, prefix: str = ""):
        self.weight, self.bias, self.prefix = weight, bias, prefix

    @property
    def name(self) -> str:
        w = self.weight
        codes = "4-bit codes of a 16-value grid" if w.grid is not None else f"int{w.bits} weights"
        return (f"{self.prefix}{codes} x int8 activations (specq int8dot kernel, group "
                f"{w.group_size})")

    def __call__(self, x: Tensor) -> Tensor:
        y = int8dot.linear(x, self.weight)
        return y if self.bias is None else y + self.bias.to(y.dtype)


@functools.cache
def packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs weights of this dtype on this CPU (bf16 needs
    AVX512-BF16 or AVX-NE-CONVERT)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), PACK_ROWS_HINT)
        return True
    except RuntimeError:
        return False


def kernels(net: nn.Module) -> dict[nn.Module, Kernel]:
    """The fast kernel of each of `net`'s linear layers that one takes: every plain float
    `nn.Linear` without bias whose dtype this CPU packs, and every integer layer the int8-activation
    kernel takes. Inference only (no gradients flow to the kernels' copies)."""
    table: dict[nn.Module, Kernel] = {}
    for module in net.modules():
        if type(module) is nn.Linear and module.bias is None and packs(module.weight.dtype):
            table[module] = FloatKernel(module.weight)
        elif isinstance(module, Int8DotForm) and int8dot.available():
            weight = module.int8dot_weight()
            if weight is not None:
                table[module] = Int8DotKernel(weight, getattr(module, "bias", None),
                                              _prefix(module))
    return table


def _prefix(module: Int8DotForm) -> str:
    """What the kernel's name says of the module's own format."""
    if isinstance(module, FileBlocks):
        return f"{module.kind} blocks, "
    bits = getattr(module, "bits", 4)
    return "" if bits >= 4 else f"int{bits} codes on the "


def layer_stack(net: Llama, table: dict[nn.Module, Kernel],
                only: tuple[int, ...] | None = None) -> decoder.Stack | None:
    """All of `net`'s decoder layers (or those of `only`, in order) as one C call
    (`decoder.Stack`), if every linear layer runs on int8dot or f32dot without a bias of its own and
    the norms and q/k/v biases are float32; else None (the modules run one by one, on torch's ops
    between the linear layers)."""
    if not decoder.available():
        return None
    layers = []
    for block in (net.layers[i] for i in only or range(len(net.layers))):
        attention, ffn = block.attention, block.feed_forward
        weights = [_stack_weight(table.get(m))
                   for m in (attention.wqkv, attention.wo, ffn.w13, ffn.w2)]
        norms = (block.attention_norm.weight, block.ffn_norm.weight)
        optional = [attention.qkv_bias] + [None if m is None else m.weight for m in (
            attention.q_norm, attention.k_norm, block.post_attention_norm, block.post_ffn_norm)]
        if any(w is None for w in weights) or any(w.dtype != torch.float32
                                                  for w in (*norms, *optional)
                                                  if w is not None):
            return None
        layers.append(decoder.LayerWeights(*norms, *weights, *optional, attention.window,
                                           block.local_rope))
    c = net.config
    scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5
    return decoder.Stack(layers,
                         decoder.Shape(c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                                       c.rms_norm_eps, scale, c.hidden_act))


def _stack_weight(kernel: Kernel | None) -> f32dot.FloatPanels | int8dot.Int8DotWeight | None:
    """The weight the layer stack reads for a linear layer: f32dot panels or an int8dot weight of a
    layer without bias; None where the stack cannot run it."""
    if isinstance(kernel, FloatKernel):
        return kernel.panels
    if isinstance(kernel, Int8DotKernel) and kernel.bias is None:
        return kernel.weight
    return None
