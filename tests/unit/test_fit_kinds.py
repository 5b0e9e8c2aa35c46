"""`dtp fit` costs every kind of block (`fit/kinds.py`): Nucleus-Image's dense blocks and its expert blocks (two
capacities) each traced once and weighted by their count, against a trace of the whole model (meta / fake tensors).
"""

import json
import shutil

import pytest
import torch

from dtp.analysis.forward import Call, trace_sharded
from dtp.analysis.trace import block_lists
from dtp.families import nucleusmoe
from dtp.families.pipelines import tiny_checkpoint
from dtp.fit.kinds import cut_by_kind
from dtp.fit.measure import Measurer, Setup
from dtp.fit.pipelines import Shape, fit_pipeline

# Six blocks: 0-2 and 5 dense, 3 and 4 experts at capacities 4.0 and 2.0 (as released: 4.0 for blocks 3-4, 2.0 after).
NUCLEUS = {
    **nucleusmoe.TINY,
    "_class_name": nucleusmoe.CLASS_NAME,
    "num_layers": 6,
    "dense_moe_strategy": "leave_first_three_and_last_block_dense",
    "capacity_factors": [0.0, 0.0, 0.0, 4.0, 2.0, 0.0],
}
SHAPE = Shape(1, 64, 64, 1, 16)


def test_the_released_nucleus_is_cut_after_the_first_block_of_its_last_kind():
    """Nucleus-Image's 32 blocks (first three dense, 3-4 at capacity 4.0, 5-31 at 2.0): blocks 0-5 traced in their
    places, block 5 standing for the 27 at capacity 2.0; FLUX.1's alike blocks: one per list, as `truncate_blocks`
    cuts them."""
    from dtp.analysis.fakepg import meta_model

    model = meta_model(nucleusmoe.CLASS_NAME)
    lengths, weights = cut_by_kind(model)
    assert lengths == {"transformer_blocks": 32}
    assert weights == {f"transformer_blocks.{i}": n for i, n in enumerate([1, 1, 1, 1, 1, 27])}
    kept = model.transformer_blocks
    assert [b.moe_enabled for b in kept] == [False] * 3 + [True] * 3
    assert [b.img_mlp.capacity_factor for b in kept[3:]] == [4.0, 4.0, 2.0]
    flux = meta_model("FluxTransformer2DModel")
    assert cut_by_kind(flux)[1] == {"transformer_blocks.0": 19, "single_transformer_blocks.0": 38}
    assert block_lists(flux) == {"transformer_blocks": 1, "single_transformer_blocks": 1}


@pytest.fixture(scope="module")
def nucleus_pipeline(tmp_path_factory):
    """The tiny Qwen-Image pipeline's directory with its transformer a six-block Nucleus-Image (configs only: fit
    builds every component on meta)."""
    directory = tmp_path_factory.mktemp("nucleus") / "pipeline"
    shutil.copytree(tiny_checkpoint("qwenimage"), directory)
    (directory / "transformer" / "config.json").write_text(json.dumps(NUCLEUS))
    index = json.loads((directory / "model_index.json").read_text())
    index["transformer"] = ["diffusers", nucleusmoe.CLASS_NAME]
    (directory / "model_index.json").write_text(json.dumps(index))
    return str(directory)


def test_fit_costs_the_dense_and_the_expert_blocks_as_the_whole_model(nucleus_pipeline):
    """fit's weights and FLOPs of the six-block Nucleus equal a trace of the whole model (exact: each kind's blocks
    cost alike); block 0 alone, weighted by six (what fit did), misses both: the negative control."""
    measurer = Measurer(fit_pipeline(nucleus_pipeline), torch.float32, cache=False)
    figures = measurer.phase("transformer", Setup(), SHAPE)
    whole = measurer.pipeline.build("transformer", torch.float32)
    call = measurer.transformer_call(SHAPE)[2]
    traces, weights = trace_sharded(whole, 1, lambda module: None, {0: Call(call.kwargs)}, device=figures.device)
    trace = traces[0]
    assert figures.weight_bytes == sum(weights.values())
    assert figures.flops == sum(trace.flops.values())
    first = weights[""] + 6 * weights["transformer_blocks.0"], trace.flops[""] + 6 * trace.flops["transformer_blocks.0"]
    assert first[0] != figures.weight_bytes and first[1] != figures.flops
