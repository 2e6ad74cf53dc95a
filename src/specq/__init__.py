"""specq: lossless speculative decoding with quantized models."""

from .api import Generation, generate
from .drafters.ngram import NgramDraft
from .errors import SpecqError
from .models import Model, check_compatible, load
from .pool import ModelPool
from .sampling import SamplingConfig

__version__ = "0.1.0"
__all__ = ["Generation", "Model", "ModelPool", "NgramDraft", "SamplingConfig", "SpecqError", "check_compatible", "generate",
           "load"]
