"""The per-forward bookkeeping on the root model as one forward pre-hook and one forward hook.

Three objects reset or open state when the root model's forward starts and two close it when it ends (also after a
raise): `PadState.reset`, `ScopeGuard.open` / `close` and `ForwardMasks.open` / `close`. As five torch hooks each cost
a hook call of `nn.Module._call_impl`; as one pair they cost two. The pre-hook is the model's first, as `reset` was:
the opens now run ahead of the root's split hooks too, which read neither the scope stack nor the mask cache, and a
split hook that raises is then closed against the depth its own forward recorded. The close steps are one
`always_call` hook registered where the two were (after the gathers); it runs both even when the first raises, as
torch ran each `always_call` hook."""

from __future__ import annotations


class RootHooks:
    """`open` (a forward pre-hook) and `close` (a forward hook, `always_call=True`) of the root model."""

    def __init__(self, pads, guard, masks):
        self.pads, self.guard, self.masks = pads, guard, masks

    def open(self, module, args) -> None:
        self.pads.reset()  # first: ahead of the model's own split hook, so only this forward's splits mark pads
        self.guard.open(module, args)
        self.masks.open()

    def close(self, module, args, output) -> None:
        try:
            self.guard.close(module, args, output)  # pops the attention scopes a raised forward left open
        finally:
            self.masks.close()
