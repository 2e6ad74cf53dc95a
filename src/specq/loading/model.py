"""What `load` returns: a `Model`, a network that scores tokens on its own (a target, or the model
a sequence draft runs), with its tokenizer and what the decoding loop needs to know."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn


@dataclass
class Model:
    """A loaded model: the network, its tokenizer, and what the decoding loop needs to know."""

    ref: str
    net: nn.Module  # llama.Llama or hf_backend.HFCausalLM: forward(ids, cache, last_only)
    tokenizer: object
    eos_ids: frozenset[int]
    source: str  # where the weights came from, for reports
    precision: str = "fp32"
    info: dict = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        """The vocabulary the model reads and scores (a feature draft's head covers a subset of it)."""
        return getattr(self.net, "target_vocab_size", None) or self.net.config.vocab_size

    def __repr__(self) -> str:
        return f"Model({self.ref!r}, {self.precision}, from {self.source})"
