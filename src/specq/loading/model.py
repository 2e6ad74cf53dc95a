"""What `load` returns: a `Model`, a network that scores tokens on its own (a target, or the model
a sequence draft runs), or a `Draft` of a kind that only drafts (`kinds.py`): the two are different
types, so a draft is never taken for a target."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from .. import backends
from ..backends.runner import Runner
from ..core.gamma import GammaMemory


@dataclass
class Model:
    """A loaded model: the network, its tokenizer, and what the decoding loop needs to know."""

    ref: str
    net: nn.Module  # llama.Llama or hf_backend.HFCausalLM: the torch modules, as loaded (never changed)
    tokenizer: object
    eos_ids: frozenset[int]
    source: str  # where the weights came from, for reports
    precision: str = "fp32"
    info: dict = field(default_factory=dict)
    gamma_memory: GammaMemory = field(default_factory=GammaMemory, repr=False, compare=False)  # gamma auto's, across runs
    runner: Runner | None = field(default=None, repr=False, compare=False)  # what runs `net` (default: torch's ops)

    def __post_init__(self):
        if self.runner is None and self.net is not None:
            self.runner = backends.runner(self.net, "eager")

    @property
    def vocab_size(self) -> int:
        """The vocabulary the model reads and scores (a feature draft's head covers a subset of it)."""
        return getattr(self.net, "target_vocab_size", None) or self.net.config.vocab_size

    def __repr__(self) -> str:
        return f"Model({self.ref!r}, {self.precision}, from {self.source})"


@dataclass(frozen=True, eq=False)
class Kind:
    """A kind of draft: how a ref or a folder names it, and what each part of specq does with one.
    The entries are `kinds.KINDS`; each callable lives beside the code it runs."""

    name: str
    about: str  # one line: what it is, for errors and listings
    recognizes: Callable[[str], bool]  # a draft ref (its text, or the folder it names) is of this kind
    load: Callable[..., object]  # (ref, backend, target) -> the loaded draft
    drafter: Callable[..., object]  # (draft, target, min_confidence, tree, gamma) -> a `Drafter`
    rows: Callable | None = None  # (runner, ids [n], cache): the draft's network alone on n rows (timing)
    next_token_logits: Callable | None = None  # (target runner, draft runner, ids [n]) -> (target, draft logits, next ids)
    write: Callable | None = None  # (draft, folder, info): save it in its own format
    verifies: bool = False  # scores tokens on its own: it can be an intermediate level of a hierarchy
    transformers: bool = False  # transformers' assisted generation can run it (the bench's peer baseline)
    is_model: bool = False  # one loads as a plain `Model` (it can be a target too)


@dataclass(eq=False)
class Draft:
    """A loaded draft of a kind that cannot be a target (a feature draft, `self@SPEC`): its kind
    and the model it runs. A sequence draft is a plain `Model` (any model can draft)."""

    kind: Kind
    model: Model

    ref = property(lambda self: self.model.ref)
    net = property(lambda self: self.model.net)
    runner = property(lambda self: self.model.runner, lambda self, run: setattr(self.model, "runner", run))
    tokenizer = property(lambda self: self.model.tokenizer)
    eos_ids = property(lambda self: self.model.eos_ids)
    source = property(lambda self: self.model.source)
    precision = property(lambda self: self.model.precision)
    info = property(lambda self: self.model.info)
    vocab_size = property(lambda self: self.model.vocab_size)

    def __repr__(self) -> str:
        return f"Draft({self.kind.name}, {self.model!r})"
