"""Execution modules that replace `nn.Linear` after quantization.

Every module keeps the portable storage as persistent buffers (what `save_quantized` writes):
`qweight` (codes bit-packed by `pack.pack_bits`, row-major [out, in]; symmetric codes in two's
complement), `scales` (bf16 [out, in/group]), `zeros` (uint8 [out, in/group], asymmetric only)
and an optional float `bias`. Subclasses add the executed form:

* `DequantizedLinear`: the weight dequantized once to a float tensor. With the model's dtype it
  is the *simulated* reference used to measure output distributions; in bf16 it is how weights
  without a fast CPU kernel (5-7 bits, grouped or asymmetric int8, shapes a kernel rejects) run.
* `Int8Linear`: aten `_weight_int8pack_mm` (per-channel symmetric; shares memory with `qweight`).
* `Int4Linear`: aten `_weight_int4pack_mm_for_cpu` (group size 32/64/128/256, out % 16 == 0).
  2- and 3-bit codes run on it too: they are points of the 4-bit grid with the same scales and
  zero points, so this is exact, and 4x smaller and faster than a dequantized bf16 weight. On
  the int8-activation kernel 2- and 3-bit codes take their own bits a code (`int8dot.PACKS`).

The packed kernels need bf16 activations (fp32 ones hit a slow path), so they cast the input
to bf16 and the output back to the input's dtype. These modules are what eager execution runs;
the kernels backend runs the 2- to 8-bit ones on specq's int8-activation kernel instead, from the
weight in that kernel's layout that `int8dot_weight` gives (`backends.fastpath`), leaving the
module as it is. Their kernel tensors are plain attributes, not buffers, so `model.to(dtype)`
cannot turn them into formats the kernels reject. They are CPU kernels: move the model before
quantizing, not after.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...kernels import int8dot
from .pack import pack_bits, unpack_bits
from .rtn import QuantizedWeight

INT4_GROUP_SIZES = (32, 64, 128, 256)
INT4_INNER_K_TILES = 8  # required argument; the CPU packing gives the same layout for any value


def from_storage(qweight: Tensor, scales: Tensor, zeros: Tensor | None, bits: int, group_size: int,
                 shape: tuple[int, int]) -> QuantizedWeight:
    """Rebuild a `QuantizedWeight` from the stored buffers (inverse of `QuantLinear.__init__`)."""
    codes = unpack_bits(qweight, bits, shape[0] * shape[1], signed=zeros is None).view(shape)
    return QuantizedWeight(codes, scales.to(torch.bfloat16), zeros, bits, group_size)


class Int8DotForm:
    """A module whose weight specq's int8-activation kernel can also run (the kernels backend
    does, from `int8dot_weight`; the module's own forward runs a torch op)."""

    def int8dot_weight(self) -> int8dot.Int8DotWeight | None:
        """This weight in the int8-activation kernel's layout, or None when the
        kernel cannot take it."""
        raise NotImplementedError


class QuantLinear(nn.Module):
    """Portable storage plus byte accounting; `kernel` says how `forward` executes."""

    kernel: str

    def __init__(self, qw: QuantizedWeight, bias: Tensor | None):
        super().__init__()
        self.out_features, self.in_features = qw.codes.shape
        self.bits, self.group_size = qw.bits, qw.group_size
        self.register_buffer("qweight", pack_bits(qw.codes & ((1 << qw.bits) - 1), qw.bits))
        self.register_buffer("scales", qw.scales)
        self.register_buffer("zeros", qw.zeros)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    def quantized(self) -> QuantizedWeight:
        """The codes/scales/zeros back from storage."""
        return from_storage(self.qweight, self.scales, self.zeros, self.bits, self.group_size,
                            (self.out_features, self.in_features))

    def stored_bytes(self) -> int:
        return sum(t.nbytes for t in (self.qweight, self.scales, self.zeros, self.bias)
                   if t is not None)

    def executed_bytes(self) -> int:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bits={self.bits}, group_size={self.group_size}, symmetric={self.symmetric}, "
                f"kernel={self.kernel!r}")


class DequantizedLinear(QuantLinear):
    def __init__(self, qw: QuantizedWeight, bias: Tensor | None, dtype: torch.dtype, kernel: str):
        super().__init__(qw, bias)
        self.register_buffer("weight", qw.dequantize().to(dtype), persistent=False)
        self.kernel = kernel

    def forward(self, x: Tensor) -> Tensor:
        bias = None if self.bias is None else self.bias.to(self.weight.dtype)
        return F.linear(x.to(self.weight.dtype), self.weight, bias).to(x.dtype)

    def executed_bytes(self) -> int:
        return self.weight.nbytes + (0 if self.bias is None else self.bias.nbytes)


