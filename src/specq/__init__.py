"""specq: lossless speculative decoding with quantized models."""

from .api import Generation, generate
from .core.gamma import GammaMemory
from .core.sampling import SamplingConfig
from .core.types import Draft, Model
from .drafters.lookahead import LookaheadDraft
from .drafters.ngram import NgramDraft
from .drafters.suffix import SuffixCache
from .errors import SpecqError
from .loading.kinds import load
from .loading.vocab import check_compatible
from .serve.pool import ModelPool
from .version import __version__

__all__ = ["Draft", "GammaMemory", "Generation", "LookaheadDraft", "Model", "ModelPool",
           "NgramDraft", "SamplingConfig", "SpecqError", "SuffixCache", "__version__",
           "check_compatible",
           "generate", "load"]
