"""How each trainable kind of draft (`loading.kinds`) is trained: the student it starts from (a
new one of a named shape, or a loaded draft), its forward on a batch of teacher data, and the
network it ends as. `train.py` and `calibrate.py` look the kind up here instead of asking what a
draft is."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..core.types import Kind
from ..errors import SpecqError
from ..loading import precision
from ..loading.kinds import KINDS
from ..model.feature_draft import frequent_tokens, new_feature_draft, restrict_head
from ..model.llama import Llama, LlamaConfig
from . import lora
from .distill import feature_forward, init_draft, sequence_forward, to_native

# Named draft shapes on the SmolLM2 vocabulary; "LxH" (e.g. 4x192) gives L layers of width H.
# "feature" (or "feature:L") is a feature draft (`feature_draft.py`) of L decoder layers.
ARCHITECTURES = {"small": (6, 256), "tiny": (2, 64)}
MAX_LAYERS, MAX_WIDTH = 64, 8192  # a draft far larger than any target specq runs would never pay
FEATURE = "feature"
NEW_HEAD_VOCAB = 16384  # a new feature draft's head: its most frequent tokens in the training data


@dataclass(frozen=True)
class Student:
    # (student, data, rows) -> (divergences, extra loss), as `distill.distill` takes it
    forward: Callable
    reads_features: bool  # its teacher data holds the target's hidden states
    head_vocab: bool  # --head-vocab applies (its head covers a vocabulary subset)
    new: Callable  # (target, train, settings, arch) -> a new student
    # (base draft, head_vocab or None): it can be trained from (before any teacher data)
    check_base: Callable
    from_base: Callable  # (base draft, target, train, head_vocab or None) -> a student
    # (trained student, dtype) -> the draft's network
    finish: Callable[[nn.Module, object], nn.Module]


def feature_layers(name: str) -> int | None:
    """Decoder layers of a feature-draft architecture name ('feature', 'feature:L'); None for
    the names of classic drafts."""
    kind, _, layers = name.partition(":")
    if kind != FEATURE:
        return None
    if not layers:
        return 1
    if not layers.isdigit() or not 1 <= int(layers) <= MAX_LAYERS:
        raise SpecqError(f"--arch feature:L needs 1 to {MAX_LAYERS} layers, got '{name}'")
    return int(layers)


def architecture(name: str, vocab_size: int) -> LlamaConfig:
    """A draft config from a name in ARCHITECTURES or 'LxH'."""
    layers_width = ARCHITECTURES.get(name)
    if layers_width is None:
        try:
            layers_width = tuple(int(x) for x in name.lower().split("x"))
        except ValueError:
            layers_width = ()
    if (len(layers_width) != 2 or min(layers_width) < 1 or layers_width[1] % 32
        or layers_width[0] > MAX_LAYERS
        or layers_width[1] > MAX_WIDTH):
        raise SpecqError(f"--arch must be one of {sorted(ARCHITECTURES)}, LAYERSxWIDTH with LAYERS "
                         f"<= {MAX_LAYERS} and WIDTH a multiple of 32 up to {MAX_WIDTH} (e.g. "
                         f"4x192), or feature[:LAYERS], got '{name}'")
    layers, width = layers_width
    return LlamaConfig(vocab_size=vocab_size, hidden_size=width, intermediate_size=3 * width,
                       num_layers=layers, num_heads=max(1, width // 64),
                       num_kv_heads=max(1, width // 128), head_dim=min(64, width),
                       rope_theta=100000.0, max_position_embeddings=8192)


def check_arch(arch: str) -> None:
    """A new draft's shape name is valid (checked before any model loads)."""
    if feature_layers(arch) is None:
        architecture(arch, 1)


def arch_kind(arch: str) -> Kind:
    """The kind of draft a new one of shape `arch` is."""
    return KINDS[FEATURE if feature_layers(arch) is not None else "sequence"]


def _new_sequence(target, train, settings, arch: str):
    embedding = target.net.tok_embeddings.weight if hasattr(target.net, "tok_embeddings") else None
    return init_draft(architecture(arch, target.vocab_size), seed=settings.seed,
                      target_embedding=None if embedding is None else embedding.detach().float())


def _check_sequence_base(base, head_vocab: int | None) -> None:
    if not (Path(base.source) / "config.json").is_file():
        raise SpecqError(f"draft '{base.ref}' must be a local model directory to train from")


def _sequence_from(base, target, train, head_vocab: int | None):
    """A model draft trains as the transformers model of its local folder."""
    return init_draft(None, from_dir=base.source)


def _new_feature(target, train, settings, arch: str):
    head = frequent_tokens(train.ids, settings.head_vocab or NEW_HEAD_VOCAB, target.vocab_size,
                           target.eos_ids)
    return new_feature_draft(target.net, head, feature_layers(arch), seed=settings.seed)


def _check_feature_base(base, head_vocab: int | None) -> None:
    if (head_vocab or 0) > base.net.config.vocab_size:
        raise SpecqError(f"--head-vocab {head_vocab} is more than the {base.net.config.vocab_size} "
                         f"tokens of the head of '{base.ref}' (a base's head can only be narrowed)")


def _feature_from(base, target, train, head_vocab: int | None):
    """A feature draft trains on a plain copy of its network, bound to this target; its
    head may be narrowed."""
    student = copy.deepcopy(base.net).float().attach(target.net)  # the loaded draft stays as it is
    if head_vocab is not None:
        student = restrict_head(student, frequent_tokens(train.ids, head_vocab, target.vocab_size,
                                                         target.eos_ids, within=student.vocab_ids))
    return student.train()


STUDENTS = {
    "sequence": Student(sequence_forward, reads_features=False, head_vocab=False, new=_new_sequence,
                        check_base=_check_sequence_base, from_base=_sequence_from,
                        finish=to_native),
    FEATURE: Student(feature_forward, reads_features=True, head_vocab=True, new=_new_feature,
                     check_base=_check_feature_base, from_base=_feature_from,
                     finish=lambda student, dtype: student.to(dtype).eval()),
}


def _check_lora_base(base, head_vocab: int | None) -> None:
    if not isinstance(base.net, Llama) or not precision.is_float(base.precision):
        raise SpecqError("--lora trains on the float weights of a model specq runs natively; "
                         f"'{base.ref}' is not one (give --from without @, or @fp32)")


# A LoRA adapter on a base model (`lora.py`), whatever the base's kind: `train.run` builds it from
# the rank (no `new` / `from_base`) and saves the adapter alone (no `finish`); it trains
# like a sequence draft.
LORA = Student(lora.forward, reads_features=False, head_vocab=False, new=None,
               check_base=_check_lora_base, from_base=None, finish=None)


def of(kind: Kind) -> Student:
    """How a kind of draft trains; one line for a kind that does not."""
    if kind.name not in STUDENTS:
        raise SpecqError(f"{kind.about} is not trained: distil or calibrate a "
                         f"{' or '.join(STUDENTS)} draft")
    return STUDENTS[kind.name]
