"""Plugging CP attention into diffusers' processors without editing diffusers.

Two routes, both active only while a CP-enabled attention module runs. (1) Most newer processors (Flux, Flux2, Qwen-
Image, Z-Image, Wan, LTX, HunyuanVideo, Cosmos, ...) compute attention through the name `dispatch_attention_fn`
imported into their own module (`transformer_flux.dispatch_attention_fn`, ...). (2) Processors that call
`F.scaled_dot_product_attention` directly are reached by a TorchFunctionMode entered for the module's forward
(`sdpa.py`). For route (1) we replace that module-level name, once per processor module, with a thin dispatcher that
reads a stack of active scopes: empty, it calls the original function with the original arguments (so models that
were never parallelized, in the same process, are untouched); else it runs Ulysses or ring attention on the `cp`
group of the innermost scope. A scope is pushed only while a CP-enabled attention module runs: a forward pre-hook on
that module pushes it, a forward hook pops it. When a forward raises, that hook does not run: the root model's
`ScopeGuard` (a hook with `always_call=True`) pops whatever its forward left. Not `always_call` on the attention
modules themselves: dynamo guards on each such hook's id, so every block instance would compile its own graph and a
model deeper than dynamo's recompile limit (8; FLUX.1-dev has 19 + 38 blocks) fails under `fullgraph=True`; the
root's hook runs outside the compiled blocks. A plain list rather than a ContextVar because torch.compile traces
list pushes and pops but breaks its graph at `ContextVar.set` (with `fullgraph=True`, as diffusers'
`compile_repeated_blocks` uses it, that is an error); the cost is that two threads running CP attention in one
process at once would share the stack. So the effect is contained to the attention modules of the model that
`parallelize` was called on, and `remove_cp` (removing the hooks) undoes it.

Why not diffusers' own `_parallel_config` route: its ring/Ulysses templates need a backend that
returns the log-sum-exp (none on CPU), build their own 1-D mesh, and diffusers refuses CP with TP.
Why not wrap the processor object: diffusers filters processor kwargs by
`inspect.signature(processor.__call__)`, so a generic wrapper would silently drop arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ...errors import ForwardError
from ...policy import ring_kernel_family
from ...resolve.binding.cp import ADAPTER_ROUTES, DISPATCH_NAME, PACKED_ROUTE, attention_routes, processor_module
from ..arguments import Binder
from ..probe import body_runs
from .adapters import install_adapter
from .masks import ForwardMasks, gather_key_mask, split_mask, whole_mask
from .ring import ring_attention
from .sdpa import SdpaRoute
from .ulysses import native_whole, sdpa_heads, ulysses_attention, whole_attention
from .whole_pad import pad_whole_mask

SDPA_ROUTE = "sdpa"  # `resolve.cp.attention_routes`: the processor calls F.scaled_dot_product_attention itself
_ACTIVE: list = []  # the scopes of the attention modules running now, innermost last


@dataclass(frozen=True)
class CpAttention:
    """Attention over the `cp` process group in one mode; called by the patched dispatcher.

    backend: the attention backend chosen for the model (a diffusers `AttentionBackendName` value, None = auto):
    Ulysses passes it to attention on whole sequences where the processor names none (the SDPA route), ring runs
    its blocks in that backend's kernel family (`policy.ring_kernel_family`, `kernels.block_kernel`).
    masks: the per-forward mask cache shared by the model's attention layers (`masks.ForwardMasks`).
    """

    mode: str
    group: object  # the process group of this rank's `cp` axis
    pads: object = None  # hooks.PadState for a module whose keys hold a padded split's tokens, else None
    backend: str | None = None
    masks: ForwardMasks = field(default_factory=ForwardMasks)
    usp: tuple | None = None  # mode "usp": (ring group, Ulysses group) within `group` (`mesh.usp_groups`)

    def __call__(self, original, args: dict):
        query, key, value = args["query"], args["key"], args["value"]
        if args.get("dropout_p", 0.0) or args.get("is_causal", False) or args.get("enable_gqa", False):
            raise ForwardError(
                "context-parallel attention supports dropout_p=0, is_causal=False, enable_gqa=False only."
            )
        if args.get("parallel_config") is not None:
            raise ForwardError("this model also has a diffusers parallel_config; use either dtp CP or diffusers CP.")
        if args.get("attn_mask") is not None:  # without a mask (most layers) none of the whole-mask checks apply
            if not isinstance(args["attn_mask"], torch.Tensor):
                raise ForwardError(
                    f"context-parallel attention takes tensor masks only, got a {type(args['attn_mask']).__name__} "
                    f"(a flex / block-sparse mask chosen over the whole sequence, e.g. Kandinsky 5's NABLA "
                    f"sparse_params); run without it or with cp=1."
                )
            # a model's own mask over the unpadded whole sequence (OmniGen) padded with it first (`whole_pad.py`)
            args = {**args, "attn_mask": pad_whole_mask(args["attn_mask"], query, self.group, self.pads)}
            whole = whole_mask(args["attn_mask"], query, key, self.group)
            if whole is not None:
                return self._whole_mask_attention(original, args, whole)
        full_mask, blind_rows = self._key_mask(args.get("attn_mask"), query, key)
        if self.mode == "usp":
            out = self._usp(query, key, value, args.get("scale"), full_mask)
        elif self.mode == "ring":
            ring_backend = ring_kernel_family(self.backend)
            out = ring_attention(
                query, key, value, None, group=self.group, scale=args.get("scale"), backend=ring_backend,
                full_mask=full_mask,
            )  # fmt: skip
        elif native_whole(args.get("backend") or self.backend, args):  # SDPA on the received [B, H/cp, S, D] views
            attend = sdpa_heads(args.get("scale"))
            out = ulysses_attention(
                query, key, value, None, group=self.group, attend=attend, full_mask=full_mask, heads_first=True
            )
        else:
            attend = whole_attention(original, args.get("backend") or self.backend, args.get("scale"), args)
            out = ulysses_attention(query, key, value, None, group=self.group, attend=attend, full_mask=full_mask)
        if blind_rows is None:
            return out
        return out.masked_fill(blind_rows.unsqueeze(-1).unsqueeze(-1), 0.0)

    def _usp(self, query, key, value, scale, full_mask):
        """Ulysses x ring: the Ulysses all-to-all gathers the keys of this rank's Ulysses group (for its heads),
        then ring attention runs over the ring groups. The cp ranks are laid out (ring, ulysses), so ring position
        p's keys after the all-to-all are cp ranks p U .. p U + U - 1 in order: block p of the cp-gathered key mask,
        the block `ring_attention` gives source p."""
        ring, ulysses = self.usp
        backend = ring_kernel_family(self.backend)

        def attend(q, k, v, unused_mask):
            return ring_attention(q, k, v, None, group=ring, scale=scale, backend=backend, full_mask=full_mask)

        return ulysses_attention(query, key, value, None, group=ulysses, attend=attend)

    def _key_mask(self, attn_mask, query, key):
        """`(every rank's key mask [B, S] or None, blind query rows or None)`: split, pad keys masked and gathered
        once per forward for each mask object (`ForwardMasks`)."""
        batch, keys = query.shape[0], key.shape[1]
        if attn_mask is None:
            mask, blind_rows = None, None
        else:
            mask, blind_rows = self.masks.get(
                attn_mask, ("split", batch, keys), lambda: split_mask(attn_mask, batch, keys)
            )
        mask = self._mask_pad_keys(mask, batch, key)
        if mask is None:
            return None, blind_rows
        slots = None if self.pads is None else tuple(self.pads.slots)  # a `PadView`'s slots mask other keys
        where = ("gather", slots, batch, keys, mask.dtype)
        return self.masks.get(attn_mask, where, lambda: gather_key_mask(mask, self.group)), blind_rows

    def _whole_mask_attention(self, original, args: dict, mask):
        """Ulysses with a mask over the whole sequence (`masks.whole_mask`): each rank attends every token for its
        heads, so the mask goes on whole, as in one process. Ring attention sees one key block at a time: refused.
        The adapter that built the mask masks a padded split's pad keys in it (`block_causal.py`)."""
        if self.mode != "ulysses":
            raise ForwardError(
                f"context-parallel attention: a {tuple(mask.shape)} mask over the whole sequence (a per-query mask, "
                f"e.g. block-causal) runs under Ulysses only; use cp_mode='ulysses'."
            )
        backend = args.get("backend") or self.backend

        def attend(q, k, v, attn_mask):
            return original(q, k, v, attn_mask=mask, scale=args.get("scale"), backend=backend)

        return ulysses_attention(args["query"], args["key"], args["value"], None, group=self.group, attend=attend)

    def _mask_pad_keys(self, mask, batch: int, key):
        """Add this rank's pad keys (`PadState`) to the `[B, S_k]` key mask: weight 0, as if absent."""
        if self.pads is None or not self.pads.padded:  # nothing padded in this forward (most calls)
            return mask
        valid = self.pads.key_valid(key.shape[1], batch, key.device)
        if valid is None or mask is None:  # None: no pad key among these (the "unmasked" controls' stand-in too)
            return mask if valid is None else valid
        if mask.dtype == torch.bool:
            return mask & valid
        return mask.masked_fill(torch.logical_not(valid), float("-inf"))


