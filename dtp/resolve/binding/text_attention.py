"""Head bookkeeping for transformers' attention modules (text encoders), which have no diffusers `heads`.

transformers reshapes q/k/v with `view(..., -1, head_dim)` and the attention output with
`reshape(..., -1)`, so after q/k/v are split colwise each rank computes its local heads without any
rewrite of the shapes: Llama, Qwen2/2.5/3, Gemma2, GLM, Mistral and CLIP read only `head_dim` (per
head, unchanged) and `num_key_value_groups` (q heads per kv head, for `repeat_kv` / sdpa's
`enable_gqa`). The counts a few classes keep are rewritten to their local values: T5/UMT5's
`n_heads` and `inner_dim` (used for a zero position bias and a reshape), Qwen2.5-VL's `num_heads`
and `num_key_value_heads`, and every `num_key_value_groups` (local q heads / local kv heads, which
changes when kv heads are shared or query groups padded).

The constraints: tp divides the query heads, and the kv heads (`num_key_value_heads`, from the
module or its config) divide tp or tp divides them. Example: Llama-3.1-8B has 32 heads and 8 kv
heads, so tp in {1, 2, 4, 8, 16, 32}; at tp = 16 each kv head is shared by 2 ranks (kv_share.py).
"""

from __future__ import annotations

from torch import nn

from ...policy import is_int

# Counts (and one width) that transformers' attention modules keep and use in their forward.
REWRITTEN_ATTRS = ("num_heads", "n_heads", "num_key_value_heads", "num_key_value_groups", "inner_dim")


def transformers_attention_counts(module: nn.Module):
    """`(values, checked)` for an AttentionSpec of a transformers attention module, else None.

    values: `(attribute, global value)` the module has and that become per-rank values (tp must divide them).
    checked: `("heads", n)` and `("kv_heads", n)` read from the config, for the counts the module does not keep.
    A transformers attention module is a class from the `transformers` package whose name ends in
    "Attention" and that has a head count (as an attribute or in its config).
    """
    cls = type(module)
    if not (cls.__module__.startswith("transformers.") and cls.__name__.endswith("Attention")):
        return None
    heads = _count(module, ("num_heads", "n_heads"), "num_attention_heads")
    if heads is None:
        return None
    kv_heads = _count(module, ("num_key_value_heads",), "num_key_value_heads") or heads
    values = tuple((attr, getattr(module, attr)) for attr in REWRITTEN_ATTRS if is_int(getattr(module, attr, None)))
    # A count the module keeps is already a constraint through `values`; name each number once.
    kept = {attr for attr, _ in values}
    checked = (("heads", heads),) if not kept & {"num_heads", "n_heads"} else ()
    checked += (("kv_heads", kv_heads),) if "num_key_value_heads" not in kept and kv_heads != heads else ()
    return values, checked


def _count(module: nn.Module, attrs: tuple[str, ...], config_key: str) -> int | None:
    for attr in attrs:
        if is_int(getattr(module, attr, None)):
            return getattr(module, attr)
    value = getattr(getattr(module, "config", None), config_key, None)
    return value if is_int(value) else None
