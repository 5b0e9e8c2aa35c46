"""`load_pipeline`: a diffusers pipeline directory loaded with every planned component shard-on-load.

What `dtp run` does, as a library call:

    pipe = dtp.load_pipeline("./FLUX.1-dev", mesh, torch_dtype=torch.bfloat16)

1. the text encoders (transformers components with a plan) are built on the meta device and checked
   on the mesh's `tp` axis first (no byte read), so a plan that does not fit stops every rank before
   the transformer is read;
2. the transformer is loaded shard-on-load (`dtp.from_pretrained`): each rank reads only its slice of
   every sharded tensor and moves only that slice to `device`;
3. the text encoders are filled shard-on-load the same way;
4. diffusers loads the rest (VAE, scheduler, tokenizers) whole, `parallelize_pipeline` shards any other
   component with a plan, and everything left is moved to `device`.

Without a mesh (`mesh=None`) the pipeline is loaded whole, in one process: the reference.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from ..loading import build_skeleton, is_transformers_class, load_prepared
from ..loading.checkpoint import CheckpointError
from ..loading.load import load_with
from ..loading.precheck import check_files
from ..plan import Plan, load_plan
from ..policy import check_attention_backend
from ..quant.load import diffusers_config
from ..runtime.attention_backend import set_attention_backend
from ..runtime.compile import compile_backend
from ..runtime.parallelism import Parallelism
from ..runtime.placement import local_device
from .modular import ModularRunner, build_modular, component_folder, is_modular, load_rest, modular_index
from .parallelize import WHOLE, compile_denoisers, parallelize_with, prepare_component

TRANSFORMER = "transformer"  # diffusers' component name of the denoiser


def load_pipeline(
    model_dir,
    mesh=None,
    *,
    torch_dtype=None,
    plans: Mapping[str, Plan | str | None] | None = None,
    pad: bool = False,
    cp_mode: str = "ulysses",
    device=None,
    quantization_config=None,
    fsdp: bool | int | str = False,
    attention_backend: str | None = None,
    compile: bool | str = False,
):
    """The pipeline in `model_dir` with every component that has a plan loaded shard-on-load on `mesh`.

    plans: per component name, a Plan, a bundled plan's name or a YAML path, or `dtp.pipeline.WHOLE` (None)
        to keep that component whole on every rank; a component not named gets its bundled plan (the
        transformer: `plan_for` its class; a text encoder: the first of its bundled plans that fits).
    device: where the slices and the whole components go (default: the mesh's device for this rank, e.g.
        `cuda:<LOCAL_RANK>`, else the CPU).
    pad, cp_mode: as in `dtp.parallelize`, for every sharded component.
    quantization_config: diffusers' `TorchAoConfig` or a torchao config (`dtp.quant.config_for("int8wo")`): the
        transformer's Linears quantized while loading, each rank its own slices (`dtp.from_pretrained`); without
        a mesh, diffusers' own quantized load. The text encoders, VAE and a WHOLE transformer are not quantized.
    fsdp: every sharded component's weights also divided over the mesh's non-tp axes (FSDP2), each rank reading only
        its FSDP shard of its TP slice (`dtp.from_pretrained(fsdp=True)`).
    attention_backend: as in `dtp.parallelize`, set on the transformer (also without a mesh).
    compile: regional compile of the denoisers once loaded, sharded or whole (`parallelize_pipeline`'s `compile`:
        True is inductor, "eager" traces only; each repeated block with `fullgraph=True`, traced at its first call).
    """
    compiler = compile_backend(compile)  # a wrong value fails before anything is read
    plans = {name: _plan(value) for name, value in (plans or {}).items()}
    device = local_device(device or (mesh.device_type if mesh is not None else "cpu"))
    loaded = {}
    if mesh is None:
        loaded[TRANSFORMER] = _whole_transformer(model_dir, torch_dtype, quantization_config, attention_backend)
    else:
        options = dict(cp_mode=cp_mode, pad=pad, device=device, fsdp=fsdp, attention_backend=attention_backend)
        parallelism = Parallelism.build(mesh, **options)
        whole = {name for name, plan in plans.items() if plan is WHOLE}
        encoders = prepare_text_encoders(model_dir, parallelism, torch_dtype, skip=whole)
        if TRANSFORMER not in whole:
            plan = plans.get(TRANSFORMER)
            loaded[TRANSFORMER] = load_sharded_transformer(
                model_dir, parallelism, plan, torch_dtype, quantization_config=quantization_config
            )
        loaded |= load_text_encoders(model_dir, encoders, torch_dtype)
    pipe = _assemble(model_dir, torch_dtype, loaded)
    _check_kept(pipe, loaded)
    if mesh is not None:
        rest = {name: plan for name, plan in plans.items() if name not in loaded and name in pipe.components}
        parallelize_with(pipe, parallelism, rest, exclude=tuple(loaded))
    pipe = pipe.to(device)  # moves the whole components; the sharded ones are already there
    if compiler is not None:
        compile_denoisers(pipe, compiler)
    return pipe


def _assemble(model_dir, torch_dtype, loaded: dict):
    """The pipeline object around the components already `loaded`; diffusers reads the rest."""
    if is_modular(model_dir):  # diffusers' ModularPipeline (FLUX.3): `modular.py`
        pipe = build_modular(model_dir)
        load_rest(pipe, model_dir, torch_dtype, loaded)
        return ModularRunner.wrap(pipe)
    return pipeline_class(model_dir).from_pretrained(model_dir, **loaded, torch_dtype=torch_dtype)


def _whole_transformer(model_dir, torch_dtype, quantization_config, attention_backend):
    """The transformer loaded by diffusers itself (no mesh), quantized by diffusers' config, on `attention_backend`."""
    kernel = check_attention_backend(attention_backend)
    quantized = {} if quantization_config is None else {"quantization_config": diffusers_config(quantization_config)}
    model = transformer_class(model_dir).from_pretrained(
        model_dir, subfolder=TRANSFORMER, torch_dtype=torch_dtype, **quantized
    )
    set_attention_backend(model, kernel)
    return model