class Int8Linear(Int8DotForm, QuantLinear):
    def __init__(self, qw: QuantizedWeight, bias: Tensor | None):
        super().__init__(qw, bias)
        self._weight = self.qweight.view(torch.int8).view(self.out_features, self.in_features)
        self._scales = self.scales.view(-1)

    @property
    def kernel(self) -> str:
        return "int8 packed kernel (_weight_int8pack_mm)"

    def int8dot_weight(self) -> int8dot.Int8DotWeight | None:
        if int8dot.shape_blocker(self.out_features, self.in_features, self.in_features):
            return None
        return int8dot.pack_int8(self._weight, self._scales.float().view(-1, 1))

    def forward(self, x: Tensor) -> Tensor:
        y = torch.ops.aten._weight_int8pack_mm(
            x.reshape(-1, self.in_features).to(torch.bfloat16), self._weight, self._scales)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def executed_bytes(self) -> int:
        return self.stored_bytes()


def _nbytes(t: Tensor | None) -> int:
    return 0 if t is None else t.nbytes


class Int4Linear(Int8DotForm, QuantLinear):
    def __init__(self, qw: QuantizedWeight, bias: Tensor | None):
        super().__init__(qw, bias)
        # The kernel computes w = (u - 8) * scale + zero with unsigned u in [0, 15]; codes of
        # 2-4 bits (signed in [-7, 7] or unsigned in [0, 15]) all map into that range.
        scale = qw.scales.float()
        if qw.zeros is None:
            unsigned, zero = qw.codes.to(torch.int32) + 8, torch.zeros_like(scale)
        else:
            unsigned, zero = qw.codes.to(torch.int32), (8 - qw.zeros.float()) * scale
        self._weight, self._scales_zeros = int4_kernel_tensors(unsigned, scale, zero)

    @property
    def kernel(self) -> str:
        codes = "" if self.bits == 4 else f"int{self.bits} codes on the "
        return f"{codes}int4 packed kernel (_weight_int4pack_mm_for_cpu, group {self.group_size})"

    def int8dot_weight(self) -> int8dot.Int8DotWeight | None:
        if int8dot.shape_blocker(self.out_features, self.in_features, self.group_size):
            return None
        qw = self.quantized()
        scale = qw.scales.float()  # w = (u - zero_point) * scale = scale * u + m
        bits = min(qw.bits, 4)  # 2- and 3-bit codes at their own bits a code
        if qw.zeros is None:  # symmetric codes in [-(2^(b-1) - 1), 2^(b-1) - 1] as u = c + 2^(b-1)
            shift = 1 << (bits - 1)
            unsigned, m = qw.codes.to(torch.int32) + shift, -shift * scale
        else:
            unsigned, m = qw.codes.to(torch.int32), -qw.zeros.float() * scale
        return int8dot.PACKS[bits](unsigned, scale, m)

    def forward(self, x: Tensor) -> Tensor:
        return int4_linear(x, self._weight, self.group_size, self._scales_zeros, self.bias,
                           self.out_features)

    def executed_bytes(self) -> int:
        return self._weight.nbytes + self._scales_zeros.nbytes + _nbytes(self.bias)


def int4_kernel_tensors(unsigned: Tensor, scale: Tensor, zero: Tensor) -> tuple[Tensor, Tensor]:
    """The packed weight and bf16 scales-and-zeros [groups, out, 2] of
    `_weight_int4pack_mm_for_cpu`, which computes w = (u - 8) * scale + zero per group, from codes u
    [out, in] in [0, 15] and float scale / zero [out, groups]."""
    weight = torch._convert_weight_to_int4pack_for_cpu(unsigned.to(torch.int32).contiguous(),
                                                       INT4_INNER_K_TILES)
    scales_zeros = torch.stack([scale.float(), zero.float()],
                               -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return weight, scales_zeros


def int4_linear(x: Tensor, weight: Tensor, group_size: int, scales_zeros: Tensor,
                bias: Tensor | None, out_features: int) -> Tensor:
    """x [..., in] (any float dtype) times a packed int4 weight, in x's dtype."""
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.reshape(-1, x.shape[-1]).to(torch.bfloat16), weight, group_size, scales_zeros)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.view(*x.shape[:-1], out_features).to(x.dtype)


