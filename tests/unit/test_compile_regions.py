"""Regional compile's pieces without a process group: which blocks `compile_blocks` compiles, the `compile=` values,
the counters `dtp run --report` prints (a recompile and a graph break must show), and the two CLI flags."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dtp.errors import PlanError
from dtp.pipeline.session import LoadOptions
from dtp.runtime.compile import CompileWatch, compile_backend, compile_blocks, is_compiled, repeated_blocks
from dtp.testing.tiny import tiny_model
from dtp.tools.commands import build_parser
from dtp.tools.run import load_options


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x, shift):
        return self.linear(x) + shift  # `shift` a Python float: a new value is a new guard


class Stack(nn.Module):  # no `_repeated_blocks`: the largest ModuleList's children are the regions
    def __init__(self):
        super().__init__()
        self.small = nn.ModuleList([nn.Linear(4, 4)])
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x, shift=0.5):
        for block in self.blocks:
            x = block(x, shift)
        return x


def test_the_repeated_blocks_are_the_models_own_else_its_largest_module_list():
    flux = tiny_model("FluxTransformer2DModel")
    expected = [*flux.transformer_blocks, *flux.single_transformer_blocks]
    assert repeated_blocks(flux) == expected
    stack = Stack()
    assert repeated_blocks(stack) == list(stack.blocks)
    with pytest.raises(PlanError, match="no nn.ModuleList"):
        repeated_blocks(nn.Linear(2, 2))


def test_compile_values():
    assert compile_backend(False) is None and compile_backend(None) is None
    assert compile_backend(True) == "inductor" and compile_backend("eager") == "eager"
    for wrong in ("turbo", 1):
        with pytest.raises(PlanError, match="dynamo backend"):
            compile_backend(wrong)


def test_the_watch_counts_graphs_a_recompile_and_a_break():
    """Step 1 compiles one graph for both blocks (one class); a new Python value in step 2 recompiles (negative
    control of `recompiles == 0` in the pipeline tests); a graph break shows in `graph_breaks`."""
    torch._dynamo.reset()
    stack = Stack()
    assert compile_blocks(stack, backend="eager") == 2 and is_compiled(stack)
    assert compile_blocks(stack, backend="eager") == 0  # twice is once
    watch, x = CompileWatch(), torch.ones(1, 4)
    with torch.no_grad():
        stack(x)
        watch.step_ended()
        stack(x)
        watch.step_ended()
        assert watch.report() == dict(graphs=1, recompiles=0, graph_breaks=0)
        stack(x, shift=0.25)
    assert watch.report()["recompiles"] >= 1

    class Breaks(nn.Module):
        def forward(self, x):
            torch._dynamo.graph_break()
            return x + 1

    watch = CompileWatch()
    torch.compile(Breaks(), backend="eager")(x)
    assert watch.report()["graph_breaks"] >= 1


def test_the_flags_reach_the_load_options(tmp_path):
    parser = build_parser()
    base = ["run", "--model-dir", str(tmp_path), "--prompt", "a cat"]
    assert load_options(parser.parse_args(base)).compile is None
    assert load_options(parser.parse_args([*base, "--compile"])).compile == "inductor"
    assert load_options(parser.parse_args([*base, "--compile", "eager"])).compile == "eager"
    options = load_options(parser.parse_args([*base, "--attention-backend", "_flash_3_hub"]))
    assert options.attention_backend == "_flash_3_hub" and LoadOptions(model_dir="x").attention_backend is None
    serve = parser.parse_args(["serve", "--model-dir", str(tmp_path), "--compile", "--attention-backend", "cudnn"])
    assert (serve.compile, serve.attention_backend) == ("inductor", "cudnn")
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--attention-backend", "warp"])
