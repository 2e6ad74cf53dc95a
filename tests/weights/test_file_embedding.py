"""A token embedding left in the file's format (`weights.embedding.FileEmbedding`): the rows it looks
up are gguf's dequantization of those rows, bit for bit, for every listed type."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from test_gguf_formats import QUANTIZED, random_tensor, same_bits

from specq.weights.embedding import FileEmbedding


@pytest.mark.parametrize("qtype", QUANTIZED + ["F32", "F16", "BF16", "Q2_K"])
def test_looked_up_rows_are_ggufs_dequantization_bit_for_bit(qtype):
    """Repeated and unordered ids in a [2, 3] batch; Q2_K has no row of the table (gguf decodes it)."""
    rng = np.random.default_rng(sum(map(ord, qtype)) + 1)
    raw = random_tensor(qtype, rng, 12, 512, scale=3.0, wide=True)
    reference = quants.dequantize(raw, GGMLQuantizationType[qtype])
    embedding = FileEmbedding(raw, qtype, 512)
    ids = torch.tensor([[11, 0, 3], [3, 7, 0]])
    rows = embedding(ids)
    assert rows.shape == (2, 3, 512) and rows.dtype == torch.float32
    assert same_bits(rows.numpy(), reference[ids.numpy()], zero_sign=qtype == "Q4_0")
    assert same_bits(embedding.weight.numpy(), reference, zero_sign=qtype == "Q4_0")


def test_a_copy_shares_the_files_rows():
    raw = random_tensor("Q8_0", np.random.default_rng(0), 4, 64)
    embedding = FileEmbedding(raw, "Q8_0", 64)
    twin = copy.deepcopy(embedding)
    assert twin.raw is raw and torch.equal(twin(torch.tensor([2, 1])), embedding(torch.tensor([2, 1])))