class FileBlocks(Int8DotForm, nn.Module):
    """Quantized blocks from a file (GGUF, any format of `weights.gguf_formats`), run without
    requantizing: on the kernels backend on the int8-activation kernel with the file's own codes and
    float32 scales (the file's weights exactly), on the eager path (this module's forward) on what
    torch offers: 4-bit codes in groups its int4 kernel takes on that kernel (scales and offsets
    rounded to its bf16), anything else dequantized to bf16. The kernel's tensors are the only copy
    of the codes; the eager form is built from them on first eager use only (no second copy of a
    large model on the kernels). The file is the storage, so these modules keep no buffers."""

    def __init__(self, blocks: int8dot.Int8DotWeight, kind: str):
        """`blocks`: the file's weights in the kernel's layout
        (`weights.gguf_formats.kernel_weight`); `kind` names the file's format(s)."""
        super().__init__()
        self._blocks = blocks
        self.out_features, self.in_features = blocks.out_features, blocks.in_features
        self.bits, self.group_size, self.kind = blocks.bits, blocks.group_size, kind
        self._eager: tuple[Tensor, ...] | None = None

    @property
    def kernel(self) -> str:
        if self._torch_int4():
            return f"{self.kind} blocks on the int4 packed kernel (group {self.group_size})"
        return f"{self.kind} blocks dequantized to bf16"

    def int8dot_weight(self) -> int8dot.Int8DotWeight | None:
        return self._blocks

    def _torch_int4(self) -> bool:
        """Whether torch's int4 kernel takes this weight (else the eager path runs bf16 weights)."""
        return (self.bits <= 4 and self._blocks.grid is None and self.group_size in INT4_GROUP_SIZES
                and self.out_features % 16 == 0)

    def _eager_form(self) -> tuple[Tensor, ...]:
        """The eager path's tensors: torch's packed int4 weight and
        scales-and-zeros, or a bf16 weight."""
        if self._eager is None:
            if self._torch_int4():
                codes, d, m = int8dot.unpack(self._blocks)
                self._eager = int4_kernel_tensors(codes, d, m + 8 * d)
            else:
                self._eager = (int8dot.dequantize(self._blocks).to(torch.bfloat16),)
        return self._eager

    def forward(self, x: Tensor) -> Tensor:
        if self._torch_int4():
            weight, scales_zeros = self._eager_form()
            return int4_linear(x, weight, self.group_size, scales_zeros, None, self.out_features)
        (weight,) = self._eager_form()
        return F.linear(x.to(torch.bfloat16), weight).to(x.dtype)

    def stored_bytes(self) -> int:
        return self.executed_bytes()

    def executed_bytes(self) -> int:
        """What forward reads, counted without building the eager form (a copy of the weight)."""
        if self._torch_int4():  # two codes per byte, a bf16 scale and zero per group
            return (self.out_features * self.in_features // 2
                    + 4 * self.out_features * (self.in_features // self.group_size))
        return 2 * self.out_features * self.in_features  # bf16 weights



def kernel_blocker(qw: QuantizedWeight) -> str | None:
    """Why no packed kernel can run this weight (None when one can)."""
    out, n_in = qw.codes.shape
    if qw.bits == 8:
        if not qw.symmetric or qw.group_size != n_in:
            return "the int8 kernel is per-channel symmetric"
        if n_in % 16:  # the kernel crashes on other widths
            return f"the int8 kernel needs in_features % 16 == 0, got {n_in}"
        return None
    if qw.bits <= 4:
        if qw.group_size not in INT4_GROUP_SIZES:
            return f"the int4 kernel needs group size in {INT4_GROUP_SIZES}, got {qw.group_size}"
        if out % 16:
            return f"the int4 kernel needs out_features % 16 == 0, got {out}"
        return None
    return "no fast kernel"


def make_quant_linear(qw: QuantizedWeight, bias: Tensor | None, packed: bool,
                      dtype: torch.dtype) -> QuantLinear:
    """The module that executes `qw`: simulated in `dtype` unless `packed`, else the fastest
    packed kernel that accepts it, else dequantized to bf16."""
    name = f"int{qw.bits}"
    if not packed:
        return DequantizedLinear(qw, bias, dtype,
                                 f"{name} simulated ({str(dtype).removeprefix('torch.')} weights)")
    blocker = kernel_blocker(qw)
    if blocker is None:
        return Int8Linear(qw, bias) if qw.bits == 8 else Int4Linear(qw, bias)
    return DequantizedLinear(qw, bias, torch.bfloat16, f"{name} dequantized to bf16 ({blocker})")
