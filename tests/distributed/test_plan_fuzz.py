"""Property (hypothesis): a mutated plan is refused before any change, or exact against one process.

Plans of FLUX.1, FLUX.2, Qwen-Image, Wan, LTX-Video and T5 with 1-3 random edits (a style changed,
a rule dropped, a rule added on another Linear, an attention glob dropped, packed blocks changed;
pad on or off; `dtp/testing/fuzz.py`). `prepare` judges each one in this process on a fake group of
2 ranks: it must raise PlanError or accept, never anything else, and leave the model untouched either
way. The accepted ones then run on one gloo group of 2 processes: max |sharded - ref| <= 1e-4 * max |ref|
for every one, no exception. The benchmark `benchmarks/plan_fuzz.py` runs the same at depth.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtp.analysis.fakepg import fake_world
from dtp.runtime.mesh import make_mesh
from dtp.testing import fuzz
from dtp.testing.launch import spawn

EXAMPLES = 24
TP = 2
# Mutants the fuzzer found accepted (and exact), so that the parity half always runs, whatever is drawn.
ACCEPTED = (
    ("flux", {"transformer_blocks.*.norm1.linear": None}, False),
    ("qwenimage", {"proj_out": "colwise_gathered"}, True),
    (
        "t5",
        {
            "encoder.block.*.layer.1.DenseReluDense.wo": None,
            "encoder.block.*.layer.1.DenseReluDense.wi_0": None,
            "encoder.block.*.layer.1.DenseReluDense.wi_1": None,
        },
        False,
    ),
)


def test_mutated_plans_are_refused_or_exact():
    accepted = []
    with fake_world(TP):
        mesh = make_mesh(tp=TP, device_type="cpu")
        models = {arch: fuzz.make_model(arch) for arch in fuzz.CORE}
        linears = {arch: fuzz.linear_keys(model) for arch, model in models.items()}
        for arch, changes, pad in ACCEPTED:
            mutant = fuzz.edited(arch, changes, TP, pad)
            assert fuzz.check_prepare(mutant, models[arch], mesh)[0] == "accepted", mutant
            accepted.append(mutant)

        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(arch=st.sampled_from(fuzz.CORE), rng=st.randoms(use_true_random=False), pad=st.booleans())
        def judged_by_prepare(arch, rng, pad):
            mutant = fuzz.mutate(arch, rng, TP, pad, linears[arch])
            before = fuzz.snapshot(models[arch])
            verdict, detail = fuzz.check_prepare(mutant, models[arch], mesh)
            assert verdict in ("refused", "accepted"), f"{mutant}: {detail}"
            assert fuzz.unchanged(models[arch], before), f"prepare changed the model: {mutant}"
            if verdict == "accepted":
                accepted.append(mutant)

        judged_by_prepare()
    verdicts = spawn(fuzz.parity_worker, TP, accepted)[0]
    wrong = [
        f"{mutant}: {verdict} {detail}" for mutant, (verdict, detail) in zip(accepted, verdicts) if verdict != "exact"
    ]
    assert not wrong, "\n".join(wrong)
