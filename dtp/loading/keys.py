"""Which checkpoint tensor fills which model key: renames, ties read once, ignored keys; every mismatch refused.

Runs on the checkpoint's headers and the meta skeleton only, before a byte is read. A diffusers
checkpoint must hold exactly the model's state dict (a tie may be stored once); a transformers one is
mapped as transformers maps it (`text.key_renamer`, `text.ignored_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from . import text
from .checkpoint import Checkpoint, CheckpointError


@dataclass(frozen=True)
class KeyMap:
    """Which checkpoint tensor fills which model key: `reads` (model key -> checkpoint key, each read once)
    and `aliases` (model key -> the key in `reads` whose Parameter it shares: a tie, read once)."""

    reads: dict[str, str]
    aliases: dict[str, str]


def match_keys(
    checkpoint: Checkpoint,
    expected: dict[str, tuple[int, ...]],
    model_name: str,
    *,
    rename=None,
    ties: tuple[tuple[str, ...], ...] = (),
    ignore=None,
    optional: frozenset[str] = frozenset(),
) -> KeyMap:
    """Map the checkpoint onto the model's state dict (`expected`: key -> shape); CheckpointError on any mismatch.

    rename: checkpoint key -> model key (default: the same; transformers renames, `text.key_renamer`).
    ties: groups of model keys that are one Parameter; one member in the checkpoint fills the group
        (the first present is read, the others are not read at all).
    ignore: `(missing, unexpected) -> (missing, unexpected)` less the keys the model's library ignores;
        of the missing keys only those in `optional` (buffers the skeleton holds for real) may be ignored.
    """
    rename = rename or (lambda key: key)
    renamed: dict[str, str] = {}
    for key in checkpoint.tensors:
        target = rename(key)
        if target in renamed:
            raise CheckpointError(
                f"checkpoint '{checkpoint.directory}': tensors '{renamed[target]}' and '{key}' both map to "
                f"{model_name}'s '{target}'; keep one of them."
            )
        renamed[target] = key
    reads = {target: key for target, key in renamed.items() if target in expected}
    aliases = _tie_aliases(reads, ties)
    missing = {k for k in expected if k not in reads and k not in aliases}
    unexpected = set(renamed) - set(expected)
    if ignore is not None:
        left, unexpected = ignore(missing, unexpected)
        missing = set(left) | (missing - optional)
    unexpected = sorted(unexpected, key=list(renamed).index)
    _refuse_missing(checkpoint, [k for k in expected if k in missing], [renamed[k] for k in unexpected], model_name)
    _refuse_unexpected(checkpoint, unexpected, renamed, model_name)
    for target, key in reads.items():
        found, shape = checkpoint.tensors[key].shape, expected[target]
        if tuple(found) != tuple(shape):
            raise CheckpointError(
                f"checkpoint '{checkpoint.directory}', tensor {_named(key, target)}: checkpoint shape {list(found)} != "
                f"model shape {list(shape)} ({model_name}); config.json and the weights disagree."
            )
    return KeyMap(reads, aliases)


def _tie_aliases(reads: dict[str, str], ties) -> dict[str, str]:
    """Per tie group held by the checkpoint: every other member -> the first member present (dropped from `reads`)."""
    aliases = {}
    for group in ties:
        held = [k for k in group if k in reads]
        for key in group:
            if held and key != held[0]:
                aliases[key] = held[0]
                reads.pop(key, None)
    return aliases


def _refuse_missing(checkpoint: Checkpoint, missing: list[str], unexpected: list[str], model_name: str) -> None:
    if missing:
        also = (
            f" It also holds {len(unexpected)} tensors {model_name} does not ({_listing(unexpected, 3)}): "
            f"are its keys named differently (a checkpoint conversion dtp does not know)?"
            if unexpected
            else ""
        )
        raise CheckpointError(
            f"checkpoint '{checkpoint.directory}' lacks {len(missing)} of {model_name}'s tensors: "
            f"{_listing(missing)}. Is it a checkpoint of this model class and config?{also}"
        )


def _refuse_unexpected(checkpoint: Checkpoint, unexpected: list[str], renamed: dict[str, str], model_name: str):
    if unexpected:
        raise CheckpointError(
            f"checkpoint '{checkpoint.directory}' has {len(unexpected)} tensors {model_name} does not: "
            f"{_listing(unexpected, show=lambda k: _named(renamed[k], k))}. Is config.json the one saved with these "
            f"weights?"
        )


def model_keymap(model: nn.Module, checkpoint: Checkpoint, transformers_model: bool) -> KeyMap:
    """The checkpoint mapped onto the model's state dict (`match_keys`), with transformers' renames
    and ignored keys for a transformers model."""
    state = model.state_dict()
    expected = {k: tuple(v.shape) for k, v in state.items()}
    options = {}
    if transformers_model:
        options = dict(
            rename=text.key_renamer(model, set(expected)),
            ignore=lambda missing, unexpected: text.ignored_keys(model, missing, unexpected),
            optional=frozenset(name for name, _ in model.named_buffers()),
        )
    return match_keys(checkpoint, expected, type(model).__name__, ties=tie_groups(model, expected), **options)


def tie_groups(model: nn.Module, expected) -> tuple[tuple[str, ...], ...]:
    """Groups of state-dict keys that are one Parameter (T5's `shared.weight`, `encoder.embed_tokens.weight`)."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if name in expected:
            groups.setdefault(id(param), []).append(name)
    return tuple(tuple(names) for names in groups.values() if len(names) > 1)


def _named(stored: str, target: str) -> str:
    """A checkpoint key as stored, and as the model calls it when transformers renames it."""
    return f"'{stored}'" if stored == target else f"'{stored}' (-> '{target}')"


def _listing(keys: list[str], limit: int = 10, show=lambda key: f"'{key}'") -> str:
    shown = ", ".join(show(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
