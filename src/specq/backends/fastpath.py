"""The fast CPU path: put a loaded model's float32 linear layers on specq's `f32dot` panels (bf16
ones on oneDNN's packed GEMM), its 4-bit and 8-bit layers on specq's int8-activation kernel
(`kernels/int8dot.py`), and where every linear layer of the decoder is on specq's kernels, whole
cached passes, the work between the linear layers included, on `decoder.Stack` (`apply`). Passes
the stack does not take (prefills, long passes, gradients) run the modules' torch ops.

Why: `F.linear` on CPU goes to MKL's sgemm, whose small-batch path costs about linearly more per
row up to a few rows, so a verify pass of 2-5 rows costs about two one-token steps and
speculation loses. oneDNN (which inductor also uses for frozen CPU linears) takes the weight
pre-packed into its blocked layout once, and its GEMM grows far less with the row count; specq's
`f32dot` streams the weights faster still at the few rows of decoding (docs/fastpath.md). torch's
packed int8 / int4 ops have the same problem in another form (they dequantize to float, so every
row costs float FMAs); where the int8-activation kernel builds and takes the shape, integer layers
switch to it (`Int8DotSwitch.use_int8dot`).

The packed weight is a second copy in the kernel's layout; the original stays (a buffer under the
same state-dict name as `nn.Linear`'s weight) for saving, hashing, prefills and the embedding it
may be tied to. Load weights before packing: the pack does not follow later changes to them.
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..kernels import decoder, f32dot
from ..kernels.rows import ROW_BY_ROW_MAX
from ..model.llama import Llama
from ..weights.quant.modules import Int8DotSwitch

# oneDNN packs for an expected number of rows; any row count runs on the packed weight.
PACK_ROWS_HINT = 4


class PackedLinear(nn.Module):
    """`nn.Linear` (no bias) on the fast path's float kernels; same dtype in and out as the weight.
    float32 weights on this CPU's AVX2: up to `ROW_BY_ROW_MAX` rows on specq's `f32dot` panels,
    more rows (prefills) on torch's `F.linear`; otherwise (bf16, or no AVX2 or compiler) on
    oneDNN's pre-packed GEMM."""

    def __init__(self, weight: Tensor):
        super().__init__()
        self.register_buffer("weight", weight.detach())
        self.out_features, self.in_features = weight.shape
        self._panels = f32dot.FloatPanels(self.weight) if weight.dtype == torch.float32 and f32dot.available() else None
        self._packed = None if self._panels else torch.ops.mkldnn._reorder_linear_weight(self.weight, PACK_ROWS_HINT)

    @property
    def kernel(self) -> str:
        if self._panels is not None:
            return f"specq f32dot panels (up to {ROW_BY_ROW_MAX} rows; F.linear beyond)"
        return "oneDNN packed GEMM"

    def forward(self, x: Tensor) -> Tensor:
        if self._panels is not None:
            if x.numel() <= ROW_BY_ROW_MAX * self.in_features:
                return f32dot.linear(x, self._panels)
            return F.linear(x, self.weight)
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self._packed, None, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)

    def float_panels(self) -> f32dot.FloatPanels | None:
        return self._panels

    def __deepcopy__(self, memo: dict) -> "PackedLinear":
        """oneDNN's packed tensor cannot be copied: pack the copied weight anew."""
        copied = PackedLinear(copy.deepcopy(self.weight, memo))
        if self._panels is not None:
            memo[id(self._panels)] = copied._panels  # whoever else holds the panels gets the copy's
        return copied

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel!r}"


@functools.cache
def packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs weights of this dtype on this CPU (bf16 needs AVX512-BF16 or AVX-NE-CONVERT)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), PACK_ROWS_HINT)
        return True
    except RuntimeError:
        return False


def apply(net: nn.Module) -> int:
    """The whole fast path, in place: `pack_linears`, then a `layer_stack` for each native decoder
    where specq's kernels build. Returns how many linear layers changed kernel. Inference only;
    `revert` undoes it."""
    swapped = pack_linears(net)
    for module in net.modules():
        if isinstance(module, Llama):
            module.stack = layer_stack(module) if decoder.available() else None
    return swapped


def layer_stack(net: Llama) -> decoder.Stack | None:
    """All of `net`'s decoder layers as one C call (`decoder.Stack`), if every linear layer runs on
    int8dot or f32dot without a bias of its own and the norms and q/k/v biases are float32; else
    None (the modules run one by one, on torch's ops between the linear layers)."""
    layers = []
    for block in net.layers:
        attention, ffn = block.attention, block.feed_forward
        linears = (attention.wqkv, attention.wo, ffn.w13, ffn.w2)
        weights = [m.float_panels() if isinstance(m, PackedLinear) else getattr(m, "_int8dot", None)
                   for m in linears]
        norms = (block.attention_norm.weight, block.ffn_norm.weight)
        optional = [attention.qkv_bias] + [None if m is None else m.weight for m in (
            attention.q_norm, attention.k_norm, block.post_attention_norm, block.post_ffn_norm)]
        if any(w is None for w in weights) or any(getattr(m, "bias", None) is not None for m in linears) \
                or any(w.dtype != torch.float32 for w in (*norms, *optional) if w is not None):
            return None
        layers.append(decoder.LayerWeights(*norms, *weights, *optional, attention.window, block.local_rope))
    c = net.config
    scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5
    return decoder.Stack(layers, decoder.Shape(c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                                               c.rms_norm_eps, scale, c.hidden_act))


def revert(net: nn.Module) -> None:
    """Undo `apply` (before training, compiling or saving a module tree), in place."""
    for module in net.modules():
        if isinstance(module, Llama):
            module.stack = None
    unpack_linears(net)


def pack_linears(net: nn.Module) -> int:
    """Put `net`'s linear layers on the fast kernels, in place: every plain float `nn.Linear` without
    bias whose dtype this CPU packs becomes a `PackedLinear`, and every integer layer the
    int8-activation kernel takes switches to it. Returns how many layers changed kernel.
    Idempotent; inference only (no gradients flow to the packs)."""
    swapped = 0
    for name, module in list(net.named_modules()):
        if type(module) is nn.Linear and module.bias is None and packs(module.weight.dtype):
            net.set_submodule(name, PackedLinear(module.weight))
            swapped += 1
        elif isinstance(module, Int8DotSwitch) and module._int8dot is None:
            swapped += module.use_int8dot(True)
    return swapped


def unpack_linears(net: nn.Module) -> None:
    """Undo `pack_linears` (e.g. before training, compiling or saving a module tree), in place."""
    for name, module in list(net.named_modules()):
        if isinstance(module, Int8DotSwitch):
            module.use_int8dot(False)
        if isinstance(module, PackedLinear):
            linear = nn.Linear(module.in_features, module.out_features, bias=False, dtype=module.weight.dtype)
            linear.weight = nn.Parameter(module.weight, requires_grad=False)
            net.set_submodule(name, linear)
