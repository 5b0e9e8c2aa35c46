"""colwise_gathered: its math, its resolve rules (no partner, out dim constrains tp) and the collective counter."""

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import parallelize_module

import dtp
from dtp import Plan, PlanError, Rule, Style, tp_candidates
from dtp.analysis.collectives import CollectiveCounter, block_paths, implied_collectives
from dtp.analysis.fakepg import fake_world
from dtp.resolve import LinearSpec, resolve
from dtp.resolve.layout import local_slice
from dtp.runtime.mesh import make_mesh, tp_submesh
from dtp.styles.parallel import GatheredColwise


class Block(nn.Module):
    """An attention-like module (integer `heads`) with a modulation Linear and a colwise -> rowwise pair."""

    def __init__(self, dim=8, heads=4, mod_out=6):
        super().__init__()
        self.heads = heads
        self.mod = nn.Linear(dim, mod_out)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.down(self.up(x))


class Toy(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.blocks = nn.ModuleList([Block(**kw), Block(**kw)])


@settings(max_examples=40, deadline=None)
@given(tp=st.integers(1, 8), per_rank=st.integers(1, 6), dim=st.integers(1, 8), batch=st.integers(1, 3))
def test_rank_outputs_concatenated_in_rank_order_are_the_full_output(tp, per_rank, dim, batch):
    """y = x W^T + b == cat_r(x W_r^T + b_r): what the all-gather along the last dim rebuilds (exact)."""
    g = torch.Generator().manual_seed(tp * 1000 + per_rank * 10 + dim)
    # Small integers in float64: every product and sum is exact, so equality must be exact too.
    w = torch.randint(-4, 5, (tp * per_rank, dim), generator=g).double()
    b = torch.randint(-4, 5, (tp * per_rank,), generator=g).double()
    x = torch.randint(-4, 5, (batch, dim), generator=g).double()
    sizes = (w.shape[0],)
    pieces = [x @ local_slice(w, 0, sizes, tp, r).T + local_slice(b, 0, sizes, tp, r) for r in range(tp)]
    assert torch.equal(torch.cat(pieces, dim=-1), x @ w.T + b)


def test_style_parses_and_is_colwise_sharded():
    plan = Plan.from_dict({"blocks.*.mod": "colwise_gathered"})
    assert plan.rules[0].style is Style.COLWISE_GATHERED
    assert Style.COLWISE_GATHERED.shard_dim == 0 and Style.COLWISE_GATHERED.gathers_output
    with pytest.raises(PlanError, match="only applies to packed styles"):
        Plan.from_dict({"blocks.*.mod": {"style": "colwise_gathered", "blocks": [1, 1]}})


def test_gathered_needs_no_rowwise_partner_but_colwise_does():
    resolved = resolve(Plan.from_dict({"blocks.*.mod": "colwise_gathered"}), Toy())
    assert [s.path for s in resolved.linears] == ["blocks.0.mod", "blocks.1.mod"]
    assert resolved.param_layouts()["blocks.0.mod.bias"] == dtp.Layout(0, (6,))
    with pytest.raises(PlanError, match="no rowwise layer"):
        resolve(Plan.from_dict({"blocks.*.mod": "colwise"}), Toy())


def test_gathered_does_not_feed_a_rowwise_layer():
    """A rowwise layer whose only colwise neighbour is gathered is fed a whole activation: refused."""
    plan = Plan.from_dict({"blocks.*.mod": "colwise_gathered", "blocks.*.down": "rowwise"})
    with pytest.raises(PlanError, match="no colwise layer"):
        resolve(plan, Toy())


def test_gathered_does_not_make_its_parent_an_attention_module():
    """Head counts follow sharded q/k/v only; a gathered output leaves the head layout alone."""
    assert resolve(Plan.from_dict({"blocks.*.mod": "colwise_gathered"}), Toy()).attention == ()
    paired = resolve(Plan.from_dict({"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}), Toy())
    assert [a.path for a in paired.attention] == ["blocks.0", "blocks.1"]


def test_out_dim_of_a_gathered_linear_constrains_tp():
    """mod_out = 6 under heads = 4: only tp in {1, 2} divides both."""
    plan = Plan.from_dict({"blocks.*.mod": "colwise_gathered", "blocks.*.up": "colwise", "blocks.*.down": "rowwise"})
    resolved = resolve(plan, Toy(heads=4, mod_out=6))
    assert resolved.candidates() == [1, 2]
    with pytest.raises(PlanError, match=r"tp=4 does not divide heads=4|tp=4 does not divide dim 0 of blocks.0.mod=6"):
        resolved.check_tp(4)
    only_gathered = resolve(Plan.from_dict({"blocks.*.mod": "colwise_gathered"}), Toy(mod_out=6))
    assert only_gathered.candidates() == [1, 2, 3, 6]
    assert tp_candidates(Toy(mod_out=6), Plan.from_dict({"blocks.*.mod": "colwise_gathered"})) == [1, 2, 3, 6]
    with pytest.raises(PlanError, match=r"dim 0 of blocks.0.mod=6 \(key .blocks.\*.mod.\).*Supported tp: 1, 2, 3, 6\."):
        only_gathered.check_tp(4)


def test_counter_agrees_with_comm_debug_mode_on_a_gathered_linear():
    """A gathered Linear at tp=4 (fake process group): one all-gather of its [batch, out] output."""
    linear = nn.Linear(8, 12)
    with fake_world(4):
        mesh = tp_submesh(make_mesh(tp=4, device_type="cpu"))
        spec = LinearSpec("linear", Rule("linear", Style.COLWISE_GATHERED), (12,), has_bias=True)
        parallelize_module(linear, mesh, GatheredColwise(spec))
        x = torch.randn(3, 8)
        with CommDebugMode() as torch_counts:
            linear(x)
        with CollectiveCounter() as ours:
            out = linear(x)
    assert out.shape == (3, 12) and not hasattr(out, "placements")  # a plain, whole tensor
    assert sum(torch_counts.get_comm_counts().values()) == 1
    assert ours.counts() == {"all_gather_into_tensor": 1}
    assert ours.records[0].bytes == 3 * 12 * 4


def test_counter_sees_c10d_calls_and_attributes_blocks():
    toy = Toy()
    toy.blocks[1].register_forward_hook(lambda m, i, o: dist.all_reduce(o))
    with fake_world(2), CollectiveCounter(toy) as counter:
        for block in toy.blocks:
            block(torch.ones(1, 8))
        dist.all_reduce(torch.ones(5))
    assert block_paths(toy) == ["blocks.0", "blocks.1"]
    assert [(r.op, r.scope, r.bytes) for r in counter.records] == [
        ("all_reduce", "blocks.1", 32),
        ("all_reduce", "", 20),
    ]


class ToyWithNet(Toy):
    """Toy's blocks, then a FeedForward-like `net` ModuleList whose elements are the Linears themselves."""

    def __init__(self):
        super().__init__()
        self.net = nn.ModuleList([nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)])

    def forward(self, x):
        for module in (*self.blocks, *self.net):
            x = module(x)
        return x


def test_implied_scopes_are_the_counters_when_a_planned_linear_is_a_block():
    """`net.2` is an element of a ModuleList, so the counter scopes its all-reduce to block "net.2": the implied
    count must name the same scope (it put it at the root "": GLM-Image's glyph / prior projectors, full tier)."""
    rules = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise", "net.0": "colwise", "net.2": "rowwise"}
    plan = Plan.from_dict(rules)
    model = ToyWithNet()
    implied = implied_collectives(resolve(plan, model), model)
    with fake_world(2):
        dtp.parallelize(model, make_mesh(tp=2, device_type="cpu"), plan)
        with torch.no_grad(), CollectiveCounter(model) as counter:
            model(torch.ones(1, 8))
    measured = {scope: dict(counter.counts(scope)) for scope in {r.scope for r in counter.records}}
    assert measured == {"blocks.0": {"all_reduce": 1}, "blocks.1": {"all_reduce": 1}, "net.2": {"all_reduce": 1}}
    assert {scope: dict(ops) for scope, ops in implied.items()} == measured
