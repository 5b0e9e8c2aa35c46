"""fit's replay of repeated calls (`dtp/analysis/repeats.py`) gives the figures of running every call: Wan's and
Qwen-Image's per-frame decoder, whole and split over 3 ranks of a fake world; a call that keeps state outside its
arguments is refused loudly rather than miscounted."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from dtp.analysis.fakepg import fake_world
from dtp.analysis.trace import fake_mode, to_fake, trace_call
from dtp.fit.measure import REPEATED
from dtp.fit.pipelines import decode
from dtp.runtime.mesh import make_mesh
from dtp.testing.tiny_vae import tiny_vae
from dtp.vae import parallelize_vae

LATENT_FRAMES = 9  # 33 frames: calls 0, 1, 2, 3 run, 4..8 replayed


def _decode_traces(cls: str, split: int) -> tuple:
    """(trace with every decoder call run, trace with repeats replayed, decoder forwards actually run in the second)
    of `cls`'s tiny VAE decoding [1, C, 9, 8, 12] latents on rank 0 of `split` fake ranks."""
    with torch.device("meta"):
        template = tiny_vae(cls)
    channels = template.config.z_dim
    traces, runs = [], []
    with fake_world(split):
        for repeated in ((), REPEATED[type(template).__name__]):
            vae = copy.deepcopy(template)
            if split > 1:
                parallelize_vae(vae, make_mesh(tp=split, device_type="cpu"))
            with fake_mode():
                to_fake(vae)
                runs.append(_count_decoder_runs(vae))
                z = torch.empty(1, channels, LATENT_FRAMES, 8, 12)
                traces.append(trace_call(vae, decode, {"z": z}, repeated))
    return traces[0], traces[1], runs[1]


def _count_decoder_runs(vae) -> list:
    """A list that grows by one each time the decoder's blocks actually run (its conv_in is the first layer)."""
    runs = []
    vae.decoder.conv_in.register_forward_pre_hook(lambda *_: runs.append(1))
    return runs


@pytest.mark.parametrize("split", [1, 3])
# Wan 2.1's causal decoder by default; Wan 2.2's and Qwen-Image's (the same cached-conv replay) with DTP_FULL=1.
@pytest.mark.parametrize(
    "cls",
    ["AutoencoderKLWan"]
    + [pytest.param(c, marks=pytest.mark.full) for c in ("AutoencoderKLWan22", "AutoencoderKLQwenImage")],
)
def test_replayed_decoder_calls_give_the_figures_of_running_them(cls, split):
    """Peak bytes, FLOPs by scope and the collectives (the halo exchanges at split 3) of a decode whose decoder calls
    4..8 are replayed equal those of a decode that runs all 9; only 4 calls run."""
    full, replayed, runs = _decode_traces(cls, split)
    assert replayed.peak_bytes == full.peak_bytes
    assert replayed.flops == full.flops
    assert replayed.collectives == full.collectives
    assert len(runs) == 4
    assert (len(full.collectives) > 0) == (split > 1)


class _Hoarder(nn.Module):
    """Keeps every output it makes in an attribute: state outside its arguments, which a replay cannot repeat."""

    def __init__(self):
        super().__init__()
        self.kept = []

    def forward(self, x):
        y = x * 2
        self.kept.append(y)
        return y + 1


def test_a_call_that_keeps_state_outside_its_arguments_is_refused():
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _Hoarder()

        def forward(self, x):
            return [self.inner(x) for _ in range(3)]

    model = Outer()
    with fake_mode():
        x = torch.empty(4, 4)
        trace_call(model, lambda m, x: m(x), {"x": x})  # run for real: fine
        model.inner.kept.clear()
        with pytest.raises(RuntimeError, match="keeps state outside its arguments"):
            trace_call(model, lambda m, x: m(x), {"x": x}, ("inner",))
