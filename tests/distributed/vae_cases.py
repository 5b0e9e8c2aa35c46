"""Shared by the parallel-VAE parity modules (test_vae_parity.py, test_vae_parity_more.py): the halo control."""

from __future__ import annotations

from dtp.vae import conv as conv_module

_halo_counts = conv_module.halo_counts  # the real one, kept before a test patches the module's name


def one_short(rows):
    """Negative control: one halo row fewer from each neighbour (zero padding in its place)."""
    top, bottom = _halo_counts(rows)
    return max(0, top - 1), max(0, bottom - 1)
