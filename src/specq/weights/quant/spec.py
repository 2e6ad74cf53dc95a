"""Quantization spec strings: one readable name per weight format, shared by the CLI, result
tables and saved checkpoints.

Grammar (suffixes may come in any order when parsing; `str()` writes this canonical order):

    fp32 | bf16 | fp16
    int{bits}[-g{group}][-rtn|-gptq|-awq][-sym|-asym][-head|-head8][-qad]

* bits 2..8. Without `-g` there is one scale per output channel ("per channel").
* Method defaults to `rtn`. The canonical form spells the method out unless the spec is plain
  per-channel RTN, so `int8` and `int4-g128-rtn` are both canonical.
* Symmetry defaults to symmetric at 8 bits (the packed int8 kernel is symmetric) and asymmetric
  below (a zero point per group costs a byte and buys back the range that a symmetric grid
  wastes on one-sided groups, which matters at 2-4 bits). The suffix is written only when it
  differs from the default.
* `-head` also quantizes the output head like the other layers (off by default: it is usually
  tied to the input embeddings and is the layer most sensitive to quantization). `-head8` gives
  the head per-channel int8 RTN weights (the packed int8 kernel) whatever the body's format: the
  head is the largest single matmul of a small model's step, and int8 keeps it close to float.
* `-qad` marks codes recovered by quantization-aware distillation (`specq qad`): the same format
  as without it (bits, groups, kernels, bytes), other code values, so it names another model and
  another cache entry. Only `specq qad` makes one; quantizing to it is an error.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch

FLOAT_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16,
                                        "fp16": torch.float16}
METHODS = ("rtn", "gptq", "awq")
MAX_GROUP = 1 << 16  # weights per quantization group: more than any layer's row
VALID_FORMS = ("fp32 | bf16 | fp16 | "
               "int{2..8}[-g<group>][-rtn|-gptq|-awq][-sym|-asym][-head|-head8][-qad] (e.g. int8, "
               "int4-g128-gptq, int3-g64-awq, int2-g32-rtn)")


@dataclass(frozen=True)
class QuantSpec:
    """A weight format: either a float dtype, or integer bits with grouping and a method.

    `group_size` None means per output channel; `symmetric` None means the default for the
    bits. Direct construction is validated like `parse_spec`."""

    dtype: torch.dtype | None = None
    bits: int | None = None
    group_size: int | None = None
    method: str = "rtn"
    symmetric: bool | None = None
    quantize_head: bool = False  # the head quantized like the body
    head_int8: bool = False  # the head as per-channel int8 RTN (`-head8`)
    # codes recovered by quantization-aware distillation (`-qad`, `training/qad.py`)
    qad: bool = False

    def __post_init__(self) -> None:
        if self.dtype is not None:
            if self.dtype not in FLOAT_DTYPES.values():
                raise ValueError(f"unsupported float dtype {self.dtype}; valid specs: "
                                 f"{VALID_FORMS}")
            if (self.bits, self.group_size, self.method, self.symmetric, self.quantize_head,
                self.head_int8, self.qad) != (None, None, "rtn", None, False, False, False):
                raise ValueError("a float spec takes no quantization options; valid specs: "
                                 f"{VALID_FORMS}")
            return
        if self.bits is None or not 2 <= self.bits <= 8:
            raise ValueError(f"bits must be 2..8, got {self.bits}; valid specs: {VALID_FORMS}")
        if self.group_size is not None and self.group_size < 1:
            raise ValueError(f"group size must be positive, got {self.group_size}; valid specs: "
                             f"{VALID_FORMS}")
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; valid specs: {VALID_FORMS}")
        if self.quantize_head and self.head_int8:
            raise ValueError(f"-head and -head8 exclude each other; valid specs: {VALID_FORMS}")
        if self.symmetric is None:
            object.__setattr__(self, "symmetric", default_symmetric(self.bits))

    @property
    def is_float(self) -> bool:
        return self.dtype is not None

    def __str__(self) -> str:
        if self.dtype is not None:
            return next(name for name, dt in FLOAT_DTYPES.items() if dt == self.dtype)
        parts = [f"int{self.bits}"]
        if self.group_size is not None:
            parts.append(f"g{self.group_size}")
        if self.method != "rtn" or self.group_size is not None:
            parts.append(self.method)
        if self.symmetric != default_symmetric(self.bits):
            parts.append("sym" if self.symmetric else "asym")
        if self.quantize_head:
            parts.append("head")
        if self.head_int8:
            parts.append("head8")
        if self.qad:
            parts.append("qad")
        return "-".join(parts)


def default_symmetric(bits: int) -> bool:
    return bits == 8


def _bad(spec: str, why: str) -> ValueError:
    return ValueError(f"bad quant spec {spec!r} ({why}); valid: {VALID_FORMS}")


def parse_spec(spec: str) -> QuantSpec:
    """Parse a spec string (case-insensitive) into a `QuantSpec`; ValueError
    lists the valid forms."""
    text = spec.strip().lower()
    if text in FLOAT_DTYPES:
        return QuantSpec(dtype=FLOAT_DTYPES[text])
    head, *rest = text.split("-")
    m = re.fullmatch(r"int(\d)", head)
    if m is None or not 2 <= int(m.group(1)) <= 8:
        raise _bad(spec, f"{head!r} is not fp32/bf16/fp16 or int2..int8")
    bits = int(m.group(1))
    seen: dict[str, str] = {}
    for token in rest:
        if (g := re.fullmatch(r"g(\d+)", token)) is not None:
            kind = "group"
            if not 1 <= int(g.group(1)) <= MAX_GROUP:
                raise _bad(spec, f"group size must be in [1, {MAX_GROUP}]")
        elif token in METHODS:
            kind = "method"
        elif token in ("sym", "asym"):
            kind = "symmetry"
        elif token in ("head", "head8"):
            kind = "head"
        elif token == "qad":
            kind = "qad"
        else:
            raise _bad(spec, f"unknown part {token!r}")
        if kind in seen:
            raise _bad(spec, f"{kind} given twice")
        seen[kind] = token
    return QuantSpec(
        bits=bits,
        group_size=int(seen["group"][1:]) if "group" in seen else None,
        method=seen.get("method", "rtn"),
        symmetric=seen["symmetry"] == "sym" if "symmetry" in seen else None,
        quantize_head=seen.get("head") == "head",
        head_int8=seen.get("head") == "head8",
        qad="qad" in seen,
    )


def without_qad(spec: QuantSpec) -> QuantSpec:
    """The plain spec a `-qad` spec starts from (same format, the initial codes)."""
    return dataclasses.replace(spec, qad=False)

