"""A gpt-fast-style PyTorch Qwen3 decoder: the peer `scripts/bench_roofline.py` times beside the JAX path.

    python scripts/peer_torch_decode.py --spec SPEC.json --out RESULT.json

Same model as `specpilot.models.target.forward` (Qwen3: fused QKV and gate/up linears, q/k RMSNorm per head,
HF half-rotation RoPE, GQA over a static KV cache, final norm, untied LM head), written the way gpt-fast writes
it: an `nn.Module` whose static KV cache is a pair of buffers written in place with `index_copy_` (so CUDA
graphs can capture the step; `torch._dynamo.mark_static_address` keeps their addresses fixed), and a
one-token `decode_step` that returns the greedy next token. Modes (SPEC "mode"):

- `eager`: plain PyTorch;
- `max-autotune-no-cudagraphs`: `torch.compile(decode_step, mode=..., fullgraph=True)`;
- `reduce-overhead`: the same with CUDA graphs (inductor's cudagraph trees); `cudagraph_skips` in the result
  says when inductor refused to capture (and `cudagraph_skip_reasons` why, on CUDA).

Attention (SPEC model "sdpa_gqa"): `repeat` (default) expands the KV heads with `repeat_interleave` and calls
`scaled_dot_product_attention` with the mask, as gpt-fast does; `native` passes `enable_gqa=True` instead.

Weights: random of the JAX init's scales on the device (SPEC "weights": null), or the JAX pytree exported by
bench_roofline.py (a folder of .npy files, linears stored `[in, out]` as JAX keeps them, bf16 as uint16 bits),
with the KV cache contents too, so the greedy tokens can be compared with the JAX forward's.

Needs only torch and numpy (no jax, no specpilot): it runs under whichever interpreter has torch
(`bench_roofline.py --torch-python`). The step is timed per token, synchronised: CUDA events around each step
on a GPU (median), wall clock on a CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np


def _torch():
    import torch

    return torch


# ---- the model -----------------------------------------------------------------------------------------

def build_model_classes():
    """The module classes (defined lazily so `--help` and the spec parsing need no torch)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, dim: int, eps: float):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):  # normalise in float32, scale in the activation dtype (as the JAX model does)
            x32 = x.float()
            y = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
            return self.weight * y

    class KVCache(nn.Module):
        def __init__(self, batch: int, capacity: int, kv_heads: int, head_dim: int, dtype):
            super().__init__()
            shape = (batch, kv_heads, capacity, head_dim)
            self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype), persistent=False)
            self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype), persistent=False)

        def update(self, input_pos, k, v):  # k, v: [B, Hkv, T, D]; input_pos: [T]
            self.k_cache.index_copy_(2, input_pos, k)
            self.v_cache.index_copy_(2, input_pos, v)
            return self.k_cache, self.v_cache

    class Attention(nn.Module):
        def __init__(self, c: dict):
            super().__init__()
            self.c = c
            self.native_gqa = c.get("sdpa_gqa", "repeat") == "native"
            self.q_size, self.kv_size = c["num_heads"] * c["head_dim"], c["num_kv_heads"] * c["head_dim"]
            self.wqkv = nn.Linear(c["hidden_size"], self.q_size + 2 * self.kv_size, bias=False)
            self.wo = nn.Linear(self.q_size, c["hidden_size"], bias=False)
            self.q_norm = RMSNorm(c["head_dim"], c["rms_norm_eps"]) if c["qk_norm"] else None
            self.k_norm = RMSNorm(c["head_dim"], c["rms_norm_eps"]) if c["qk_norm"] else None
            self.kv_cache = None

        def forward(self, x, cos, sin, mask, input_pos):
            b, t, _ = x.shape
            c = self.c
            q, k, v = self.wqkv(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.view(b, t, c["num_heads"], c["head_dim"])
            k = k.view(b, t, c["num_kv_heads"], c["head_dim"])
            v = v.view(b, t, c["num_kv_heads"], c["head_dim"])
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            q, k, v = (a.transpose(1, 2) for a in (q, k, v))  # [B, H, T, D]
            k, v = self.kv_cache.update(input_pos, k, v)
            if self.native_gqa:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            else:  # gpt-fast: expand the KV heads, then SDPA with the mask (its fused kernels take no GQA)
                rep = c["num_heads"] // c["num_kv_heads"]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.wo(y.transpose(1, 2).reshape(b, t, self.q_size))

    class FeedForward(nn.Module):
        def __init__(self, c: dict):
            super().__init__()
            self.inter = c["intermediate_size"]
            self.w13 = nn.Linear(c["hidden_size"], 2 * self.inter, bias=False)  # [gate | up], as the JAX leaf
            self.w2 = nn.Linear(self.inter, c["hidden_size"], bias=False)

        def forward(self, x):
            gate, up = self.w13(x).split([self.inter, self.inter], dim=-1)
            return self.w2(F.silu(gate) * up)

    class Block(nn.Module):
        def __init__(self, c: dict):
            super().__init__()
            self.attention = Attention(c)
            self.feed_forward = FeedForward(c)
            self.attention_norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
            self.ffn_norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

        def forward(self, x, cos, sin, mask, input_pos):
            x = x + self.attention(self.attention_norm(x), cos, sin, mask, input_pos)
            return x + self.feed_forward(self.ffn_norm(x))

    class Transformer(nn.Module):
        def __init__(self, c: dict):
            super().__init__()
            self.c = c
            self.tok_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"])
            self.layers = nn.ModuleList(Block(c) for _ in range(c["num_layers"]))
            self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
            self.output = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

        def setup_caches(self, batch: int, capacity: int, dtype, device):
            c = self.c
            for blk in self.layers:
                blk.attention.kv_cache = KVCache(batch, capacity, c["num_kv_heads"], c["head_dim"], dtype).to(device)
            half = c["head_dim"] // 2
            inv = 1.0 / (c["rope_theta"] ** (np.arange(0, c["head_dim"], 2, dtype=np.float64) / c["head_dim"]))
            self.register_buffer("inv_freq", torch.tensor(inv.astype(np.float32), device=device), persistent=False)
            self.register_buffer("causal_mask", torch.tril(torch.ones(capacity, capacity, dtype=torch.bool,
                                                                      device=device)), persistent=False)
            assert half * 2 == c["head_dim"]

        def forward(self, idx, input_pos):  # idx [B, T] int64, input_pos [T] int64 → logits [B, T, V]
            ang = input_pos.float()[:, None] * self.inv_freq[None, :]
            ang = torch.cat([ang, ang], dim=-1)  # [T, D]
            cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
            mask = self.causal_mask[None, None, input_pos]  # [1, 1, T, S]: the prefix and the token itself
            x = self.tok_embeddings(idx)
            for blk in self.layers:
                x = blk(x, cos, sin, mask, input_pos)
            return self.output(self.norm(x))

    def apply_rope(x, cos, sin):  # x [B, T, H, D]; rotate in float32, as the JAX model does
        half = x.shape[-1] // 2
        x32 = x.float()
        rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
        return (x32 * cos + rotated * sin).to(x.dtype)

    return Transformer


def decode_step(model, tok, input_pos):
    """One token through the model; the greedy next token [B, 1] (argmax of the logits in the model dtype, as
    the JAX forward's float32 cast of bf16 logits; ties go to the first index in both)."""
    logits = model(tok, input_pos)
    return logits[:, -1].argmax(dim=-1, keepdim=True)


# ---- weights -------------------------------------------------------------------------------------------

def _load_exported(folder: Path, name: str, dtype):
    torch = _torch()
    meta = json.loads((folder / "meta.json").read_text())["arrays"][name]
    arr = np.load(folder / meta["file"])
    if meta["dtype"] == "bfloat16":  # stored as raw uint16 bits
        return torch.from_numpy(np.ascontiguousarray(arr).view(np.int16)).view(torch.bfloat16).to(dtype)
    return torch.from_numpy(np.ascontiguousarray(arr)).to(dtype)


def load_weights(model, c: dict, folder: Path, dtype, device) -> dict:
    """Copy the exported JAX pytree into the module (linears transposed to torch's [out, in]); returns the
    exported cache state {k, v: [L, B, Hkv, S, D], lengths: [B]}."""
    torch = _torch()

    def get(name, transpose=False):
        t = _load_exported(folder, name, dtype)
        return (t.t() if transpose else t).contiguous().to(device)

    with torch.no_grad():
        model.tok_embeddings.weight.copy_(get("embed"))
        model.norm.weight.copy_(get("final_norm"))
        model.output.weight.copy_(get("lm_head", transpose=True))
        for i, blk in enumerate(model.layers):
            p = f"layers.{i}."
            blk.attention_norm.weight.copy_(get(p + "attn_norm"))
            blk.ffn_norm.weight.copy_(get(p + "mlp_norm"))
            blk.attention.wqkv.weight.copy_(get(p + "w_qkv", transpose=True))
            blk.attention.wo.weight.copy_(get(p + "w_o", transpose=True))
            blk.feed_forward.w13.weight.copy_(get(p + "w_gate_up", transpose=True))
            blk.feed_forward.w2.weight.copy_(get(p + "w_down", transpose=True))
            if c["qk_norm"]:
                blk.attention.q_norm.weight.copy_(get(p + "q_norm"))
                blk.attention.k_norm.weight.copy_(get(p + "k_norm"))
    k = _load_exported(folder, "cache_k", dtype).permute(0, 1, 3, 2, 4)  # JAX [L, B, S, Hkv, D] → [L, B, Hkv, S, D]
    v = _load_exported(folder, "cache_v", dtype).permute(0, 1, 3, 2, 4)
    lengths = np.load(folder / "cache_lengths.npy")
    return {"k": k, "v": v, "lengths": lengths, "start_token": int(np.load(folder / "start_token.npy"))}


def init_random(model, c: dict, seed: int):
    """Random values at the JAX init's scales (norms 1 + 0.1·N, linears N / sqrt(fan_in), embedding 0.02·N),
    generated on the device: the step's time does not depend on which random values they are."""
    torch = _torch()
    g = torch.Generator(device=model.output.weight.device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype))
            elif name.startswith("tok_embeddings"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype))
            else:  # torch Linear weight [out, in]
                p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype) * p.shape[1] ** -0.5)


