"""Modular diffusers pipelines (a folder with `modular_model_index.json`, as diffusers 0.42 ships FLUX.3): loaded by
diffusers' own `ModularPipeline.from_pretrained`, the transformer and the text encoders shard-on-load as in any other
pipeline (`load.py`), and handed back as a `ModularRunner`: the call surface of a `DiffusionPipeline` that dtp's
`run_request` drives.

    pipe = load_modular_pipeline("./FLUX.3", mesh, torch_dtype=torch.float32)   # what dtp.load_pipeline does
    pipe(prompt="a cat", generator=g, output_type="np", num_inference_steps=28).images

What differs from diffusers' own `load_components()`:

- a top-level step whose loadable components are all absent from the folder is dropped before the pipeline is built
  (FLUX.3's prompt upsampler, a separate 9B model: the prompt is then encoded as given, as diffusers' docs say to
  do by popping the step);
- a processor component that transformers cannot build (Qwen3-VL's processor needs torchvision for its video
  processor; without it transformers 5.24 fails building the processor) is replaced by `TextProcessor`: the
  folder's tokenizer with the two calls a text prompt needs (`apply_chat_template`, `.tokenizer`). FLUX.3's
  reference images do not pass through it (its own image processor and the VAE take them).
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from types import SimpleNamespace

MODULAR_INDEX = "modular_model_index.json"
STANDARD_INDEX = "model_index.json"


def is_modular(model_dir) -> bool:
    """A modular pipeline folder: `modular_model_index.json` and no standard `model_index.json` (a folder with both
    is a standard pipeline, loaded as one)."""
    folder = Path(model_dir)
    return (folder / MODULAR_INDEX).is_file() and not (folder / STANDARD_INDEX).is_file()


def modular_index(model_dir) -> dict:
    """`modular_model_index.json` read: {name: [library, class, spec]} with the pipeline's own keys."""
    return json.loads((Path(model_dir) / MODULAR_INDEX).read_text())


def component_folder(model_dir, name: str) -> str:
    """Where component `name`'s files are: `<model_dir>/<subfolder>` (a spec's subfolder, else the name)."""
    entry = modular_index(model_dir).get(name)
    spec = entry[2] if isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], dict) else {}
    return os.path.join(model_dir, spec.get("subfolder") or name)


def build_modular(model_dir):
    """diffusers' ModularPipeline for `model_dir`, nothing loaded: its blocks, less each top-level step whose
    from_pretrained components all lack files in the folder (`droppable_steps`)."""
    from diffusers import ModularPipeline

    pipe = ModularPipeline.from_pretrained(model_dir)
    blocks = pipe.blocks
    dropped = droppable_steps(blocks, model_dir)
    if not dropped:
        return pipe
    for name in dropped:
        blocks.sub_blocks.pop(name)
    return type(pipe)(blocks=blocks, pretrained_model_name_or_path=model_dir)  # specs of the steps left


def droppable_steps(blocks, model_dir) -> list[str]:
    """Top-level steps of `blocks` whose components to load from files (`from_pretrained`) are all absent from
    `model_dir` and used by no other step (FLUX.3's prompt_upsampler when the folder has no prompt_upsampler/)."""
    steps = dict(blocks.sub_blocks)
    needs = {name: {c.name for c in step.expected_components if c.default_creation_method == "from_pretrained"}
             for name, step in steps.items()}  # fmt: skip
    dropped = []
    for name, components in needs.items():
        others = set().union(*(n for step, n in needs.items() if step != name))
        missing = [c for c in components if not os.path.isdir(component_folder(model_dir, c))]
        if components and len(missing) == len(components) and not components & others:
            dropped.append(name)
    return dropped


def load_rest(pipe, model_dir, dtype, loaded: dict) -> None:
    """Every from_pretrained component not in `loaded` read by diffusers (`load_components`), then `loaded` set
    (`update_components`); a processor transformers cannot build becomes a `TextProcessor`."""
    specs = {name: pipe.get_component_spec(name) for name in pipe._component_specs}
    wanted = [n for n, s in specs.items() if s.default_creation_method == "from_pretrained" and n not in loaded]
    present = [n for n in wanted if os.path.isdir(component_folder(model_dir, n))]
    models = [n for n in present if _is_module_class(specs[n].type_hint)]  # torch_dtype for models only
    for names, kwargs in ((models, {"torch_dtype": dtype}), ([n for n in present if n not in models], {})):
        if names:
            pipe.load_components(names=names, **kwargs)
    found = dict(loaded)
    expected = {spec.name: spec for spec in pipe.blocks.expected_components}  # the steps' own type, not the index's
    for name in present:
        if name in expected and _wants_processor(expected[name]) and not _is_processor(getattr(pipe, name, None)):
            found[name] = TextProcessor.from_folder(component_folder(model_dir, name), getattr(pipe, name, None))
    if found:
        pipe.update_components(**found)


