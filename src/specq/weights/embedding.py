"""A token embedding kept in a file's own format and looked up row by row.

Why: a GGUF file's embedding is the largest single tensor (151,936 rows for the Qwen2.5 vocabulary);
as float32 it is several times the file's bytes, yet a step reads only the rows of its tokens. The
rows stay the file's (memory-mapped) bytes and each lookup dequantizes only those rows with the
`weights.gguf_formats` row decoders, which equal gguf's dequantize bit for bit (Q4_0 up to the sign
of zero, which no sum sees).

A decoding pass looks up one to a few ids, mostly ones looked up before, and the numpy calls that
dequantize a row cost a draft model's pass a measurable share of its time: the rows of short lookups
are kept as floats, a bounded number of them (`CACHED_ROWS`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from .gguf_formats import to_float

CACHED_ROWS = 4096  # float rows kept from short lookups; the oldest goes first
SHORT_LOOKUP = 16  # ids in a lookup that goes through the kept rows (a prompt's prefill does not)


class FileEmbedding(nn.Module):
    """`nn.Embedding`'s lookup over a file's stored rows. No buffers: the file is the storage."""

    def __init__(self, raw: np.ndarray, qtype: str, dim: int):
        """raw: uint8 [vocab, row bytes], the stored rows (a memory map: only looked-up rows are
        read); `qtype` the GGML type name; `dim` the embedding width."""
        super().__init__()
        self.raw, self.qtype = raw, qtype
        self.num_embeddings, self.embedding_dim = raw.shape[0], dim
        # id -> float32 [dim], in the order they were first looked up
        self._rows: dict[int, Tensor] = {}

    def forward(self, ids: Tensor) -> Tensor:
        """ids [...] int -> float32 [..., dim] (a new tensor: callers may write into it)."""
        flat = ids.reshape(-1).cpu()
        if 0 < flat.numel() <= SHORT_LOOKUP:
            rows = torch.stack([self._row(i) for i in flat.tolist()])
        else:
            rows = self._floats(flat.numpy())
        return rows.view(*ids.shape, self.embedding_dim)

    def _row(self, i: int) -> Tensor:
        row = self._rows.get(i)
        if row is None:
            if len(self._rows) >= CACHED_ROWS:
                del self._rows[next(iter(self._rows))]
            row = self._rows[i] = self._floats(np.array([i]))[0]
        return row

    def _floats(self, ids: np.ndarray) -> Tensor:
        """The rows of `ids` dequantized, float32 [len(ids), dim]."""
        return torch.from_numpy(to_float(self.raw[ids], self.qtype))

    @property
    def weight(self) -> Tensor:
        """Every row dequantized, float32 [vocab, dim]: a new float copy on each call, for the rare
        user of the whole table (a feature draft shares its target's embedding)."""
        return torch.from_numpy(to_float(self.raw, self.qtype))

    def __deepcopy__(self, memo: dict) -> "FileEmbedding":
        # the file's bytes are read-only: shared
        return FileEmbedding(self.raw, self.qtype, self.embedding_dim)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, {self.qtype} rows looked up from "
                "the file")
