"""specq: lossless speculative decoding with quantized models."""

from .api import Generation, generate
from .core.sampling import SamplingConfig
from .drafters.ngram import NgramDraft
from .errors import SpecqError
from .loading.kinds import load
from .loading.model import Draft, Model
from .loading.pool import ModelPool
from .loading.vocab import check_compatible

__version__ = "0.1.0"
__all__ = ["Draft", "Generation", "Model", "ModelPool", "NgramDraft", "SamplingConfig", "SpecqError", "check_compatible", "generate",
           "load"]
