"""Full-size models without memory or GPUs: the meta device plus torch's fake process group.

A model built under `torch.device("meta")` has every parameter's shape and dtype but no storage,
so FLUX.2-dev (32 B parameters) builds in well under a second. torch's fake process group
(backend "fake") answers every collective without communicating, for any world size, in one
process: it lets `make_mesh` and `parallelize` run exactly as they would on rank 0 of `cp * tp`
ranks. Together they show the per-rank layout of a plan at full size on a laptop.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import torch
import torch.distributed as dist

from ..errors import PlanError
from ..families import example_inputs, model_class, released_overrides
from ..runtime.mesh import make_mesh


@contextlib.contextmanager
def fake_world(world_size: int):
    """Initialize torch's fake process group of `world_size` ranks (this process is rank 0).

    Refuses to replace a process group that is already initialized (it is not ours to destroy).
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers backend "fake"

    if dist.is_initialized():
        raise RuntimeError("fake_world: a process group is already initialized in this process.")
    _forget_dtensor_meshes()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        _forget_dtensor_meshes()


def fake_mesh(*, tp: int = 1, cp: int = 1, cfg: int = 1, device: str = "cpu", ulysses: int | None = None):
    """`make_mesh` inside `fake_world`, its device type `device`: a "cuda" mesh cannot be built on a CPU-only torch
    (DeviceMesh sets the CUDA device), so it is built on cpu and then labelled cuda before any submesh is taken;
    DTensor then keeps fake CUDA local tensors where they are (`from_local` moves a local tensor to the mesh's type)."""
    mesh = make_mesh(tp=tp, cp=cp, cfg=cfg, device_type="cpu", ulysses=ulysses)
    if device != "cpu":
        mesh._device_type = device
    return mesh


def _forget_dtensor_meshes() -> None:
    """Empty DTensor's sharding-propagation and redistribute-planner caches. A DeviceMesh compares equal to another
    of the same layout whatever its process groups, so an op cached in an earlier world could hand back an output spec
    holding that world's mesh, whose group names (numbered from 0 again in each world) this world lacks: "Could not
    resolve the process group registered under the name 7" in a fit trace run after other worlds in one process."""
    from torch.distributed.tensor import DTensor, _redistribute

    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ dispatch fast path's own cache
    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    propagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute.clear_redistribute_planner_cache()  # keyed by a weakref to the mesh, equal for equal meshes
    _redistribute._gen_transform_infos.cache_clear()


def default_config(class_name: str) -> dict:
    """The full-size config used when none is given: the class defaults plus the family's `RELEASED` overrides."""
    return released_overrides(class_name)


def config_arg(text: str | None, command: str) -> dict | None:
    """A `--config` value: inline JSON (`{"num_layers": 2}`) or a path to a diffusers config.json; None stays None."""
    if text is None:
        return None
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise PlanError(f"{command}: --config is not valid JSON ({exc}).") from None
    return read_config(text)


def read_config(path) -> dict:
    """A diffusers `config.json` (private `_` keys dropped); PlanError when it cannot be read."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise PlanError(f"config {path}: cannot read it as JSON ({exc}).") from None
    if not isinstance(data, dict):
        raise PlanError(f"config {path}: expected a JSON object, got {type(data).__name__}.")
    return {k: v for k, v in data.items() if not k.startswith("_")}


_BUILT: dict = {}  # (class, config, dtype) -> a meta model; each caller gets a deep copy (they shard it)
BUILT_KEPT = 4


def meta_model(class_name: str, config: dict | None = None, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A diffusers model of class `class_name` on the meta device (`config=None`: `default_config`). Built once per
    (class, config, dtype) and deep-copied (a meta copy costs next to nothing; diffusers' build of FLUX.1-dev is half
    of `dtp check flux`'s CPU time, and check builds it twice: the sharded model and the one-rank reference)."""
    return copy.deepcopy(built_meta_model(class_name, config, dtype))


def built_meta_model(class_name: str, config: dict | None = None, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """The one build `meta_model` copies, shared by every caller: read it or copy from it (`trace.cut_copy`), never
    mutate it."""
    key = (class_name, json.dumps(config, sort_keys=True, default=str), str(dtype))
    if key not in _BUILT:
        if len(_BUILT) >= BUILT_KEPT:
            _BUILT.pop(next(iter(_BUILT)))
        _BUILT[key] = _build_meta(class_name, config, dtype)
    return _BUILT[key]


def _build_meta(class_name: str, config: dict | None, dtype: torch.dtype | None) -> torch.nn.Module:
    cls = model_class(class_name)
    kwargs = default_config(class_name) if config is None else config
    with torch.device("meta"):
        model = cls.from_config(kwargs)
    if dtype is not None:
        with _quiet_diffusers():  # its "modules to keep in float32" advice is about loading real weights
            model = model.to(dtype)
    return model.eval()


@contextlib.contextmanager
def _quiet_diffusers():
    from diffusers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def meta_inputs(
    class_name: str, config, dtype: torch.dtype, *, img_tokens: int, txt_tokens: int, batch: int = 1
) -> dict:
    """Forward kwargs for a full-size model of a bundled architecture, as meta tensors.

    The shapes come from the same builders as the tiny inputs (`dtp/families/`), fed the full config; the
    values are never read. Floating tensors take the model's dtype. PlanError for other classes.
    """
    kwargs = example_inputs(class_name, dict(config), seed=0, batch=batch, img_tokens=img_tokens, txt_tokens=txt_tokens)
    if config.get("guidance_embeds") and "guidance" not in kwargs:
        kwargs["guidance"] = torch.full((batch,), 3.5)
    return {name: _to_meta(value, dtype) for name, value in kwargs.items()}


def _to_meta(value, dtype: torch.dtype):
    if isinstance(value, list):
        return [_to_meta(v, dtype) for v in value]
    if not isinstance(value, torch.Tensor):
        return value
    return value.to(device="meta", dtype=dtype if value.is_floating_point() else value.dtype)
