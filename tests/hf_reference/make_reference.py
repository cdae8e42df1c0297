"""Build tiny random Hugging Face checkpoints and the torch reference outputs the parity tests compare to.

Runs under the reference venv (torch + transformers), never under the project venv:

    .venv-ref/bin/python tests/hf_reference/make_reference.py OUT_DIR

For every checkpoint NAME it writes `OUT_DIR/NAME/` (config.json + safetensors, as `save_pretrained`
writes them) and `OUT_DIR/NAME.npz` with:

- prefill_tokens, prefill_positions [B, T]; prefill_logits [B, T, V]; prefill_hidden [L-1, B, T, H]
  (outputs of layers 0..L-2; HF's last hidden state is post-norm, so it is not comparable),
- decode_tokens, decode_positions [B, S]; decode_logits [B, S, V]: one token per step after the prefill,
  at RoPE positions with gaps (the cache slots stay contiguous),
- chunk_tokens, chunk_positions [B, C]; chunk_logits [B, C, V]: then C causal tokens in one step.

`OUT_DIR/manifest.json` lists the checkpoints and, per checkpoint, greedy `generate` prompts and outputs
(eos never produced, every step's top-1/top-2 logit margin recorded so ties cannot make parity flaky).
Deterministic: fixed seeds, float32, single-threaded torch.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.cache_utils import DynamicCache

VOCAB = 300
EOS = VOCAB - 1
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    initializer_range=0.1,
    bos_token_id=0,
    eos_token_id=EOS,
    pad_token_id=0,
)

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small on purpose: with head_dim 16 and theta 5e5, frequency 0 is left alone, 1 is smoothed and the
    # rest are divided by `factor`, so all three branches of the llama3 rule change the test logits.
    "original_max_position_embeddings": 64,
}

CHECKPOINTS = {
    "qwen3_untied": dict(
        cls=Qwen3ForCausalLM, cfg=Qwen3Config, seed=1, num_hidden_layers=3, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    "qwen3_tied": dict(
        cls=Qwen3ForCausalLM, cfg=Qwen3Config, seed=2, num_hidden_layers=2, num_key_value_heads=4,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
    "llama3_scaled": dict(
        cls=LlamaForCausalLM, cfg=LlamaConfig, seed=3, num_hidden_layers=2, num_key_value_heads=1,
        rope_parameters=LLAMA3_ROPE,
    ),
    # Saved with a tiny max_shard_size so it is split over several files with model.safetensors.index.json.
    "llama_sharded": dict(
        cls=LlamaForCausalLM, cfg=LlamaConfig, seed=4, num_hidden_layers=3, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, max_shard_size="200KB",
    ),
}

BATCH, PROMPT_LEN, DECODE_STEPS, CHUNK = 2, 11, 6, 3
GEN_PROMPT_LENS = (5, 9, 16)
MAX_NEW_TOKENS = 24
MIN_GREEDY_MARGIN = 1e-3


def build(spec: dict) -> torch.nn.Module:
    spec = dict(spec)
    cls, cfg_cls, seed = spec.pop("cls"), spec.pop("cfg"), spec.pop("seed")
    spec.pop("max_shard_size", None)
    torch.manual_seed(seed)
    config = cfg_cls(**COMMON, **spec)
    config.architectures = [cls.__name__]
    model = cls(config).to(torch.float32).eval()
    # HF initialises RMSNorm weights to exactly 1, which would hide a norm applied wrongly or not at all.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    return model


def forward(model, tokens, positions, cache, hidden=False):
    # transformers renamed `past_key_values` to `cache` (5.x deprecates the old name).
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        return model(
            input_ids=torch.as_tensor(tokens),
            position_ids=torch.as_tensor(positions),
            use_cache=True,
            output_hidden_states=hidden,
            **{cache_arg: cache},
        )


def reference_steps(model, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Prefill, gapped single-token decode, then a multi-token chunk, all through one DynamicCache."""
    num_layers = model.config.num_hidden_layers
    cache = DynamicCache(config=model.config)
    prefill_tokens = rng.integers(1, EOS, size=(BATCH, PROMPT_LEN))
    prefill_positions = np.broadcast_to(np.arange(PROMPT_LEN), (BATCH, PROMPT_LEN)).copy()
    out = forward(model, prefill_tokens, prefill_positions, cache, hidden=True)
    prefill_logits = out.logits.numpy()
    prefill_hidden = np.stack([out.hidden_states[i + 1].numpy() for i in range(num_layers - 1)])

    # Per-request gaps differ so a position mix-up between requests cannot go unnoticed.
    gaps = rng.integers(1, 12, size=(BATCH, DECODE_STEPS))
    decode_positions = PROMPT_LEN - 1 + np.cumsum(gaps, axis=1)
    decode_tokens = rng.integers(1, EOS, size=(BATCH, DECODE_STEPS))
    decode_logits = []
    for s in range(DECODE_STEPS):
        out = forward(model, decode_tokens[:, s : s + 1], decode_positions[:, s : s + 1], cache)
        decode_logits.append(out.logits[:, 0].numpy())

    # A long jump, so float32 RoPE angles are also checked well past the llama3 original context.
    chunk_start = decode_positions[:, -1:] + 1 + rng.integers(150, 400, size=(BATCH, 1))
    chunk_positions = chunk_start + np.arange(CHUNK)[None, :]
    chunk_tokens = rng.integers(1, EOS, size=(BATCH, CHUNK))
    chunk_logits = forward(model, chunk_tokens, chunk_positions, cache).logits.numpy()
    return dict(
        prefill_tokens=prefill_tokens.astype(np.int32),
        prefill_positions=prefill_positions.astype(np.int32),
        prefill_logits=prefill_logits.astype(np.float32),
        prefill_hidden=prefill_hidden.astype(np.float32),
        decode_tokens=decode_tokens.astype(np.int32),
        decode_positions=decode_positions.astype(np.int32),
        decode_logits=np.stack(decode_logits, axis=1).astype(np.float32),
        chunk_tokens=chunk_tokens.astype(np.int32),
        chunk_positions=chunk_positions.astype(np.int32),
        chunk_logits=chunk_logits.astype(np.float32),
    )


