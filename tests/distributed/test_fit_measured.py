"""`dtp fit`'s per-rank peak against torch's MemTracker on real tensors (fp32, CPU, gloo).

Three pipelines, each loaded by `dtp.load_pipeline` as `dtp run` loads it (transformer and text encoders
sharded, the VAE split by rows over every rank) and run for one whole generation (text encoding, one
denoising step, VAE decode): the tiny FLUX.1 and Qwen-Image pipelines at 128^2, and the medium FLUX.1
(`dtp.testing.medium`: width 512, VAE of 64-256 channels) at 256^2. Meshes (cfg, cp, tp) in
{(1, 1, 2), (1, 2, 1), (1, 2, 2), (2, 1, 2)}, all in one group of 4 ranks: two 2-rank meshes run side by
side, one on ranks {0, 1} and one on {2, 3}. cfg = 2 takes both of its paths: Qwen-Image with a negative
prompt calls the transformer twice per step (one call per cfg group), FLUX.1 with two prompts splits
the batch. Every rank's MemTracker peak (parameters + activations) is compared with the row of
`dtp.fit` for the same candidate: within 10 %. The medium pipeline runs with DTP_FIT_MEDIUM=1 (suite time); by
default 3 of the 8 (model, mesh) pairs (`DEFAULT`: the 4-rank meshes), all with DTP_FULL=1.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

import dtp
from dtp.families.pipelines import tiny_checkpoint
from dtp.testing.launch import spawn
from dtp.testing.medium import medium_checkpoint
from dtp.testing.scope import full_run

PROMPT = "a photo of a cat"
TOL = 0.10
WORLD = 4
MESHES = ((1, 1, 2), (1, 2, 1), (1, 2, 2), (2, 1, 2))  # (cfg, cp, tp)
# The medium pipeline doubles the test's cost (~35 CPU s more on this machine): opt-in, DTP_FIT_MEDIUM=1 or DTP_FULL=1.
MEDIUM = os.environ.get("DTP_FIT_MEDIUM") == "1" or full_run()
SIZES = {"flux": 128, "qwenimage": 128} | ({"medium": 256} if MEDIUM else {})
# By default tp and cp together (1, 2, 2), each cfg path (FLUX.1's split batch, Qwen-Image's two calls a step) and
# each tiny model: the three 4-rank meshes. The 2-rank meshes (tp or cp alone: parts of (1, 2, 2)) and the other
# (model, mesh) pairs repeat a covered kind and run with DTP_FULL=1 (test_fit_phases.py runs tp=2 and cp=2 alone
# per phase).
DEFAULT = (
    ("flux", (1, 2, 2)),
    ("flux", (2, 1, 2)),
    ("qwenimage", (2, 1, 2)),
)
RUN = tuple((m, mesh) for m in SIZES for mesh in MESHES if full_run() or m == "medium" or (m, mesh) in DEFAULT)


def _mesh(cfg: int, cp: int, tp: int):
    """dtp.make_mesh over the group, or a smaller ("cp", "tp") mesh repeated along a leading axis of copies."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if cfg * cp * tp == dist.get_world_size():
        return dtp.make_mesh(tp=tp, cp=cp, cfg=cfg, device_type="cpu")
    copies = dist.get_world_size() // (cp * tp)
    return init_device_mesh("cpu", (copies, cp, tp), mesh_dim_names=("copies", "cp", "tp"))["cp", "tp"]


def _options(model: str, cfg: int) -> dict:
    """The generation's prompts: Qwen-Image with true CFG (two calls a step); FLUX.1 two prompts at cfg = 2."""
    if model == "qwenimage":
        return {"prompt": PROMPT, "negative_prompt": "blurry", "true_cfg_scale": 4.0}
    return {"prompt": [PROMPT] * (2 if cfg > 1 else 1), "max_sequence_length": 512}


