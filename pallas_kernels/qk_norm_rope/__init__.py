"""Qwen3's per-head q/k RMSNorm and the rotary embedding of a fused q|k|v projection, as one kernel:
``qk_norm_rope(qkv, q_norm, k_norm, cos, sin, num_kv_heads=..., eps=...)`` returns the heads ``[B, T, Hq + 2 Hkv, D]``
(or ``(q, k, v)`` with ``split=True``). ``specpilot.models.target`` and ``dflash`` call it after every q|k|v
projection."""

from pallas_kernels.qk_norm_rope.ops import qk_norm_rope
from pallas_kernels.qk_norm_rope.reference import apply_rope, qk_norm_rope_reference

__all__ = ["apply_rope", "qk_norm_rope", "qk_norm_rope_reference"]
