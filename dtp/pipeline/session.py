"""A pipeline loaded once for many generations, as `dtp run` and `dtp serve` load it.

    options = LoadOptions(model_dir=..., cp=2, quant="int8wo", loras={"style": "style.safetensors"})
    pipe = open_pipeline(options, device, distributed=True)   # under torchrun: sharded over every rank
    pipe = open_pipeline(options, device, distributed=True, mesh=replica_mesh)   # over a given mesh

Under torchrun the mesh is built from the degrees (tp = world size / (cp x cfg)); without it the pipeline
is loaded whole in one process (the reference). LoRAs load under their names at `lora_scale` (a request may
re-weight them, as `set_adapters` does); `cache` names a step cache applied by `dtp.cache.apply_cache`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..adapters import load_lora_weights
from ..choices import DEFAULT_TIMEOUT_S
from ..errors import PlanError
from ..policy import parse_dtype, ulysses_degree
from ..quant import config_for
from ..runtime.launch import tp_degree
from ..runtime.mesh import make_mesh
from .generate import offload_text_encoders
from .load import check_pipeline_files, load_pipeline, transformers_components
from .parallelize import WHOLE

DEFAULT_LORA = "lora"  # the adapter name of a `--lora PATH` given without a name


@dataclass(frozen=True, kw_only=True)
class LoadOptions:
    model_dir: str
    plan: str | None = None  # the transformer's plan (default: its bundled one)
    cp: int = 1
    cfg: int = 1
    cp_mode: str = "ulysses"
    ulysses: int | None = None  # USP: the Ulysses degree inside cp (None: cp_mode's, `policy.ulysses_degree`)
    allow_cross_node: bool = False  # accept tp / Ulysses groups spanning nodes (`runtime/nodes.py`)
    pad: bool = False
    dtype: str = "auto"  # auto: bfloat16 on accelerators, float32 on CPU
    quant: str | None = None  # a dtp.quant scheme for the transformer's Linears
    loras: dict = field(default_factory=dict)  # adapter name -> LoRA file or folder
    lora_scale: float = 1.0
    whole_text_encoders: bool = False
    offload_text_encoders: bool = False
    fsdp: bool | int | str = False  # weights also sharded over the non-tp axes (FSDP2), or a unit size
    cache: str | None = None  # a step cache by name (dtp.cache)
    cache_threshold: float | None = None
    cache_steps: int | None = None  # MagCache's ratios are per step: `dtp run --steps`
    timeout: float = DEFAULT_TIMEOUT_S
    compile: str | None = None  # a dynamo backend: regional compile of the denoisers' blocks (runtime/compile.py)
    attention_backend: str | None = None  # the attention kernel (None: the library's default)


def parse_loras(values: list[str] | None) -> dict:
    """{name: path} of repeated `--lora [NAME=]PATH` values; a bare path is named "lora"."""
    loras = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        name, path = (name, path) if sep else (DEFAULT_LORA, value)
        if not name or not path:
            raise PlanError(f"--lora {value!r}: expected NAME=PATH or PATH.")
        if name in loras:
            raise PlanError(f"--lora: the name {name!r} is given twice; name each LoRA once (NAME=PATH).")
        loras[name] = path
    return loras


def torch_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return parse_dtype(name)


def open_pipeline(options: LoadOptions, device: torch.device, *, distributed: bool, mesh=None):
    """The pipeline of `options.model_dir`, sharded over the process group (`distributed`) or whole.

    `mesh`: shard over this mesh instead of one built from the degrees over the whole world (`dtp serve
    --replicas`: this rank's replica, a slice of a larger mesh); it implies `distributed`."""
    dtype = torch_dtype(options.dtype, device)
    common = dict(torch_dtype=dtype, device=device, quantization_config=quant_config(options))
    common |= kernel_options(options)
    distributed = distributed or mesh is not None
    if distributed:
        if mesh is None:
            mesh, cp_mode = pipeline_mesh(options, device)
        else:
            cp_mode = shard_mode(options)
        pipe = load_pipeline(
            options.model_dir, mesh, plans=component_plans(options), cp_mode=cp_mode, pad=options.pad,
            fsdp=options.fsdp, **common,
        )  # fmt: skip
    else:
        check_pipeline_files(options.model_dir, dtype)
        pipe = load_pipeline(options.model_dir, **common)
    add_loras(pipe, options.loras, options.lora_scale, sharded=distributed)
    if options.offload_text_encoders:
        offload_text_encoders(pipe)
    if options.cache is not None:
        from ..cache import apply_cache  # the step caches' package, imported only when one is asked for

        apply_cache(pipe, options.cache, options.cache_threshold, steps=options.cache_steps)
    return pipe


def pipeline_mesh(options: LoadOptions, device: torch.device):
    """(the mesh over the process group, the cp_mode to shard with): tp = world size / (cp x cfg); `ulysses`
    U = cp is Ulysses, U = 1 ring, 1 < U < cp USP (`make_mesh(cp=C, ulysses=U)`), the mode its groups mean."""
    tp = tp_degree(dist.get_world_size(), options.cp, options.cfg)
    mesh = make_mesh(
        tp=tp, cp=options.cp, cfg=options.cfg, device_type=device.type,
        ulysses=ulysses_degree(options.cp, options.cp_mode, options.ulysses), allow_cross_node=options.allow_cross_node,
    )  # fmt: skip
    return mesh, shard_mode(options)


def shard_mode(options: LoadOptions) -> str:
    """The cp_mode a `--ulysses U` means: "ring" for U = 1, "ulysses" otherwise (USP's groups decide the rest);
    `cp_mode` itself without --ulysses."""
    if options.ulysses is None:
        return options.cp_mode
    return "ring" if ulysses_degree(options.cp, options.cp_mode, options.ulysses) == 1 else "ulysses"


def kernel_options(options: LoadOptions) -> dict:
    """`load_pipeline`'s compile and attention keywords, each only when asked (a default load passes neither)."""
    found = {} if options.compile is None else {"compile": options.compile}
    if options.attention_backend is not None:
        found["attention_backend"] = options.attention_backend
    return found


def quant_config(options: LoadOptions):
    """The torchao config of `options.quant` (None without it)."""
    return None if options.quant is None else config_for(options.quant)


def component_plans(options: LoadOptions) -> dict:
    """`load_pipeline`'s plans: `plan` for the transformer; whole text encoders when asked (also implied by
    offloading them: a sharded encoder's DTensors stay on their mesh's device)."""
    plans = {} if options.plan is None else {"transformer": options.plan}
    if options.whole_text_encoders or options.offload_text_encoders:
        plans |= {name: WHOLE for name in transformers_components(options.model_dir)}
    return plans


def add_loras(pipe, loras: dict, scale: float, *, sharded: bool) -> None:
    """Each LoRA of `loras` ({name: path}) on the transformer, all active at weight `scale`: dtp's loader when
    the transformer is sharded, diffusers' own for the one-process reference."""
    for name, path in loras.items():
        if sharded:
            load_lora_weights(pipe, path, adapter_name=name)
        else:
            pipe.load_lora_weights(path, adapter_name=name)
    if loras:
        pipe.transformer.set_adapters(list(loras), weights=[scale] * len(loras))
