"""`dtp.pipeline.modular` without weights: which folders are modular, which steps a folder's files drop, the
text-only processor, and the call surface `run_request` reads from a `ModularRunner` (FLUX.3's blocks, nothing
loaded). The pipeline run end to end is test_run_released's (`full`)."""

from __future__ import annotations

import json

import pytest

from dtp.families.pipelines import qwen_tokenizer
from dtp.pipeline.modular import MODULAR_INDEX, ModularRunner, TextProcessor, droppable_steps, is_modular
from dtp.pipeline.request import call_parameters, makes_video, size_multiple

FILES = ("transformer", "text_encoder", "tokenizer", "vae")  # what a FLUX.3 folder without the upsampler holds


@pytest.fixture(scope="module")
def flux3():
    from diffusers import Flux3ModularPipeline

    return Flux3ModularPipeline()  # Flux3AutoBlocks; scheduler, guider, image processor built from their configs


def _folder(root, names, *, index=True, standard=False):
    root.mkdir()
    for name in names:
        (root / name).mkdir()
    if index:
        (root / MODULAR_INDEX).write_text(json.dumps({"_class_name": "Flux3ModularPipeline"}))
    if standard:
        (root / "model_index.json").write_text("{}")
    return root


def test_a_folder_is_modular_by_its_index(tmp_path):
    assert is_modular(_folder(tmp_path / "m", [], index=True))
    assert not is_modular(_folder(tmp_path / "s", [], index=True, standard=True))  # both: a standard pipeline
    assert not is_modular(_folder(tmp_path / "none", [], index=False))


def test_a_step_whose_components_have_no_files_is_dropped(flux3, tmp_path):
    assert droppable_steps(flux3.blocks, _folder(tmp_path / "a", FILES)) == ["prompt_upsampler"]
    with_upsampler = [*FILES, "prompt_upsampler", "prompt_upsampler_processor"]
    assert droppable_steps(flux3.blocks, _folder(tmp_path / "b", with_upsampler)) == []
    # a step sharing a missing component with another is kept (the decode's vae is the encoder step's too)
    assert "decode" not in droppable_steps(flux3.blocks, _folder(tmp_path / "c", ["transformer", "text_encoder"]))


def test_the_text_processor_tokenizes_text_and_refuses_images():
    tokenizer = qwen_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    processor = TextProcessor(tokenizer)
    assert processor.apply_chat_template([{"role": "user", "content": "a cat"}], tokenize=False) == "<a cat>"
    assert processor("a cat")["input_ids"] == tokenizer("a cat")["input_ids"]
    with pytest.raises(ValueError, match="torchvision"):
        processor("a cat", images=[object()])


def test_the_runner_shows_the_blocks_inputs_as_its_call(flux3):
    runner = ModularRunner.wrap(flux3)
    taken = call_parameters(runner)
    assert {"prompt", "generator", "output_type", "height", "width", "num_inference_steps", "image"} <= taken
    assert "text_encoder_out_layers" in taken and "num_frames" not in taken
    assert not makes_video(runner)
    assert type(runner).__name__ == "Flux3ModularPipeline"  # refusals name the pipeline
    assert size_multiple(runner) == 16  # no VAE loaded: diffusers' default factor 8 x the 2 x 2 packing
    assert runner.components is flux3.components or runner.components == flux3.components
    assert runner.scheduler is flux3.scheduler
    runner.set_progress_bar_config(disable=True)  # one bar under torchrun: reaches the nested denoising loop
    loop = flux3._blocks.sub_blocks["denoise"].sub_blocks["text2image"].sub_blocks["denoise"]  # `.blocks`: a copy
    assert loop._progress_bar_config == {"disable": True}
