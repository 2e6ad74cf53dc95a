"""A GGUF file's header (metadata and tensor table) read in well under a second, and its tensors
as memory-mapped numpy arrays, laid out as the `gguf` library's `GGUFReader` lays them out.

Why not `GGUFReader` itself: it builds numpy views for every element of every metadata array, and
a Qwen2.5 file's vocabulary and merges are ~300,000 strings, so opening the file costs tens of
seconds before a single weight is read. Here string arrays are skipped (their tokens matter only
to the tokenizer, which transformers builds once from the file and specq caches); every other
value is read as `GGUFReader` would return it. The format is llama.cpp's GGUF v2/v3.

The file's structure is checked as llama.cpp's own reader checks it, before any tensor is mapped:
no key or tensor twice, `general.alignment` a positive power of two, each tensor of a known type
with one to four positive dimensions (below 2**31) whose first is a whole number of its type's
blocks, and the tensors' data packed in table order (each starts where the one before it ends,
padded to the alignment) up to the end of the file. What the values mean to a model is checked
by `gguf_checks`.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

import numpy as np

from ...errors import SpecqError

MAGIC = b"GGUF"
# value type ids -> struct formats of the scalar types (8: string, 9: array)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
           11: "q", 12: "d"}
FLOAT32, STRING, ARRAY = 6, 8, 9
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
LIMIT = 2 ** 31  # every dimension, size and count stays below it (llama.cpp's int32 fields)
SKIPPED = object()  # the value of a string array: not read


class TokenType(IntEnum):
    """`tokenizer.ggml.token_type` values: gguf's TokenType, spelled here so that reading and
    writing vocabularies does not import gguf (slow to import) before it is needed."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # as the file stores it: the fastest-varying dimension first
    tensor_type: object  # gguf.GGMLQuantizationType
    # memory-mapped, shaped as GGUFReader shapes it (rows first; quantized: bytes per row)
    data: np.ndarray