def _generate(directory: str, model: str, mesh_shape, mesh) -> dict:
    """This rank's MemTracker peak over one generation on `mesh`, and the prompt length the transformer saw."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.nn.modules.module import register_module_forward_pre_hook

    pipe = dtp.load_pipeline(directory, mesh, torch_dtype=torch.float32, device=torch.device("cpu"))
    pipe.set_progress_bar_config(disable=True)
    seen = {}

    def prompt_length(module, args, kwargs) -> None:  # before the cp hooks cut it
        seen.setdefault("text_tokens", kwargs["encoder_hidden_states"].shape[1])

    pipe.transformer.register_forward_pre_hook(prompt_length, with_kwargs=True, prepend=True)
    tracker = MemTracker()
    tracker.track_external(*(m for m in pipe.components.values() if isinstance(m, torch.nn.Module)))

    # MemTracker refuses a module called twice (the prompt and the negative prompt, a step's two calls); only its
    # global peak is read here, so each call starts its module's stats afresh (a global hook runs before its own).
    def forget_module(module, args) -> None:
        tracker.memory_tracking.pop(module, None)

    forget = register_module_forward_pre_hook(forget_module)
    size = SIZES[model]
    try:
        with torch.no_grad(), tracker:
            pipe(height=size, width=size, num_inference_steps=1, output_type="np", **_options(model, mesh_shape[0]))
    finally:
        forget.remove()
    (peak,) = (v["Total"] for v in tracker.get_tracker_snapshot("peak").values())
    return {"peak": peak, **seen}


def _worker(rank: int, world: int, directories: dict) -> dict:
    """Each run of RUN this rank takes part in: a 4-rank mesh on the whole group; the 2-rank meshes two at a time, a
    different one on each copy (ranks {0, 1} and {2, 3}), so no copy repeats another's work. Every rank builds both
    copies' meshes (building one is a collective call)."""
    whole = [run for run in RUN if math.prod(run[1]) == world]
    halves = [run for run in RUN if math.prod(run[1]) < world]
    assert all(math.prod(mesh) == world // 2 for _, mesh in halves), halves
    out = {(model, mesh): _generate(directories[model], model, mesh, _mesh(*mesh)) for model, mesh in whole}
    copy = rank // (world // 2)
    for start in range(0, len(halves), 2):
        pair = halves[start : start + 2]
        meshes = [_mesh(*mesh) for _, mesh in pair]
        if copy < len(pair):
            model, mesh = pair[copy]
            out[(model, mesh)] = _generate(directories[model], model, mesh, meshes[copy])
    return out


@pytest.fixture(scope="module")
def directories(tmp_path_factory) -> dict:
    found = {model: str(tiny_checkpoint(model)) for model in ("flux", "qwenimage")}
    return found | ({"medium": medium_checkpoint(tmp_path_factory.mktemp("medium-flux"))} if MEDIUM else {})


@pytest.fixture(scope="module")
def measured(directories) -> dict:
    ranks = spawn(_worker, WORLD, directories)
    return {key: [rank[key] for rank in ranks if key in rank] for key in RUN}  # 2 ranks' results for a 2-rank mesh


def _row(directory: str, model: str, cfg: int, cp: int, tp: int, text_tokens: int) -> dict:
    wanted = dict(
        cfg=cfg, cp=cp, tp=tp, cp_mode="ulysses" if cp > 1 else None, pad=False, quant=None,
        text_encoders="sharded" if tp > 1 else "whole", parallel_vae=True, fsdp=False,
    )  # fmt: skip
    batch = 2 if cfg > 1 and model != "qwenimage" else 1
    size = SIZES[model]
    report = dtp.fit(
        directory, cfg * cp * tp, "1GB", height=size, width=size, batch=batch, dtype="fp32", text_tokens=text_tokens,
        only=wanted,
    )  # fmt: skip
    (row,) = report["rows"]
    return row


CASES = [
    pytest.param(m, mesh, marks=() if (m, mesh) in RUN else pytest.mark.full, id="cfg{}-cp{}-tp{}-{}".format(*mesh, m))
    for mesh in MESHES
    for m in SIZES
]


@pytest.mark.parametrize("model, mesh", CASES)
def test_fit_peak_within_10_percent_of_memtracker(directories, measured, model, mesh):
    """One generation: |fit peak - MemTracker peak| <= 10 % of MemTracker's on every rank."""
    ranks = measured[(model, mesh)]
    assert len(ranks) == math.prod(mesh), (model, mesh, len(ranks))  # every rank of the mesh reported
    row = _row(directories[model], model, *mesh, ranks[0]["text_tokens"])
    for rank, result in enumerate(ranks):
        error = abs(row["peak_bytes"] - result["peak"]) / result["peak"]
        assert error <= TOL, (model, mesh, rank, row["peak_bytes"], result["peak"], row["phase_bytes"])
    activations = max(row["phase_bytes"].values())
    assert activations >= 0.2 * row["peak_bytes"], row  # the check is about the activations, not only weights
