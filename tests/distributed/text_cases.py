"""Worker side of the text-encoder parity tests: one spawned group runs every tiny text encoder."""

import torch

import dtp
from dtp.runtime.memory import local_param_bytes
from dtp.testing.tiny_text import TEXT_CLASSES, hidden_states, tiny_text_inputs, tiny_text_model


@torch.no_grad()
def run_text_cases(rank, world_size, tp):
    """Per class: (max over hidden states of max |sharded - ref| / max |ref|, local bytes / whole bytes)."""
    mesh = dtp.make_mesh(tp=tp)
    inputs = tiny_text_inputs()
    results = {}
    for cls in TEXT_CLASSES:
        reference = tiny_text_model(cls)
        ref = hidden_states(reference, inputs)
        sharded = dtp.parallelize(tiny_text_model(cls), mesh)  # the bundled plan, via plan_for
        out = hidden_states(sharded, inputs)
        assert len(out) == len(ref), cls
        relative = max(float((o - r).abs().max() / r.abs().max()) for o, r in zip(out, ref))
        results[cls] = (relative, local_param_bytes(text_part(sharded)) / local_param_bytes(text_part(reference)))
    return results


def text_part(model):
    """What a text-to-image pipeline runs: a vision-language class's language model (its vision tower stays whole)."""
    inner = getattr(model, "model", None)
    return getattr(inner, "language_model", model)
