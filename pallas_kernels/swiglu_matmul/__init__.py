"""The MLP's gate|up projection with its SwiGLU in the matmul's epilogue: ``swiglu_matmul(x, w_gate_up)`` is
``swiglu(x @ w_gate_up)`` in one kernel for few token rows (``weights.linear_swiglu`` calls it for bf16 and W12
leaves; the W12 form is ``w12.mosaic_gpu.w12_swiglu_matmul``, switched by ``ops.W12_FUSED``, on)."""

from pallas_kernels.swiglu_matmul.ops import swiglu_matmul
from pallas_kernels.swiglu_matmul.reference import swiglu_matmul_reference

__all__ = ["swiglu_matmul", "swiglu_matmul_reference"]
