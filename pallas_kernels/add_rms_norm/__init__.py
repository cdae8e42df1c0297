"""The residual add and the RMSNorm after it as one kernel: ``add_rms_norm(x, delta, w, eps)`` returns
``(x + delta, rms_norm(x + delta) * w)``. ``specpilot.models.target`` and the DFlash drafter
(``specpilot.models.dflash``) call it at every residual add."""

from pallas_kernels.add_rms_norm.ops import add_rms_norm
from pallas_kernels.add_rms_norm.reference import add_rms_norm_reference

__all__ = ["add_rms_norm", "add_rms_norm_reference"]
