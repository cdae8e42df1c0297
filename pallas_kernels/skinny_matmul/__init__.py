"""A bf16 matmul for few token rows (decode, verify) that streams the weight at HBM bandwidth: the W12
kernel's bf16 sibling. ``matmul(x, w)`` is the entry point; ``weights.linear`` calls it for bf16 leaves."""

from pallas_kernels.skinny_matmul.config import TuningConfig
from pallas_kernels.skinny_matmul.ops import matmul
from pallas_kernels.skinny_matmul.reference import skinny_matmul_reference

__all__ = ["TuningConfig", "matmul", "skinny_matmul_reference"]
