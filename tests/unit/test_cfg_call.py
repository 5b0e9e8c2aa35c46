"""`runtime.cfg.call.CallTable` against `inspect.Signature.bind`: the same passed arguments, in the signature's order
(the cfg wrapper's signature of a call and its first argument, the latents, depend on it), for every way of passing a
transformer's arguments; the same TypeError for a call bind refuses; a call made again from them reaches the forward
as the original call did. Ulysses' whole-sequence attention on torch's SDPA equals diffusers' native backend."""

import inspect

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dtp.runtime.cfg.call import CallTable


def forward(hidden_states, timestep=None, encoder_hidden_states=None, attention_kwargs=None, *, return_dict=True):
    return hidden_states, timestep, encoder_hidden_states, attention_kwargs, return_dict


def loose(hidden_states, *args, temb=None, **kwargs):
    return hidden_states, args, temb, kwargs


NAMES = ("hidden_states", "timestep", "encoder_hidden_states", "attention_kwargs")


@given(
    positional=st.integers(0, 4),
    keywords=st.lists(st.sampled_from((*NAMES, "return_dict")), unique=True),
    order=st.randoms(use_true_random=False),
)
def test_arguments_as_bind_gives_them_in_signature_order(positional, keywords, order):
    args = tuple(range(positional))
    names = [n for n in keywords if n not in NAMES[:positional]]
    order.shuffle(names)  # keywords in any order: the dict is in the signature's
    kwargs = {n: f"v-{n}" for n in names}
    table = CallTable(inspect.signature(forward))
    try:
        expected = dict(inspect.signature(forward).bind(*args, **kwargs).arguments)
    except TypeError:
        with pytest.raises(TypeError):
            table.arguments(args, kwargs)
        return
    got = table.arguments(args, kwargs)
    assert list(got.items()) == list(expected.items())
    assert table.call(forward, got) == forward(*args, **kwargs)


def test_refused_calls_raise_as_bind_does():
    table = CallTable(inspect.signature(forward))
    for args, kwargs in [((1, 2, 3, 4, 5), {}), ((1,), {"hidden_states": 2}), ((), {"temb": 1}), ((), {})]:
        with pytest.raises(TypeError):
            table.arguments(args, kwargs)


def test_star_parameters_go_through_bind():
    table = CallTable(inspect.signature(loose))
    assert not table.by_name
    got = table.arguments((1, 2, 3), {"temb": 4, "extra": 5})
    assert got == dict(inspect.signature(loose).bind(1, 2, 3, temb=4, extra=5).arguments)
    assert table.call(loose, got) == loose(1, 2, 3, temb=4, extra=5)


def test_whole_attention_on_sdpa_equals_diffusers_native():
    """The shortcut (diffusers' native backend resolved: torch SDPA called directly) gives diffusers' own result; a
    named other backend goes through diffusers' dispatcher (`original`)."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    from dtp.runtime.cp.ulysses import whole_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 12, 3, 8) for _ in range(3))
    mask = (torch.rand(2, 12) > 0.3).view(2, 1, 1, 12)
    calls = []

    def original(*args, **kwargs):
        calls.append(kwargs.get("backend"))
        return dispatch_attention_fn(*args, **kwargs)

    for backend in (None, "native"):
        attend = whole_attention(original, backend, 0.3, {})
        got = attend(q, k, v, mask)
        assert torch.equal(got, dispatch_attention_fn(q, k, v, attn_mask=mask, scale=0.3, backend=backend))
    assert calls == []  # native: the dispatcher was not entered
    attend = whole_attention(original, "_native_math", 0.3, {})
    torch.testing.assert_close(attend(q, k, v, mask), dispatch_attention_fn(q, k, v, attn_mask=mask, scale=0.3))
    assert calls == ["_native_math"]
