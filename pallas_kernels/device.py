"""What the kernels need to know about the device they would run on."""

from __future__ import annotations

import jax


def on_hopper() -> bool:
    """True on an H100/H200 (compute capability 9.0): where the Mosaic GPU kernels here compile."""
    device = jax.devices()[0]
    return device.platform == "gpu" and getattr(device, "compute_capability", "") == "9.0"
