"""The model skeleton for shard-on-load: parameters on the meta device, buffers real."""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

from ..quant.load import prequantized_problem
from .checkpoint import CheckpointError


def build_on_meta(model_class, directory: str, torch_dtype: torch.dtype | None) -> nn.Module:
    """`model_class` from `directory`/config.json with parameters on meta and buffers real (on CPU).

    Buffers are built for real because a checkpoint does not hold the non-persistent ones (RoPE
    tables, positional embeddings): constructing them is the only way to get them. Like diffusers,
    the model is built under `torch_dtype` as default dtype, so buffers get the dtype they would get there.
    """
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise CheckpointError(
            f"checkpoint '{directory}' has no config.json; pass the model folder (or `subfolder=`, e.g. 'transformer')."
        )
    config = model_class.load_config(directory)
    problem = prequantized_problem(config)
    if problem is not None:
        raise CheckpointError(f"checkpoint '{directory}' cannot be loaded shard-on-load: {problem}.")
    with default_dtype(torch_dtype), parameters_on_meta():
        return model_class.from_config(config)


@contextlib.contextmanager
def parameters_on_meta():
    """Every parameter registered inside the block is moved to the meta device; buffers are left alone.

    Initialization then runs on meta (free); the CPU tensor a layer creates for its parameter is
    dropped right after registration, before anything writes to it. A parameter registered again
    under a second name (transformers ties `encoder.embed_tokens.weight` to `shared.weight` that way)
    is already on meta and stays the same object, so the tie survives.
    """
    original = nn.Module.register_parameter

    def register(module, name, param):
        original(module, name, param)
        if param is not None and param.device.type != "meta":  # a meta one may be a tie: keep it, and the tie
            meta = module._parameters[name].to("meta")
            module._parameters[name] = type(param)(meta, requires_grad=param.requires_grad)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype | None):
    previous = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
