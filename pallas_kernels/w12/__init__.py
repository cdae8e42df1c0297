"""W12: lossless 12-bit bf16 weights and the matmul that reads them.

``pack`` (host, once) -> ``W12Array`` pytree -> ``matmul(x, packed)`` in the model.
The layout is specified in ``format.py``.
"""

from pallas_kernels.w12.config import TuningConfig
from pallas_kernels.w12.format import W12Array, bits_per_weight, pack, unpack
from pallas_kernels.w12.ops import matmul
from pallas_kernels.w12.reference import w12_matmul_reference

__all__ = [
    "TuningConfig",
    "W12Array",
    "bits_per_weight",
    "matmul",
    "pack",
    "unpack",
    "w12_matmul_reference",
]
