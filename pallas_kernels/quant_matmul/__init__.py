"""Weight-only int8 (and fp8) matmul: ``x @ (q * scale)`` for TLV's level-1 weights.

``specpilot.models.weights.quantize`` (once) -> ``QuantArray`` -> ``matmul(x, qa)`` in the model.
``ops.py`` says which implementation runs when.
"""

from pallas_kernels.quant_matmul.config import TuningConfig
from pallas_kernels.quant_matmul.ops import matmul
from pallas_kernels.quant_matmul.reference import quant_matmul_reference

__all__ = ["TuningConfig", "matmul", "quant_matmul_reference"]
