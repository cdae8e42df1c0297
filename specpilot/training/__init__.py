"""Training the proxy deployment: a Qwen3-architecture target and a DFlash drafter, in JAX, from the Python
standard library's sources (see docs/proxy.md). Modules import JAX lazily where they can: `spec` is read by
the config validator before JAX starts."""
