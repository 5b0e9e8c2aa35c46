"""Key masks under context parallelism.

diffusers processors hand `dispatch_attention_fn` either no mask or a per-key mask: `[B, S_k]` or
`[B, 1, 1, S_k]`, bool (True = attend) or additive float (Qwen-Image's joint text+image mask, Z-Image's
padding mask). Under CP each rank holds the mask of its own key chunk; attention over all keys needs
the mask of all chunks, concatenated in the same rank order as the keys. Masks that vary per query
or per head are not per-key and are refused, except a mask over the WHOLE sequence (`whole_mask`): a processor
adapter that knows the global structure (Qwen-Image 2.1's block-causal mask) builds it on every rank, and
Ulysses, which holds every token for its heads, applies it whole.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...errors import ForwardError
from ...styles.collectives import all_gather_last
from .sequence import dense


def split_mask(attn_mask: torch.Tensor | None, batch: int, keys: int):
    """`(key_mask, query_rows)` for CP attention: the mask of each key as `[B, S_k]` (or None), and
    `[B, S_q]` bool rows whose queries see no key (output 0, as torch's SDPA gives them), or None.

    Accepted: `[B, S_k]`, and 4-D `[B|1, H|1, S_q|1, S_k]` masks that are the same for every head and
    either the same for every query (a per-key mask expanded, as torch SDPA processors do) or a bool
    outer product `valid_q & valid_k` (Chroma's padded prompt). Anything else (causal,
    block-diagonal) is refused: CP attention would not reproduce it.
    A dim that is expanded (stride 0) is the same along it by construction: decided from the strides, with no
    read of the data; only a materialised mask is compared on the device (a host read: `ForwardMasks` caches
    the verdict once per forward).
    """
    if attn_mask is None or attn_mask.ndim != 4:
        return key_mask(attn_mask, batch, keys), None
    if attn_mask.shape[1] > 1:
        first = attn_mask.narrow(1, 0, 1)
        if attn_mask.stride(1) != 0 and not bool((attn_mask == first).all()):
            raise ForwardError(f"context-parallel attention: the {tuple(attn_mask.shape)} mask differs between heads.")
        attn_mask = first
    rows = attn_mask.select(1, 0)  # [B, S_q|1, S_k]
    if rows.shape[1] == 1 or rows.stride(1) == 0 or bool((rows == rows.narrow(1, 0, 1)).all()):
        return key_mask(rows.select(1, 0), batch, keys), None
    if rows.dtype == torch.bool:
        valid_k, valid_q = rows.any(dim=1), rows.any(dim=2)  # [B, S_k], [B, S_q]
        if bool((rows == (valid_q.unsqueeze(2) & valid_k.unsqueeze(1))).all()):
            return key_mask(valid_k, batch, keys), torch.logical_not(valid_q)
    raise ForwardError(
        f"context-parallel attention supports per-key masks (or a bool query x key outer product) only; this "
        f"{tuple(attn_mask.shape)} mask is neither."
    )


def key_mask(attn_mask: torch.Tensor | None, batch: int, keys: int) -> torch.Tensor | None:
    """The mask as `[B, S_k]` (bool or float), or None."""
    if attn_mask is None:
        return None
    if attn_mask.ndim == 4 and attn_mask.shape[1] == 1 and attn_mask.shape[2] == 1:
        attn_mask = attn_mask.select(1, 0).select(1, 0)
    if attn_mask.ndim != 2 or attn_mask.shape[-1] != keys or attn_mask.shape[0] not in (1, batch):
        raise ForwardError(
            f"context-parallel attention supports per-key masks of shape [B, S_k] or [B, 1, 1, S_k] "
            f"(S_k = {keys} local keys), got {tuple(attn_mask.shape)}."
        )
    return attn_mask.expand(batch, keys)


def gather_key_mask(mask: torch.Tensor | None, group) -> torch.Tensor | None:
    """Concatenate every rank's `[B, S_local]` mask along keys, in rank order (bool travels as uint8): one
    all-gather (`styles.collectives.all_gather_last`: the ProcessGroup's in eager, traced under torch.compile)."""
    if mask is None:
        return None
    wire = mask.to(torch.uint8) if mask.dtype == torch.bool else mask
    full = all_gather_last(dense(wire), group)
    return full.bool() if mask.dtype == torch.bool else full


class ForwardMasks:
    """The masks of one model forward, split and gathered once and reused by every attention layer of it.

    Every layer of a forward sees the same key mask, but re-checking (`split_mask`) and re-gathering it in each
    layer costs a host read and an all-gather per layer. An entry is reused when the mask is the same object as
    before (identity and `_version`: a mask changed in place is a miss), or when the processor built it anew from
    the same mask inputs of its attention module (Qwen-Image concatenates the `encoder_hidden_states_mask` every
    block is given with ones for the image: `note_inputs` records the module call's tensor arguments named
    `*mask*`), with the same shapes. So a processor's mask must be a function of those inputs and the shapes, as in
    every diffusers processor; a mask built from anything else is only reused as the same object.
    Entries live only while the model's forward runs (`open` / `close`: a forward pre-hook and an always-called
    forward hook on the model), so every rank, running the same code, hits and misses alike and issues the same
    collectives. Under torch.compile nothing is cached (each layer gathers; no identity guards in the graph).
    """

    def __init__(self):
        self.active = False
        self.inputs: tuple = ()  # the running attention module's mask arguments, with their versions
        self._entries: list = []  # (source's _identity, inputs, key, value)

    def open(self, *unused) -> None:
        self._entries.clear()
        self.active = True

    def close(self, *unused) -> None:
        self._entries.clear()
        self.active = False

    def note_inputs(self, kwargs: dict) -> None:
        """Record the tensor arguments named `*mask*` of the attention module call starting now."""
        if not self.active or torch.compiler.is_compiling():
            return
        masks = sorted((n, t) for n, t in kwargs.items() if "mask" in n and isinstance(t, torch.Tensor))
        self.inputs = tuple(_identity(t) for _, t in masks)

    def get(self, source, key: tuple, compute):
        """`compute()`, or its value from earlier in this forward for the same `source` (or the same mask inputs)
        and `key`."""
        if not self.active or torch.compiler.is_compiling():
            return compute()
        ident = _identity(source)
        for seen, inputs, seen_key, value in self._entries:
            if seen_key == key and (_same((seen,), (ident,)) or _same(inputs, self.inputs)):
                return value
        value = compute()
        self._entries.append((ident, self.inputs, key, value))
        return value


def _identity(t) -> tuple | None:
    """What makes two tensors the same data without reading it: one storage owner (a view's base), offset, shape,
    strides and version (shared by a base and its views). The cut of one mask by two blocks' split hooks is two view
    objects with one identity."""
    if not isinstance(t, torch.Tensor):
        return None
    base = t if t._base is None else t._base
    return (base, t.storage_offset(), tuple(t.shape), t.stride(), t._version)


def _same(a: tuple, b: tuple) -> bool:
    """Two non-empty tuples of `_identity` records of the same data."""
    if not a or len(a) != len(b) or any(x is None or y is None for x, y in zip(a, b)):
        return False
    return all(x[0] is y[0] and x[1:] == y[1:] for x, y in zip(a, b))


def whole_mask(attn_mask, query: torch.Tensor, key: torch.Tensor, group) -> torch.Tensor | None:
    """`attn_mask` if it spans the whole sequence (`[B|1, 1, cp * S_q, cp * S_k]` for local `[B, S, H, D]`
    q and k), else None. Only a CP adapter builds such a mask: an ordinary processor under CP sees local
    tokens, so its masks are at most `S_q x S_k`; a local mask cannot have that shape (cp > 1)."""
    if not isinstance(attn_mask, torch.Tensor) or attn_mask.ndim != 4:
        return None
    cp = dist.get_world_size(group)
    if cp < 2:
        return None
    if tuple(attn_mask.shape[-2:]) != (cp * query.shape[1], cp * key.shape[1]) or attn_mask.shape[1] != 1:
        return None
    return attn_mask
