"""Commit 854cbfd's W12 kernel (its own tree, this folder): the warp-specialised form (128-channel blocks, two compute
warpgroups sharing each activation tile, a TMA warpgroup) against its one-warpgroup form at 16 and 64 token rows,
weights beyond L2, beside XLA's bf16 dot, one process a shape. Not committed: a one-off check of the runbook's
untimed lever."""
import statistics, sys
import jax, jax.numpy as jnp, numpy as np
from jax.experimental.mosaic.gpu import profiler
from pallas_kernels import skinny_matmul, w12
from pallas_kernels.w12 import mosaic_gpu
from pallas_kernels.w12.config import parse_fields

k, n, copies = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ms = [int(v) for v in sys.argv[4].split(",")]
configs = sys.argv[5:]
rng = np.random.default_rng(0)
w = (rng.normal(0, 0.02, (k, n)) * np.exp(rng.uniform(-1.4, 1.4, n))).astype(jnp.bfloat16)
packed = jax.device_put(w12.pack(w))
ps = [packed] + [jax.tree.map(jnp.copy, packed) for _ in range(copies - 1)]
wb = [jnp.asarray(w) for _ in range(copies)]
print(f"K x N {k}x{n}, escapes {packed.num_escapes}, {copies} copies", flush=True)
for m in ms:
  x = jnp.asarray(rng.normal(size=(m, k)), jnp.bfloat16)
  ref = w12.matmul(x, packed, implementation="reference").astype(jnp.float32)
  runs = [(t, jax.jit(lambda x, ps, c=w12.TuningConfig(**parse_fields(t)): [mosaic_gpu.w12_matmul(x, p, config=c) for p in ps]), ps)
          for t in configs]
  runs += [("bf16 xla", jax.jit(lambda x, ws: [skinny_matmul.matmul(x, w, implementation="xla") for w in ws]), wb),
           ("bf16 skinny", jax.jit(lambda x, ws: [skinny_matmul.matmul(x, w, implementation="mosaic_gpu") for w in ws]), wb)]
  for t, fn, weights in runs:
    try:
      y = fn(x, weights)[0].astype(jnp.float32)
      err = float(jnp.abs(y - ref).max() / jnp.abs(ref).max())
      _, timed = profiler.measure(fn, aggregate=False, iterations=9)(x, weights)
    except Exception as e:  # a form that does not compile: say so, go on
      print(f"M={m} {t}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
      continue
    per = {}
    for run in timed:
      for name, v in run:
        per.setdefault(name, []).append(v * 1e3)
    total = sum(statistics.median(v) * len(v) for v in per.values()) / (len(timed) * len(weights))
    print(f"M={m} {t}: rel err {err:.1e}, {total:.1f} us a call = "
          + " + ".join(f"{nm[:30]} {statistics.median(v):.1f}" for nm, v in per.items()), flush=True)