# ---- measuring -----------------------------------------------------------------------------------------

def run(spec: dict) -> dict:
    torch = _torch()
    c = spec["model"]
    if c.get("rope_kind", "default") != "default":
        raise NotImplementedError(f"peer: rope {c['rope_kind']!r} (default RoPE only)")
    device = torch.device(spec.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[spec["dtype"]]
    torch.manual_seed(spec.get("seed", 0))
    t0 = time.perf_counter()
    Transformer = build_model_classes()
    with torch.device("meta"):  # no host-side init of billions of parameters
        model = Transformer(c).to(dtype)
    model = model.to_empty(device=device)
    model.setup_caches(1, spec["capacity"], dtype, device)
    caches = [blk.attention.kv_cache for blk in model.layers]
    state = None
    if spec.get("weights"):
        state = load_weights(model, c, Path(spec["weights"]), dtype, device)
        with torch.no_grad():
            for i, kv in enumerate(caches):
                kv.k_cache.copy_(state["k"][i].to(device))
                kv.v_cache.copy_(state["v"][i].to(device))
        context, start = int(state["lengths"][0]), state["start_token"]
    else:
        init_random(model, c, spec.get("seed", 0))
        g = torch.Generator(device=device).manual_seed(spec.get("seed", 0) + 1)
        with torch.no_grad():
            for kv in caches:  # never time on zeros
                kv.k_cache.copy_(torch.randn(kv.k_cache.shape, generator=g, device=device, dtype=dtype))
                kv.v_cache.copy_(torch.randn(kv.v_cache.shape, generator=g, device=device, dtype=dtype))
        context, start = spec["context"], spec.get("start_token", 1)
    if device.type == "cuda":
        for kv in caches:  # fixed addresses: the cudagraph trees then capture the in-place cache writes
            torch._dynamo.mark_static_address(kv.k_cache)
            torch._dynamo.mark_static_address(kv.v_cache)
    setup_s = time.perf_counter() - t0

    mode = spec["mode"]
    step = decode_step
    skip_reasons = []
    if mode != "eager":
        import logging

        import torch._dynamo.utils as dyn_utils

        class Grab(logging.Handler):  # inductor's "skipping cudagraphs due to ..." (logged on CUDA only)
            def emit(self, record):
                skip_reasons.append(record.getMessage()[:300])

        for name in ("torch._inductor.cudagraph_utils.__cudagraphs", "torch._inductor.cudagraph_utils"):
            lg = logging.getLogger(name)
            lg.addHandler(Grab(level=logging.WARNING))
            lg.setLevel(min(lg.level or logging.WARNING, logging.WARNING))
        dyn_utils.counters.clear()
        if spec.get("coordinate_descent"):  # gpt-fast turns it on: tunes the generated kernels, compiles longer
            import torch._inductor.config as inductor_config

            inductor_config.coordinate_descent_tuning = True
        kw = {"backend": spec["compile_backend"]} if spec.get("compile_backend") else {"mode": mode}
        step = torch.compile(decode_step, fullgraph=True, **kw)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def one(tok, pos):
        with torch.no_grad():
            return step(model, tok, pos).clone()  # clone: a cudagraph's output is overwritten by the next replay

    # greedy check from the exported (or random) state; the first calls also compile / record graphs
    t0 = time.perf_counter()
    tok = torch.tensor([[start]], dtype=torch.int64, device=device)
    tokens = []
    for i in range(spec["check_steps"]):
        tok = one(tok, torch.tensor([context + i], dtype=torch.int64, device=device))
        tokens.append(int(tok[0, 0]))
    sync()
    first_s = time.perf_counter() - t0
    pos = torch.tensor([context + spec["check_steps"]], dtype=torch.int64, device=device)
    for _ in range(spec["warmup"]):
        tok = one(tok, pos)
    sync()
    ms, host_ms = [], []
    if device.type == "cuda":
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(spec["iters"]):
        h0 = time.perf_counter()
        if device.type == "cuda":
            start_ev.record()
            tok = one(tok, pos)
            end_ev.record()
            end_ev.synchronize()
            ms.append(start_ev.elapsed_time(end_ev))
        else:
            tok = one(tok, pos)
        host_ms.append(1e3 * (time.perf_counter() - h0))
    ms = ms or host_ms
    out = {
        "ms": statistics.median(ms),
        "ms_p10": float(np.percentile(ms, 10)),
        "ms_p90": float(np.percentile(ms, 90)),
        "host_ms": statistics.median(host_ms),
        "n": len(ms),
        "tokens": tokens,
        "timer": "cuda events" if device.type == "cuda" else "wall clock",
        "setup_s": setup_s,
        "first_steps_s": first_s,
        "weights": "exported from the JAX pytree" if spec.get("weights") else "random (torch)",
        "mode": mode,
        "sdpa_gqa": c.get("sdpa_gqa", "repeat"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    if mode != "eager":
        import torch._dynamo.utils as dyn_utils

        skips = dict(dyn_utils.counters.get("inductor", {}))
        out["cudagraph_skips"] = int(skips.get("cudagraph_skips", 0))
        out["cudagraph_skip_reasons"] = sorted(set(skip_reasons))
        if spec.get("compile_backend"):
            out["compile_backend"] = spec["compile_backend"]
        out["coordinate_descent"] = bool(spec.get("coordinate_descent"))
    if device.type == "cuda":
        out["max_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="JSON spec (written by scripts/bench_roofline.py)")
    ap.add_argument("--out", required=True, help="result JSON")
    args = ap.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    try:
        res = run(spec)
    except Exception as e:  # the harness reports it and moves on
        res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "traceback"}), flush=True)
    return 0 if "error" not in res else 1


if __name__ == "__main__":
    sys.exit(main())
