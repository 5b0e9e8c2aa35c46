"""The padded sequences one attention's keys hold, when a forward pads two sequences that no attention sees together.

`PadState` locates a rank's pad keys among an attention's local keys by two slots, `first` and `last` of the joint
key sequence. Kandinsky 6 pads two streams that are never joint: its video (`first`) is the keys of the video
self-attention and the av cross-attention (audio queries), its audio (`last`) the keys of the audio self-attention and
the va cross-attention (video queries). Each of those attentions must mask its own stream's pad keys only: with both
slots, the video self-attention's keys would be read as [video | audio] and the audio's pad run placed among the
video keys. A `PadView` is the state seen through the slots of the plan's `pad` rules that list the attention
(`CpResolved.pad_slots`): the same `padded` / `key_valid` over those slots alone.
Example: 18 video tokens, 9 audio tokens, cp = 4: video padded to 20 (rank 3: 3 real of 5), audio to 12 (rank 3: 0
real of 3); rank 3's video self-attention masks local keys 3..4, its audio self-attention keys 0..2.
"""

from __future__ import annotations

from .hooks import PadSlot, PadState


class PadView:
    """`state` restricted to the slots `at` (`first` / `last`): what `CpAttention` reads of a `PadState`."""

    def __init__(self, state: PadState, at: tuple[str, ...]):
        self.state, self.at = state, tuple(at)

    @property
    def slots(self) -> dict[str, PadSlot]:
        return {name: self.state.slots[name] for name in self.at}

    @property
    def padded(self) -> bool:
        return any(slot.padded for slot in self.slots.values())

    def key_valid(self, keys: int, batch: int, device):
        # looked up on the class at each call, so a test that replaces `PadState.key_valid` replaces this one too
        return PadState.key_valid(self, keys, batch, device)
