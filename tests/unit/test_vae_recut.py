"""The even re-cut of a parallel VAE's strips (`dtp/vae/recut.py`, CogVideoX's decoder), its arithmetic on one
process: `Split.bounds` tells a re-cut level's strip from a latent-partition one by its row count alone, and
CogVideoX's spatial norm reads exactly the latent rows under its re-cut rows. The rows moving between ranks and the
decode's exactness: `tests/distributed/test_vae_parity_more.py` (CogVideoX at N = 2, 3, 4, with negative controls)."""

from __future__ import annotations

from unittest.mock import patch

import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import dtp.vae.cogvideox as cogvideox
from dtp.vae.split import Split
from dtp.vae.strips import bounds, even_bounds, split_rows

LEVELS = 6  # x1 .. x32 the latent


def _first_even_level(latent: int, world: int) -> int | None:
    """The height of the first x2^e level (e >= 1) whose height divides by `world`, or None."""
    return next((latent << e for e in range(1, LEVELS) if (latent << e) % world == 0), None)


@settings(max_examples=50)
@given(st.integers(1, 200), st.integers(1, 8).map(lambda k: 2 * k))
def test_bounds_tell_re_cut_levels_from_latent_ones(latent, world):
    """After a re-cut at the first level that divides, every rank's strip of every latent-partition level (units x
    2^j) still reads as that partition and every strip of the re-cut level and the finer ones (height / world rows)
    as even: the row counts never coincide (the argument in `Split.bounds`). A lookup that ignores `even_from` would
    read 15 rows on rank 0 of (8, 8, 8, 8, 7, 7, 7, 7) as a scale of 15 / 8 and fail."""
    assume(latent >= world and latent % world)
    first = _first_even_level(latent, world)
    assume(first is not None)
    units = split_rows(latent, world)
    for rank in range(world):
        split = Split(None, rank, world, units, even_from=first)
        for j in range(LEVELS):
            assert split.bounds(units[rank] << j) == bounds(tuple(u << j for u in units))
        for height in (first << k for k in range(LEVELS) if first << k <= latent << (LEVELS - 1)):
            assert split.bounds(height // world) == even_bounds(height, world)


@settings(max_examples=50)
@given(st.integers(1, 60), st.sampled_from([2, 4, 6, 8]), st.sampled_from([2, 4, 8]), st.integers(1, 3))
def test_spatial_norm_latent_rows_are_the_whole_interpolation_rows(latent, world, scale, frames):
    """`cogvideox.latent_rows` on a re-cut level (rows height / world per rank): diffusers' interpolation of what it
    returns, to the strip's size, is the strip's rows of the whole latent's interpolation, on every rank. Each latent
    row holds its own index, so a row taken from the wrong place shows. `take_rows` (the point-to-point exchange) is
    replaced by slicing the whole latent."""
    assume(latent >= world and latent % world and latent * scale % world == 0)
    z = torch.arange(latent, dtype=torch.float32).view(1, 1, 1, latent, 1).expand(1, 2, frames, latent, 3)
    whole = F.interpolate(z, size=(frames, latent * scale, 3))
    units = split_rows(latent, world)
    z_bounds, f_bounds = bounds(units), even_bounds(latent * scale, world)
    for rank in range(world):
        split = Split(None, rank, world, units, even_from=latent * scale)
        f = whole[:, :, :, f_bounds[rank] : f_bounds[rank + 1]]
        zq = z[:, :, :, z_bounds[rank] : z_bounds[rank + 1]]

        def take_rows(x, dim, owned, wanted, split):
            assert owned == z_bounds and x.shape[dim] == owned[split.rank + 1] - owned[split.rank]
            return z.narrow(dim, wanted[split.rank][0], wanted[split.rank][1] - wanted[split.rank][0])

        with patch.object(cogvideox, "take_rows", take_rows):
            rows = cogvideox.latent_rows(f, zq, split)
        assert torch.equal(F.interpolate(rows, size=f.shape[-3:]), f)
