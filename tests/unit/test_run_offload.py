"""`dtp run --offload-text-encoders`: the text encoders leave the accelerator at the transformer's first call, once."""

from __future__ import annotations

from types import SimpleNamespace

from torch import nn

from dtp.pipeline.generate import offload_text_encoders


class Recorder(nn.Module):
    def __init__(self, moves: list, name: str):
        super().__init__()
        self.moves, self.name = moves, name

    def to(self, *args, **kwargs):
        self.moves.append((self.name, args))
        return self

    def forward(self, x):
        return x


def test_text_encoders_move_to_cpu_at_the_first_transformer_call_only():
    moves = []
    transformer, vae = nn.Identity(), Recorder(moves, "vae")
    encoders = {"text_encoder": Recorder(moves, "te"), "text_encoder_2": Recorder(moves, "te2")}
    pipe = SimpleNamespace(transformer=transformer, components={"transformer": transformer, "vae": vae, **encoders})
    offload_text_encoders(pipe)
    encoders["text_encoder"](1)  # encoding: nothing moves yet
    assert moves == []
    transformer(1)
    transformer(2)
    assert moves == [("te", ("cpu",)), ("te2", ("cpu",))]  # once, the VAE stays
    assert not transformer._forward_pre_hooks
