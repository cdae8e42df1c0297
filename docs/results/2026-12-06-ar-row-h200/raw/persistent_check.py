import numpy as np, jax, jax.numpy as jnp
from pallas_kernels.skinny_matmul import mosaic_gpu as sk
from pallas_kernels import skinny_matmul
Config = skinny_matmul.TuningConfig
for (m, k, n) in [(65, 4096, 4096), (1, 4096, 12288)]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(m, k)), jnp.bfloat16); w = jnp.asarray(rng.normal(size=(k, n)) * 0.02, jnp.bfloat16)
    outs = {}
    for p in (False, True):
        f = jax.jit(lambda x, w, p=p: sk.skinny_matmul(x, w, config=Config(persistent=p), reduce=False).halves)
        outs[p] = np.asarray(f(x, w)).view(np.uint16)
    a, b = outs[False], outs[True]
    print(m, k, n, "shape", a.shape, "equal", (a == b).all(), "frac diff", (a != b).mean())
    S, H, R, N = a.shape
    bad = (a != b).any(axis=(1, 2)).reshape(S, N // 64, 64).any(-1)
    print(" bad (split, channel block) tiles:", bad.sum(), "of", bad.size, "first", np.argwhere(bad)[:8].tolist())
    rows = (a != b).any(axis=(0, 1, 3)); print(" bad rows", np.nonzero(rows)[0][:20].tolist(), "of", R)
    ref = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
    for p in (False, True):
        hi = outs[p][:, 0].astype(np.uint32) << 16; lo = outs[p][:, 1].astype(np.uint32) if H == 2 else 0
        y = (hi | lo).view(np.float32).sum(0)[:m] if H == 2 else outs[p][0, 0].astype(np.uint32).__lshift__(16).view(np.float32)[:m]
        print(" persistent" if p else " grid", "max err vs f32", float(np.abs(y - ref).max()), "ref max", float(np.abs(ref).max()))
