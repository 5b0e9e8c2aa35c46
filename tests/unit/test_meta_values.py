"""`meta_values.KnownValues`: meta tensors computed from known values carry them; unknown data erases them.

Independent constructions: each expected value or shape is the same op run on CPU tensors.
"""

import pytest
import torch

from dtp.resolve.exactness.meta_values import KnownValues, attach, values_run


def known(value: torch.Tensor) -> torch.Tensor:
    return attach(value.to("meta"), value)


def unknown(*shape) -> torch.Tensor:
    """A tensor without a value, like a weight of the meta copy: made outside `KnownValues`."""
    return torch.empty(*shape, device="meta")


def test_repeat_interleave_nonzero_and_tolist_of_known_values():
    """Qwen-Image 2.1's image-token layout: mask [F, T, T], 4 tokens per image slot -> 9 positions, 8 of them image."""
    mask, activation = torch.tensor([False, True, True]), unknown(1, 3, 16)
    with KnownValues():
        repeats = torch.where(known(mask), 4, 1)
        pad_mask = torch.repeat_interleave(known(mask), repeats)
        joint = activation.repeat_interleave(repeats, dim=1)
        positions = pad_mask.nonzero(as_tuple=True)[0].tolist()
    expected = torch.repeat_interleave(mask, torch.where(mask, 4, 1))
    assert pad_mask.is_meta and joint.shape == (1, 9, 16)
    assert positions == expected.nonzero(as_tuple=True)[0].tolist() == list(range(1, 9))


def test_bool_index_of_an_unknown_tensor():
    """x[:, mask] = y on meta needs the mask's count: 8 of 9 positions."""
    mask, joint, hidden = torch.tensor([False] + [True] * 8), unknown(1, 9, 16), unknown(1, 8, 16)
    with KnownValues():
        joint[:, known(mask)] = hidden
        picked = joint[:, known(mask)]
    assert picked.shape == torch.zeros(1, 9, 16)[:, mask].shape == (1, 8, 16)


def test_factories_and_data_on_meta_carry_values():
    """torch.arange / torch.tensor(device="meta") inside the run: .tolist() and .item() give the values."""
    clone = torch.nn.Module()
    with values_run(clone, {}):
        steps = torch.arange(5, device="meta") * 2
        sizes = torch.tensor([3, 4], device="meta")
        assert steps.tolist() == [0, 2, 4, 6, 8]
        assert (sizes[0] * sizes[1]).item() == 12


def test_unknown_data_written_into_a_view_erases_the_value():
    """The negative control: ids[1:3] = an activation's values -> ids (the base of that view) has no value."""
    activation = unknown(2)
    with KnownValues():
        ids = torch.zeros(4, dtype=torch.long, device="meta")
        ids[0:1] = known(torch.tensor([7]))
        assert ids.tolist() == [7, 0, 0, 0]
        ids[1:3] = activation.long()
        with pytest.raises((NotImplementedError, RuntimeError)):
            ids.tolist()


def test_every_expert_runs_and_meta_autocast_is_off():
    """A MoE layer of the copy (`moe_infer`, `experts`) runs all of its experts; autocast("meta") does not raise."""

    class MoE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

        def moe_infer(self, x, indices, weights):
            raise AssertionError("replaced in the meta copy")

    moe, calls = MoE().to("meta"), []
    for expert in moe.experts:
        expert.register_forward_hook(lambda m, a, o: calls.append(m))
    tokens = unknown(6, 4)
    with values_run(moe, {}), torch.autocast("meta", torch.float32):
        out = moe.moe_infer(tokens, None, None)
    assert out.shape == (6, 4) and calls == list(moe.experts)