def patch_dispatch(module) -> None:
    """Replace `module.dispatch_attention_fn` by the ContextVar dispatcher (idempotent)."""
    original = getattr(module, DISPATCH_NAME)
    if getattr(original, "_dtp_cp_original", None) is not None:
        return
    binder = Binder(original)

    def dispatch(*args, **kwargs):
        scope = _ACTIVE[-1] if _ACTIVE else None
        if scope is None:
            return original(*args, **kwargs)
        return scope.route(original, binder.arguments(args, kwargs))

    dispatch._dtp_cp_original = original
    dispatch.__doc__ = original.__doc__
    setattr(module, DISPATCH_NAME, dispatch)


class _Scope:
    """Forward hooks that make `attention` the active CP attention while one module runs.

    A module that finishes without calling the dispatcher or SDPA (e.g. a processor with its own
    attention math) attended over its local tokens only, a silently wrong result: that is a ForwardError.
    A module whose own forward did not run (a diffusers cache answered the call: `runtime/probe.py`) is not.
    """

    def __init__(self, path: str, attention, sdpa: bool = True):
        self.path, self.attention = path, attention
        # Enter the SDPA route only for processors that call SDPA themselves: the mode sees every torch call
        # of the forward, and torch.compile cannot trace through it (a dispatcher-only processor needs none).
        self.sdpa = sdpa
        self.calls = 0
        self.busy = False  # CP attention is running: SDPA calls it makes on whole sequences pass through
        self.modes = []
        self.runs = None  # the module's probed real runs when it was entered (None: not probed)
        self.masks = getattr(attention, "masks", None)  # CpAttention's per-forward mask cache (looked up once)

    def route(self, original, args: dict):
        """Run CP attention for one attention call (from either route)."""
        self.calls += 1
        self.busy = True
        try:
            return self.attention(original, args)
        finally:
            self.busy = False

    def enter(self, module, args, kwargs):
        if self.masks is not None:  # CpAttention's per-forward mask cache: the mask arguments of this call
            self.masks.note_inputs(kwargs)
        self.calls = 0
        self.runs = body_runs(module)
        _ACTIVE.append(self)
        if self.sdpa:
            mode = SdpaRoute(self)
            mode.__enter__()
            self.modes.append(mode)

    def exit(self, module, args, output):
        if self.sdpa:
            self.modes.pop().__exit__(None, None, None)
        _ACTIVE.pop()
        skipped = self.runs is not None and body_runs(module) == self.runs  # a cache answered the call
        if self.calls == 0 and output is not None and not skipped:
            raise ForwardError(
                f"attention '{self.path}' ({type(module.processor).__name__}) ran without calling "
                f"dispatch_attention_fn or F.scaled_dot_product_attention, so it attended over this rank's "
                f"tokens only; use a processor that calls one of them, or cp=1."
            )