def _plan(value):
    """A Plan, WHOLE, or a bundled plan name / YAML path read into a Plan."""
    return load_plan(value) if isinstance(value, (str, Path)) else value


def prepare_text_encoders(model_dir, parallelism: Parallelism, dtype, *, skip=()) -> dict:
    """`{name: (skeleton, Prepared)}` for every transformers component of the pipeline that has a plan (its
    text encoders), except those in `skip`: built on meta from `<model_dir>/<name>/config.json` and checked
    on the mesh's `tp` axis (`prepare_component`: the first of its bundled plans that fits). Nothing is read;
    a component without a plan is left out (diffusers loads it whole)."""
    prepared = {}
    for name, cls in transformers_components(model_dir).items():
        if name in skip:
            continue
        model = build_skeleton(cls, os.path.join(model_dir, name), dtype)
        ready = prepare_component(name, model, parallelism)
        if ready is not None:
            prepared[name] = (model, ready)
    return prepared


def load_text_encoders(model_dir, prepared: dict, dtype) -> dict:
    """`{name: model}`: each prepared text encoder filled shard-on-load from `<model_dir>/<name>/` (this rank
    reads only its slice of every sharded tensor)."""
    for name, (model, ready) in prepared.items():
        load_prepared(model, ready, os.path.join(model_dir, name), dtype)
    return {name: model for name, (model, _) in prepared.items()}


def transformers_components(model_dir) -> dict:
    """`{name: class}` of the pipeline's transformers model components (text encoders; not tokenizers)."""
    import transformers

    found = {}
    modular = is_modular(model_dir)  # entries [library, class, spec]; a component without files here is not loaded
    for name, entry in _model_index(model_dir).items():
        if not isinstance(entry, list) or len(entry) != (3 if modular else 2):
            continue
        if modular and not os.path.isdir(component_folder(model_dir, name)):
            continue
        if entry[0] == "transformers" and entry[1]:
            cls = getattr(transformers, entry[1], None)
            if is_transformers_class(cls):
                found[name] = cls
    return found


