"""One traced decode for the full-size parallel-VAE benchmarks: rank 0's activation peak among N fake ranks.

    from vae_peak import decode_peak
    peak, shape = decode_peak(lambda: meta_model("AutoencoderDC", config, torch.bfloat16), 4, (1, 32, 64, 64))

The VAE is built on the meta device, split by `dtp.parallelize_vae` over torch's fake process group
(`dtp.analysis.fakepg.fake_world`: one process plays rank 0 of N, which holds the most rows), and decodes a latent
under FakeTensorMode (no compute, no memory). Peak: live bytes of every storage an op creates
(`dtp.analysis.trace.PhaseTrace`); parameters, buffers and the latent are resident and not counted.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dtp.analysis.fakepg import fake_world
from dtp.analysis.trace import PhaseTrace
from dtp.vae import parallelize_vae


def decode_peak(
    build, world: int, latent: tuple[int, ...], dtype=torch.bfloat16, rank: int = 0
) -> tuple[int, tuple[int, ...]]:
    """(peak bytes of `rank`'s decode among `world` ranks, the decoded shape); `build()` makes the meta VAE.

    rank: the rank this process plays (default 0). The fake group makes this process rank 0; the split's rank is set
    after `parallelize_vae` (the fake collectives return empty tensors of the right size whatever the rank)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with fake_world(world):
        vae = build()
        if world > 1:
            parallelize_vae(vae, dist.group.WORLD)
            vae._dtp_vae.split.rank = rank
        with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
            vae.to_empty(device="cpu")
            z = torch.empty(latent, dtype=dtype)
            with PhaseTrace(resident=[*vae.parameters(), *vae.buffers(), z]) as trace:
                out = vae.decode(z).sample
            return trace.trace.peak_bytes, tuple(out.shape)
