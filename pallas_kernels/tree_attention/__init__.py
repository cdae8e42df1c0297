"""Tree-verification attention: every draft-tree node attends to its request's cached
prefix and to its own ancestors, in one pass.

``tree_attention(q, k_cache, v_cache, lengths, k_tree, v_tree, ancestor_bits)``, or
``tree_attention_packed(qkv, k_cache, v_cache, lengths, ancestor_bits)`` with q, k and v in one array; the
ancestor bitmask layout is specified in ``ancestors.py``, the kernel's layout and
algorithm in ``mosaic_gpu.py``, the benchmark is ``python -m pallas_kernels.tree_attention.bench``.
"""

from pallas_kernels.tree_attention.ancestors import (
    ancestor_bits_to_dense,
    dense_to_ancestor_bits,
    num_words,
    parents_to_ancestor_bits,
)
from pallas_kernels.tree_attention.config import TuningConfig
from pallas_kernels.tree_attention.ops import tree_attention, tree_attention_packed, unpack_heads
from pallas_kernels.tree_attention.reference import tree_attention_reference

__all__ = [
    "TuningConfig",
    "ancestor_bits_to_dense",
    "dense_to_ancestor_bits",
    "num_words",
    "parents_to_ancestor_bits",
    "tree_attention",
    "tree_attention_packed",
    "tree_attention_reference",
    "unpack_heads",
]
