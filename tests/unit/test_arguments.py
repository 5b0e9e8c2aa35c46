"""`runtime.arguments.Binder` against `inspect.Signature.bind`: the same arguments by name for positional, keyword and
defaulted calls; replacements land where each argument was passed; `*args` / `**kwargs` fall back to `bind`."""

import inspect

import pytest

from dtp.runtime.arguments import Binder


def attention(query, key, value, attn_mask=None, dropout_p=0.0, *, scale=None, backend=None):
    return query, key, value, attn_mask, dropout_p, scale, backend


def loose(hidden_states, *args, temb=None, **kwargs):
    return hidden_states, args, temb, kwargs


CALLS = [
    ((1, 2, 3), {}),
    ((1, 2, 3, 4), {"scale": 0.5}),
    ((1,), {"key": 2, "value": 3, "backend": "flash"}),
    ((), {"query": 1, "key": 2, "value": 3, "dropout_p": 0.1}),
]


@pytest.mark.parametrize("args,kwargs", CALLS)
def test_arguments_as_bind_gives_them(args, kwargs):
    bound = inspect.signature(attention).bind(*args, **kwargs)
    bound.apply_defaults()
    assert Binder(attention).arguments(args, kwargs) == dict(bound.arguments)


@pytest.mark.parametrize("args,kwargs", CALLS)
def test_replaced_arguments_reach_the_function_by_name(args, kwargs):
    binder = Binder(attention)
    assert binder.get(args, kwargs, "attn_mask") == (args[3] if len(args) > 3 else None)
    new_args, new_kwargs = binder.replace(args, kwargs, {"key": 20, "value": 30})
    assert len(new_args) == len(args)  # each stays where it was passed
    assert attention(*new_args, **new_kwargs)[:3] == (1, 20, 30)


def test_var_arguments_fall_back_to_bind():
    binder = Binder(loose)
    assert not binder.exact
    assert binder.arguments((1, 2), {"temb": 3, "extra": 4}) == {
        "hidden_states": 1, "args": (2,), "temb": 3, "kwargs": {"extra": 4}
    }  # fmt: skip


def keywords(hidden_states, encoder_hidden_states=None, **kwargs):  # diffusers' Attention.forward
    return hidden_states, encoder_hidden_states, kwargs


def test_get_and_replace_through_var_keywords():
    """A `**kwargs` signature (no `*args`) keeps fixed positions: `get` / `replace` find a name it declares and one
    that lands in `**kwargs` (`image_rotary_emb`), with no `bind` (which dynamo cannot trace)."""
    binder = Binder(keywords)
    assert binder.fixed_positions and not binder.exact and not Binder(loose).fixed_positions
    args, kwargs = (1, 2), {"image_rotary_emb": 3}
    assert (binder.get(args, kwargs, "encoder_hidden_states"), binder.get(args, kwargs, "image_rotary_emb")) == (2, 3)
    new_args, new_kwargs = binder.replace(args, kwargs, {"encoder_hidden_states": 20, "image_rotary_emb": 30})
    assert keywords(*new_args, **new_kwargs) == (1, 20, {"image_rotary_emb": 30})


def test_map_argument_where_it_was_passed():
    """`map_argument` replaces one argument by a function of it: through `**kwargs` without `bind`, through `*args`
    with it (the grid and embed hooks of runtime/cp call it)."""
    binder = Binder(keywords)
    args, kwargs = binder.map_argument((1,), {"image_rotary_emb": 3}, "image_rotary_emb", lambda v: v * 10)
    assert keywords(*args, **kwargs) == (1, None, {"image_rotary_emb": 30})
    args, kwargs = Binder(loose).map_argument((1, 2), {"temb": 3}, "temb", lambda v: v + 1)
    assert loose(*args, **kwargs) == (1, (2,), 4, {})