class ScopeGuard:
    """Hooks on the root model: after its forward (also one that raised), pop the scopes and SDPA modes its
    attention modules left open, so a failed call cannot route the next model's SDPA calls to CP attention."""

    def __init__(self):
        self.depth = []  # len(_ACTIVE) when each running forward of the root began (a stack: re-entrant)

    def open(self, module, args):
        self.depth.append(len(_ACTIVE))

    def close(self, module, args, output):
        depth = self.depth.pop() if self.depth else 0
        while len(_ACTIVE) > depth:
            scope = _ACTIVE.pop()
            while scope.modes:
                scope.modes.pop().__exit__(None, None, None)


def active_attention():
    """The attention callable the dispatcher routes to right now, or None outside a hooked module's forward."""
    scope = _ACTIVE[-1] if _ACTIVE else None
    return None if scope is None else scope.attention


def install_attention(path: str, attn: nn.Module, attention) -> list:
    """Patch `attn`'s processor module (if it has the dispatcher) and scope `attention` (both routes) to
    `attn`'s forward; returns hook handles.

    `attention(original, args)` is called instead of `dispatch_attention_fn(**args)` while `attn`
    runs (`CpAttention` in production; anything with that signature, e.g. a recorder in tests).
    """
    own = {*ADAPTER_ROUTES, PACKED_ROUTE} & set(attention_routes(attn))  # read before the adapter swaps the processor
    handles = install_adapter(attn, attention)
    if own:  # the adapter runs the attention (`linear.py`, `frames.py`, `packed.py`): nothing to scope
        assert handles, f"no CP adapter for {type(attn.processor).__name__}"
        return handles
    module = processor_module(attn)
    if module is not None:
        patch_dispatch(module)
    scope = _Scope(path, attention, sdpa=SDPA_ROUTE in attention_routes(attn))
    return handles + [
        attn.register_forward_pre_hook(scope.enter, with_kwargs=True),
        attn.register_forward_hook(scope.exit),  # a raised forward: the root's ScopeGuard pops (module docstring)
    ]