def load_sharded_transformer(model_dir, parallelism: Parallelism, plan, dtype, *, quantization_config=None):
    """The pipeline's transformer, sharded with `plan` (Plan or None = bundled) as `parallelism` says (TP on the
    `tp` axis; the plan's context parallelism when the `cp` axis is > 1; FSDP over the non-tp axes with `fsdp`).
    Shard-on-load: each rank reads only its own slice of every sharded tensor and moves only that slice to the
    device (no full copy of the transformer on any rank)."""
    directory = os.path.join(model_dir, TRANSFORMER)
    model, _ = load_with(transformer_class(model_dir), directory, parallelism, _plan(plan), dtype, quantization_config)
    return model


def pipeline_class(model_dir):
    """The pipeline's own class, as named in model_index.json (DiffusionPipeline when diffusers has no such name).

    Loading through the class itself, not `DiffusionPipeline.from_pretrained`: diffusers 0.42 sorts the passed
    components by DiffusionPipeline's own (empty) `_optional_components`, so a component the pipeline declares
    optional (WanPipeline's `transformer`, `transformer_2`) is read again from disk, whole, and the sharded one
    passed in is dropped without a word."""
    import diffusers

    name = _model_index(model_dir).get("_class_name")
    found = getattr(diffusers, name, None) if isinstance(name, str) else None
    if isinstance(found, type) and issubclass(found, diffusers.DiffusionPipeline):
        return found
    return diffusers.DiffusionPipeline


def _check_kept(pipe, loaded: dict) -> None:
    """Every component dtp loaded (sharded) is the one the pipeline holds; else the pipeline would run whole."""
    dropped = [name for name, module in loaded.items() if pipe.components.get(name) is not module]
    if dropped:
        raise CheckpointError(
            f"{type(pipe).__name__}.from_pretrained replaced the sharded {', '.join(dropped)} with a whole copy "
            f"read from disk; this diffusers version does not keep passed components for this pipeline."
        )


def transformer_class(model_dir):
    """The diffusers class of the pipeline's transformer, as named in model_index.json; CheckpointError when
    `model_dir` is not a diffusers pipeline folder or names no diffusers transformer."""
    import diffusers

    entry = _model_index(model_dir).get(TRANSFORMER)
    if not entry or entry[1] is None or not hasattr(diffusers, entry[1]):
        raise CheckpointError(
            f"{Path(model_dir) / 'model_index.json'} names no diffusers transformer component ({entry!r}); dtp "
            f"shards a pipeline's transformer."
        )
    return getattr(diffusers, entry[1])


def check_pipeline_files(model_dir, dtype=None) -> None:
    """The shard-on-load checks of the files of the transformer and the text encoders (`precheck.check_files`):
    a one-process load, which diffusers does, fails with the same `CheckpointError` as the sharded one."""
    check_files(transformer_class(model_dir), os.path.join(model_dir, TRANSFORMER), dtype)
    for name, cls in transformers_components(model_dir).items():
        check_files(cls, os.path.join(model_dir, name), dtype)


def _model_index(model_dir) -> dict:
    """The pipeline's model_index.json (a modular pipeline's modular_model_index.json); CheckpointError when
    `model_dir` is not a diffusers pipeline folder."""
    if is_modular(model_dir):
        return modular_index(model_dir)
    path = Path(model_dir) / "model_index.json"
    if not path.is_file():
        found = "does not exist" if not Path(model_dir).exists() else f"has no {path.name}"
        raise CheckpointError(
            f"--model-dir {model_dir} {found}; pass a diffusers pipeline folder (the one holding model_index.json, "
            f"e.g. downloaded with huggingface_hub.snapshot_download)."
        )
    return json.loads(path.read_text())