def reference_greedy(model, name: str, rng: np.random.Generator) -> list[dict]:
    cases = []
    for n in GEN_PROMPT_LENS:
        prompt = rng.integers(1, EOS, size=(1, n))
        with torch.no_grad():
            out = model.generate(
                torch.as_tensor(prompt),
                do_sample=False,
                max_new_tokens=MAX_NEW_TOKENS,
                eos_token_id=EOS,
                pad_token_id=0,
                output_scores=True,
                return_dict_in_generate=True,
            )
        new = out.sequences[0, n:].tolist()
        top2 = torch.stack([s[0] for s in out.scores]).topk(2, dim=-1).values
        margin = float((top2[:, 0] - top2[:, 1]).min())
        # The comparison is only meaningful if greedy never hits eos (so any eos policy agrees) and never
        # hinges on a near-tie (so float32 rounding differences cannot flip a token).
        if len(new) != MAX_NEW_TOKENS or EOS in new:
            raise SystemExit(f"{name}: greedy output hit eos for prompt length {n}; change the seed")
        if margin < MIN_GREEDY_MARGIN:
            raise SystemExit(f"{name}: greedy top-2 margin {margin:.2e} is a near-tie; change the seed")
        cases.append({"prompt": prompt[0].tolist(), "new_tokens": new, "min_margin": margin})
    return cases


def main(out_dir: str) -> None:
    transformers.utils.logging.disable_progress_bar()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"max_new_tokens": MAX_NEW_TOKENS, "eos_token_id": EOS, "checkpoints": {}}
    for name, spec in CHECKPOINTS.items():
        model = build(spec)
        save_kw = {"max_shard_size": spec["max_shard_size"]} if "max_shard_size" in spec else {}
        model.save_pretrained(out / name, safe_serialization=True, **save_kw)
        if "max_shard_size" in spec and not (out / name / "model.safetensors.index.json").is_file():
            raise SystemExit(f"{name}: expected a sharded checkpoint, got {sorted(p.name for p in (out / name).iterdir())}")
        rng = np.random.default_rng(spec["seed"])
        np.savez(out / f"{name}.npz", **reference_steps(model, rng))
        logit_std = float(np.load(out / f"{name}.npz")["prefill_logits"].std())
        manifest["checkpoints"][name] = {
            "architecture": type(model).__name__,
            "sharded": "max_shard_size" in spec,
            "tie_word_embeddings": bool(model.config.tie_word_embeddings),
            "num_key_value_heads": model.config.num_key_value_heads,
            "logit_std": logit_std,
            "greedy": reference_greedy(model, name, rng),
        }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_reference.py OUT_DIR")
    main(sys.argv[1])
