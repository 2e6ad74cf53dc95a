"""A token embedding left in the file's format (`weights.embedding.FileEmbedding`): the rows it
looks up are gguf's dequantization of those rows, bit for bit, for every listed type."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from test_gguf_formats import QUANTIZED, SIGNED_ZERO, UNLISTED, random_tensor, same_bits

from specq.weights.embedding import FileEmbedding


@pytest.mark.parametrize("qtype", QUANTIZED + ["F32", "F16", "BF16", UNLISTED])
def test_looked_up_rows_are_ggufs_dequantization_bit_for_bit(qtype):
    """Repeated and unordered ids in a [2, 3] batch; UNLISTED has no row of the
    table (gguf decodes it)."""
    rng = np.random.default_rng(sum(map(ord, qtype)) + 1)
    raw = random_tensor(qtype, rng, 12, 512, scale=3.0, wide=True)
    reference = quants.dequantize(raw, GGMLQuantizationType[qtype])
    embedding = FileEmbedding(raw, qtype, 512)
    ids = torch.tensor([[11, 0, 3], [3, 7, 0]])
    rows = embedding(ids)
    assert rows.shape == (2, 3, 512) and rows.dtype == torch.float32
    assert same_bits(rows.numpy(), reference[ids.numpy()], zero_sign=qtype in SIGNED_ZERO)
    assert same_bits(embedding.weight.numpy(), reference, zero_sign=qtype in SIGNED_ZERO)


def test_a_copy_shares_the_files_rows():
    raw = random_tensor("Q8_0", np.random.default_rng(0), 4, 64)
    embedding = FileEmbedding(raw, "Q8_0", 64)
    twin = copy.deepcopy(embedding)
    assert (twin.raw is raw
            and torch.equal(twin(torch.tensor([2, 1])), embedding(torch.tensor([2, 1]))))


def test_short_lookups_keep_rows_that_a_caller_cannot_change(monkeypatch):
    """A few ids at a time go through the kept float rows (`CACHED_ROWS`, the oldest evicted first);
    a lookup is a new tensor each time, so a pass that writes into it leaves the kept rows alone,
    and the rows equal a long lookup's (one call for all ids) bit for bit."""
    from specq.weights import embedding as module

    monkeypatch.setattr(module, "CACHED_ROWS", 3)
    raw = random_tensor("Q5_0", np.random.default_rng(1), 8, 64)
    embedding = FileEmbedding(raw, "Q5_0", 64)
    whole = embedding(torch.arange(8).repeat(3))  # 24 ids: past SHORT_LOOKUP, no kept rows
    assert not embedding._rows
    first = embedding(torch.tensor([5]))
    first.add_(1.0)  # as the layer stack updates its input in place
    assert torch.equal(embedding(torch.tensor([5])), whole[5:6])
    for i in (1, 2, 3):
        embedding(torch.tensor([i]))
    assert list(embedding._rows) == [1, 2, 3]  # 5 went first
    assert torch.equal(embedding(torch.tensor([[3, 5], [0, 3]])),
                       whole[[3, 5, 0, 3]].view(2, 2, 64))
