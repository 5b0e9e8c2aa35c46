"""Tiny Cosmos 3 Omni inputs with its sound and action heads (test fixture; shared by the unit and gloo cp tests)."""

from __future__ import annotations

import torch

# the config options that build the sound and action heads (added to the family's tiny config)
SOUND_ACTION = dict(sound_gen=True, sound_dim=6, action_gen=True, action_dim=3, num_embodiment_domains=2)


def add_sound_and_action(inputs: dict, g: torch.Generator) -> dict:
    """`inputs` (7 text + 18 video tokens) with 5 sound tokens (frames 1-4 noisy, read back) and 4 action tokens
    (frames 2-3 noisy, domain 1) after the video tokens: 34 rows in all."""
    sound, action = torch.arange(25, 30), torch.arange(30, 34)
    inputs.update(
        position_ids=torch.arange(34).expand(3, -1),
        sequence_length=34,
        sound_tokens=[torch.randn(6, 5, generator=g)],
        sound_token_shapes=[(5, 1, 1)],
        sound_sequence_indexes=sound,
        sound_mse_loss_indexes=sound[1:],
        sound_timesteps=torch.rand(4, generator=g) * 1000,
        sound_noisy_frame_indexes=[torch.arange(1, 5)],
        action_tokens=[torch.randn(4, 3, generator=g)],
        action_token_shapes=[(4, 1, 1)],
        action_sequence_indexes=action,
        action_mse_loss_indexes=action[2:],
        action_timesteps=torch.rand(2, generator=g) * 1000,
        action_noisy_frame_indexes=[torch.arange(2, 4)],
        action_domain_ids=[torch.tensor(1)],
    )
    return inputs
