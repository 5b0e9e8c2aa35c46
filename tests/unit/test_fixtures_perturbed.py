"""Every fixture model has no parameter element exactly 0 or 1: a bias or norm-weight slicing bug shows.

transformers and diffusers initialize biases to zero and norm weights to one; a fixture that kept them would
compare a zero slice with a zero expected slice. Negative control: a freshly initialized model (not perturbed)
is caught by the same check.
"""

import pytest
import torch

from dtp.families import FAMILIES
from dtp.families.pipelines import CHECKPOINTS
from dtp.testing.cfg_pipelines import tiny_pixart_sigma_pipeline, tiny_wan_pipeline
from dtp.testing.perturb import trivial_parameters
from dtp.testing.tiny import tiny_model
from dtp.testing.tiny_text import TEXT_CLASSES, _config, tiny_grouped_qwen, tiny_text_model
from dtp.testing.tiny_vae import TINY_VAE_CONFIGS, tiny_vae
from dtp.testing.tiny_vision import VISION_CLASSES, tiny_vision_model


@pytest.mark.parametrize("cls", sorted(FAMILIES))
def test_dit_fixture_perturbed(cls):
    assert trivial_parameters(tiny_model(cls)) == []


@pytest.mark.parametrize("cls", sorted(TINY_VAE_CONFIGS))
def test_vae_fixture_perturbed(cls):
    assert trivial_parameters(tiny_vae(cls)) == []


@pytest.mark.parametrize("cls", TEXT_CLASSES)
def test_text_fixture_perturbed(cls):
    assert trivial_parameters(tiny_text_model(cls)) == []


def test_grouped_qwen_perturbed():
    assert trivial_parameters(tiny_grouped_qwen()) == []


@pytest.mark.parametrize("cls", sorted(VISION_CLASSES))
def test_vision_fixture_perturbed(cls):
    assert trivial_parameters(tiny_vision_model(cls)) == []


@pytest.mark.parametrize("build", [tiny_pixart_sigma_pipeline, tiny_wan_pipeline])
def test_cfg_pipeline_components_perturbed(build):
    modules = {n: c for n, c in build().components.items() if isinstance(c, torch.nn.Module)}
    assert set(modules) == {"transformer", "vae", "text_encoder"}
    assert {n: trivial_parameters(m) for n, m in modules.items()} == {n: [] for n in modules}


@pytest.mark.parametrize("model", sorted(CHECKPOINTS))
def test_demo_checkpoint_components_perturbed(model):
    """The demo's tiny checkpoints (product code, `dtp.families.pipelines`): CLIP, T5, Qwen2.5-VL and both VAEs too."""
    _, build = CHECKPOINTS[model]
    modules = {n: c for n, c in build().components.items() if isinstance(c, torch.nn.Module)}
    assert {"transformer", "vae", "text_encoder"} <= set(modules)
    assert {n: trivial_parameters(m) for n, m in modules.items()} == {n: [] for n in modules}


def test_lora_fixture_perturbed():
    """The LoRA fixture's A and B matrices (tests/distributed/lora_cases.py) are random, never 0 or 1."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "distributed"))
    from lora_cases import random_lora

    lora = random_lora(tiny_model("FluxTransformer2DModel"), seed=10)
    assert lora and not any(bool(((t == 0) | (t == 1)).any()) for t in lora.values())


def test_check_catches_default_init():
    """Negative control: transformers' default init (zero biases, norm weights of 1) is reported."""
    import transformers as tf

    config = _config("LlamaModel")
    config._attn_implementation = "eager"
    found = trivial_parameters(tf.LlamaModel(config))
    assert "norm.weight" in found and "layers.0.input_layernorm.weight" in found, found