class Header:
    """`fields`: each metadata key's value (a Python scalar, str, or a list; SKIPPED for arrays of
    strings); `tensors`: the tensor table, in file order."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise SpecqError(f"'{path}' is not a readable GGUF file ({e})") from None
        self._at = 0
        if self._bytes(4) != MAGIC:
            raise SpecqError(f"'{path}' is not a GGUF file (no GGUF magic)")
        version, = self._unpack("I")
        if version not in (2, 3):
            raise SpecqError(f"'{path}' is GGUF version {version}; specq reads versions 2 and 3")
        n_tensors, n_fields = self._unpack("QQ")
        self.fields = {}
        self._skipped: dict[str, tuple[int, int]] = {}  # a string array's (offset, count)
        for _ in range(n_fields):
            key = self._string()
            if key in self.fields:
                raise SpecqError(f"'{path}' holds metadata key {key} twice")
            at = self._at
            self.fields[key] = self._value(key, self._unpack("I")[0])
            if self.fields[key] is SKIPPED:
                self._skipped[key] = (at + 16, struct.unpack_from("<Q", self._buf, at + 8)[0])
        table = [self._tensor_info() for _ in range(n_tensors)]
        alignment = self._alignment()
        start = -(-self._at // alignment) * alignment
        types = self._layout(table, start, alignment)
        self.tensors = [self._tensor(name, dims, qtype, start + offset)
                        for (name, dims, _, offset), qtype in zip(table, types)]

    def strings(self, key: str) -> list[str]:
        """A string array's values, read when asked (a vocabulary: ~150,000 strings)."""
        if key not in self._skipped:
            raise SpecqError(f"'{self.path}' has no string array '{key}'")
        at, count = self._skipped[key]
        out, buf = [], self._buf
        for _ in range(count):
            n, = struct.unpack_from("<Q", buf, at)
            out.append(buf[at + 8:at + 8 + n].decode("utf-8", errors="replace"))
            at += 8 + n
        return out

    def string_count(self, key: str) -> int | None:
        """How many strings a string array holds (None: the file has no such array)."""
        return self._skipped[key][1] if key in self._skipped else None

    def drop_pages(self) -> None:
        """Unmap the pages read so far from this process (they stay in the page cache; a later read
        maps them again). Why: a file read once to convert its tensors would otherwise stay in the
        process's resident memory for as long as any view of it lives (a file-backed embedding)."""
        self._buf.madvise(mmap.MADV_DONTNEED)

    def _bytes(self, n: int) -> bytes:
        if self._at + n > len(self._buf):
            raise SpecqError(f"'{self.path}' is truncated (its header runs past the end of the "
                             "file)")
        out = self._buf[self._at:self._at + n]
        self._at += n
        return out

    def _unpack(self, fmt: str) -> tuple:
        size = struct.calcsize("<" + fmt)
        if self._at + size > len(self._buf):
            raise SpecqError(f"'{self.path}' is truncated (its header runs past the end of the "
                             "file)")
        out = struct.unpack_from("<" + fmt, self._buf, self._at)
        self._at += size
        return out

    def _string(self) -> str:
        n, = self._unpack("Q")
        return self._bytes(n).decode("utf-8", errors="replace")

    def _value(self, key: str, kind: int):
        # 1e-5 stored as float32: read back the 1e-5 it was written from, as gguf_io did
        if kind == FLOAT32:
            return float(str(np.float32(self._unpack("f")[0])))
        if kind in SCALARS:
            return self._unpack(SCALARS[kind])[0]
        if kind == STRING:
            return self._string()
        if kind != ARRAY:
            raise SpecqError(f"'{self.path}': {key} has a value of unknown type {kind}: corrupt")
        item, count = self._unpack("IQ")
        if item not in (*SCALARS, STRING):  # llama.cpp reads no array of arrays either
            raise SpecqError(f"'{self.path}': {key} is an array of values of type {item}, which "
                             "GGUF readers do not read")
        if item == STRING:  # skip: a length, then that many bytes, per string
            at, buf, end = self._at, self._buf, len(self._buf) - 8
            for _ in range(count):
                if at > end:
                    raise SpecqError(f"'{self.path}' is truncated (its header runs past the end of "
                                     "the file)")
                at += 8 + struct.unpack_from("<Q", buf, at)[0]
            self._at = at
            return SKIPPED
        return list(self._unpack(f"{count}{SCALARS[item]}"))

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        n_dims, = self._unpack("I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise SpecqError(f"'{self.path}': tensor {name} has {n_dims} dimensions (GGUF tensors "
                             f"have 1 to {MAX_DIMS})")
        dims = self._unpack(f"{n_dims}Q")
        kind, offset = self._unpack("IQ")
        return name, tuple(int(d) for d in dims), kind, offset

    def _alignment(self) -> int:
        value = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if (not isinstance(value, int) or isinstance(value, bool) or not 0 < value < LIMIT
                or value & (value - 1)):
            raise SpecqError(f"'{self.path}': general.alignment must be a positive power of two, "
                             f"got {value!r:.40}")
        return value

    def _layout(self, table: list, start: int, alignment: int) -> list:
        """Each tensor's type (gguf.GGMLQuantizationType), once the table is checked against the
        file: types, dimensions, and data packed in table order up to the end of the file."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        # each tensor's (name, type, where its data ends); end: where the data so far ends, padded
        laid, names, end = [], set(), 0
        for name, dims, kind, offset in table:
            where = f"'{self.path}': tensor {name}"
            if name in names:
                raise SpecqError(f"{where} is in the tensor table twice")
            names.add(name)
            try:
                qtype = GGMLQuantizationType(kind)
            except ValueError:
                raise SpecqError(f"{where} has an unknown type {kind}") from None
            if not all(0 < d < LIMIT for d in dims):
                raise SpecqError(f"{where} has dimensions {list(dims)}: each must be from 1 to "
                                 "2**31 - 1")
            block, size = GGML_QUANT_SIZES[qtype]
            if dims[0] % block:
                raise SpecqError(f"{where} is {qtype.name}, whose blocks of {block} values do not "
                                 f"fill its rows of {dims[0]}")
            if offset != end:
                previous = f"tensor {laid[-1][0]}" if laid else "the tensor data"
                raise SpecqError(f"{where} starts at byte {offset} of the tensor data, but "
                                 f"{previous} ends at byte {end} (GGUF packs tensors in table "
                                 "order: a changed type, shape or offset)")
            nbytes = math.prod(dims) // block * size
            if start + offset + nbytes > len(self._buf):
                raise SpecqError(f"'{self.path}' is truncated (tensor {name} runs past the end of "
                                 "the file)")
            end = offset + -(-nbytes // alignment) * alignment
            laid.append((name, qtype, offset + nbytes))
        if laid and not start + laid[-1][2] <= len(self._buf) <= start + end:
            raise SpecqError(f"'{self.path}' holds {len(self._buf) - start - laid[-1][2]} bytes "
                             f"after its last tensor, {laid[-1][0]} (its tensor table does not "
                             "describe the file: a changed type or shape)")
        return [qtype for _, qtype, _ in laid]

    def _tensor(self, name: str, dims: tuple[int, ...], qtype, offset: int) -> Tensor:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block, size = GGML_QUANT_SIZES[qtype]
        rows = tuple(reversed(dims))
        floats = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
        if qtype in floats:
            dtype, shape = floats[qtype], rows
        else:  # bytes per row, as GGUFReader shapes quantized tensors
            dtype, shape = np.uint8, rows[:-1] + (rows[-1] // block * size,)
        data = np.frombuffer(self._buf, dtype=dtype, count=math.prod(shape), offset=offset)
        return Tensor(name, dims, qtype, data.reshape(shape))
