"""The MLP's SwiGLU activation of a fused gate|up projection: ``swiglu(gate_up)`` returns ``silu(gate) * up`` in f32,
rounded once. ``specpilot.models.target`` and the DFlash drafter call it between their gate|up and down projections."""

from pallas_kernels.swiglu.ops import swiglu
from pallas_kernels.swiglu.reference import swiglu_reference

__all__ = ["swiglu", "swiglu_reference"]
