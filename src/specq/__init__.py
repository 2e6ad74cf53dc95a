"""specq: lossless speculative decoding with quantized models."""

from .api import Generation, generate
from .errors import SpecqError
from .models import Model, check_compatible, load
from .sampling import SamplingConfig

__version__ = "0.1.0"
__all__ = ["Generation", "Model", "SamplingConfig", "SpecqError", "check_compatible", "generate", "load"]
