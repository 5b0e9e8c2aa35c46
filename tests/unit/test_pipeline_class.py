"""`dtp.load_pipeline` hands its sharded components to the pipeline's own class: diffusers 0.42's
`DiffusionPipeline.from_pretrained` drops a passed component that the pipeline declares optional (WanPipeline's
`transformer`) and reads a whole copy from disk instead, so a Wan pipeline ran with its transformer whole."""

import pytest
from diffusers import DiffusionPipeline, WanPipeline

from dtp.loading.checkpoint import CheckpointError
from dtp.pipeline.load import _check_kept, pipeline_class
from dtp.testing.cfg_pipelines import tiny_wan_pipeline


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("wan")
    tiny_wan_pipeline().save_pretrained(path)
    return path


def test_the_pipelines_own_class_keeps_a_passed_transformer(wan_dir):
    transformer = type(tiny_wan_pipeline().transformer).from_pretrained(wan_dir, subfolder="transformer")
    assert pipeline_class(wan_dir) is WanPipeline
    pipe = pipeline_class(wan_dir).from_pretrained(wan_dir, transformer=transformer)
    assert pipe.transformer is transformer
    _check_kept(pipe, {"transformer": transformer})


def test_a_dropped_component_is_an_error_not_a_whole_copy(wan_dir):
    """The diffusers behaviour the fix avoids (if diffusers fixes it, this control says so), and the check that
    would catch it for any other pipeline."""
    transformer = type(tiny_wan_pipeline().transformer).from_pretrained(wan_dir, subfolder="transformer")
    pipe = DiffusionPipeline.from_pretrained(wan_dir, transformer=transformer)
    assert pipe.transformer is not transformer
    with pytest.raises(CheckpointError, match="replaced the sharded transformer"):
        _check_kept(pipe, {"transformer": transformer})


def test_an_unknown_class_name_falls_back_to_diffusion_pipeline(tmp_path):
    (tmp_path / "model_index.json").write_text('{"_class_name": "NoSuchPipeline"}')
    assert pipeline_class(tmp_path) is DiffusionPipeline
