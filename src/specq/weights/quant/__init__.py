"""Weight quantization for specq: spec strings, RTN/GPTQ/AWQ, packed CPU execution, checkpoints.

    spec = parse_spec("int4-g128-gptq")
    samples = calibration_samples(token_id_tensors, n_samples=32, seq_len=512)
    quantize_model(model, spec, calibration=samples)           # in place; packed kernels
    save_quantized(model, spec, "ckpt/smollm2-135m@int4-g128-gptq")
    load_quantized(skeleton, "ckpt/smollm2-135m@int4-g128-gptq")  # identical logits
    weight_bytes(model)                                         # WeightBytes(stored, executed)

The specs: docs/reference.md, "Precisions"; the design choices: docs/quantization.md at 4a89039.
"""

from .apply import WeightBytes, quant_targets, quantize_model, quantized_layers, weight_bytes
from .calibration import calibration_samples
from .checkpoint import load_quantized, read_spec, save_quantized
from .modules import DequantizedLinear, Int4Linear, Int8Linear, QuantLinear, make_quant_linear
from .pack import pack_bits, unpack_bits
from .rtn import QuantizedWeight, quantize_rtn
from .sequential import CalibrationConfig
from .spec import QuantSpec, parse_spec

__all__ = [
    "CalibrationConfig", "DequantizedLinear", "Int4Linear", "Int8Linear", "QuantLinear",
    "QuantSpec", "QuantizedWeight", "WeightBytes", "calibration_samples", "load_quantized",
    "make_quant_linear", "pack_bits", "parse_spec", "quant_targets", "quantize_model",
    "quantize_rtn", "quantized_layers", "read_spec", "save_quantized", "unpack_bits",
    "weight_bytes",
]