def _is_module_class(hint) -> bool:
    import torch

    return isinstance(hint, type) and issubclass(hint, torch.nn.Module)


def _wants_processor(spec) -> bool:
    from transformers import AutoProcessor
    from transformers.processing_utils import ProcessorMixin

    hint = spec.type_hint
    return hint is AutoProcessor or (isinstance(hint, type) and issubclass(hint, ProcessorMixin))


def _is_processor(component) -> bool:
    from transformers.processing_utils import ProcessorMixin

    return isinstance(component, (ProcessorMixin, TextProcessor))


class TextProcessor:
    """A text-only stand-in for a multimodal processor (Qwen3-VL's): the tokenizer's chat template and the tokenizer
    itself (`.tokenizer`), which is all a text prompt goes through; `__call__` takes text only."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def from_folder(cls, folder: str, loaded=None) -> TextProcessor:
        """The folder's tokenizer (`AutoTokenizer`), or `loaded` when diffusers already read a tokenizer there."""
        from transformers import AutoTokenizer
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        if isinstance(loaded, PreTrainedTokenizerBase):
            return cls(loaded)
        return cls(AutoTokenizer.from_pretrained(folder))

    def apply_chat_template(self, conversation, **kwargs):
        return self.tokenizer.apply_chat_template(conversation, **kwargs)

    def __call__(self, text=None, images=None, videos=None, **kwargs):
        if images is not None or videos is not None:
            raise ValueError(
                "TextProcessor: this processor was built text-only (transformers needs torchvision for the "
                "pipeline's own processor); install torchvision matching torch to pass images."
            )
        return self.tokenizer(text, **kwargs)


class ModularRunner:
    """A loaded ModularPipeline with the surface of a DiffusionPipeline that dtp drives: `__call__(prompt=...,
    generator=..., output_type=..., **inputs)` returning `.images`, its signature the blocks' inputs (what
    `request.call_parameters` reads), and every other attribute the pipeline's own (components, transformer,
    scheduler, vae, device). Build with `ModularRunner.wrap(pipe)`."""

    def __init__(self, pipeline):
        object.__setattr__(self, "pipeline", pipeline)

    @classmethod
    def wrap(cls, pipeline) -> ModularRunner:
        """A runner of `pipeline`, of a class named as the pipeline's whose `__call__` signature is its inputs."""
        names = []
        for param in pipeline.blocks.inputs:
            if param.name and param.name not in names:
                names.append(param.name)
        for name in ("prompt", "generator", "output_type"):
            if name not in names:
                names.append(name)
        defaults = {p.name: p.default for p in pipeline.blocks.inputs if p.name}
        keyword = inspect.Parameter.KEYWORD_ONLY
        parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        parameters += [inspect.Parameter(n, keyword, default=defaults.get(n)) for n in names]

        def call(self, **inputs):
            return self._generate(**inputs)

        call.__signature__ = inspect.Signature(parameters)
        runner = type(type(pipeline).__name__, (cls,), {"__call__": call, "__module__": cls.__module__})
        return runner(pipeline)

    def _generate(self, **inputs):
        images = self.pipeline(output="images", **inputs)
        return SimpleNamespace(images=images)

    @property
    def vae_scale_factor_spatial(self) -> int:
        """Pixels per latent token: the VAE's factor x the 2 x 2 packing (FLUX.3: 8 x 2 = 16), what a size must
        be a multiple of (`request.size_multiple` reads it)."""
        return int(self.pipeline.vae_scale_factor) * 2

    def set_progress_bar_config(self, **kwargs) -> None:
        """On every step, nested ones too: diffusers' sets the top-level steps' only, and FLUX.3's denoising loop
        (the one bar) sits two levels down, so `disable=` would not reach it."""

        def walk(block):
            if hasattr(block, "set_progress_bar_config"):
                block.set_progress_bar_config(**kwargs)
            for sub in (getattr(block, "sub_blocks", None) or {}).values():
                walk(sub)

        walk(self.pipeline._blocks)  # the blocks it runs (`.blocks` is a deep copy)

    def to(self, *args, **kwargs) -> ModularRunner:
        self.pipeline.to(*args, **kwargs)
        return self

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "pipeline"), name)

    def __setattr__(self, name, value):
        setattr(self.pipeline, name, value)
