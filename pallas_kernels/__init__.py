"""Pallas kernels for SpecPilot-JAX, one folder per op.

Each op has a pure-jnp reference (also the CPU fallback), one file per backend and
a frozen ``TuningConfig``. Subpackages are imported on use, so importing this package
does not pull in Pallas.
"""
