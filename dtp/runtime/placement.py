"""Where this rank's tensors go: cuda:<local rank>, the local Neuron core, or cpu."""

from __future__ import annotations

import importlib
import os

import torch

from ..errors import PlanError
from ..policy import default_device_type


def local_rank() -> int:
    """This process's index on its node (torchrun and `dtp.launch` set LOCAL_RANK; 0 when unset)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_device(device: str | torch.device | None = None) -> torch.device:
    """The device this rank should use; `device` is a device, a type ("cuda", "neuron", "cpu") or None.

    A type without an index gets the local rank as index, so with torchrun every rank of a node
    lands on its own accelerator: `local_device("cuda")` on LOCAL_RANK=3 is `cuda:3`. None picks
    the first available type (cuda, then neuron, then cpu), the same order as `make_mesh`.
    """
    if isinstance(device, torch.device) and device.index is not None:
        return device
    kind = torch.device(device).type if isinstance(device, torch.device) else device
    kind = kind or default_device_type()
    if kind == "cpu":
        return torch.device("cpu")
    if ":" in kind:
        return torch.device(kind) if kind.split(":")[0] != "neuron" else _neuron_device(int(kind.split(":")[1]))
    if kind == "neuron":
        return _neuron_device(local_rank())
    return torch.device(kind, local_rank())


def _neuron_device(index: int) -> torch.device:
    # torch-neuronx registers the "neuron" device type when imported; torch alone does not know it.
    importlib.import_module("torch_neuronx")
    return torch.device("neuron", index)


def check_device(device: torch.device, mesh) -> None:
    """`device` must be of the mesh's device type, or DTensor would move every local slice back there."""
    if device.type != mesh.device_type:
        raise PlanError(
            f"device {device} does not match the mesh's device type '{mesh.device_type}'; build the mesh with "
            f"dtp.make_mesh(..., device_type='{device.type}') or pass device='{mesh.device_type}'."
        )
