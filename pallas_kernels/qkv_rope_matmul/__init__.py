"""The q|k|v projection with Qwen3's q/k norm and the rope in the matmul's epilogue: ``qkv_rope_matmul(x, w_qkv,
q_norm, k_norm, cos, sin, ...)`` is ``qk_norm_rope(x @ w_qkv, ...)`` in one kernel for a decode step's few token rows
(``weights.linear_qk_norm_rope`` calls it for bf16 leaves)."""

from pallas_kernels.qkv_rope_matmul.ops import qkv_rope_matmul
from pallas_kernels.qkv_rope_matmul.reference import qkv_rope_matmul_reference

__all__ = ["qkv_rope_matmul", "qkv_rope_matmul_reference"]
