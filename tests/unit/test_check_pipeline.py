"""`dtp check PIPELINE`: every component of a released pipeline at full size on the meta device."""

import contextlib
import io
import json

import pytest
import torch

from dtp.analysis.check import check_pipeline
from dtp.analysis.released import RELEASED_PIPELINES, build_component, build_pipeline, released_pipeline
from dtp.families.released_pipelines import Component
from dtp.plan.io import load_plan
from dtp.resolve import resolve
from dtp.resolve.layout import rank_ranges
from dtp.tools.check import format_pipeline_report
from dtp.tools.cli import main

# Parameters of the public checkpoints (model cards and safetensors headers), not of our configs.
PUBLIC_PARAMS = {
    "transformer": 11.901e9,  # FLUX.1-dev
    "text_encoder": 123.06e6,  # CLIP ViT-L/14 text model
    "text_encoder_2": 4.762e9,  # T5 v1.1 XXL encoder
    "vae": 83.82e6,  # FLUX.1 AutoencoderKL, 16 channels
}
# The VAE's plan reads "rows": dtp.parallelize_vae splits its activations by rows; its weights stay whole.
FLUX_TP2_PLANS = {"transformer": "flux", "text_encoder": "clip", "text_encoder_2": "t5", "vae": "rows"}
WEIGHT_PLANS = {**FLUX_TP2_PLANS, "vae": None}  # the plans that split weights


def cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["check", *argv])
    return rc, out.getvalue(), err.getvalue()


def rank_bytes(model: torch.nn.Module, plan_name: str | None, tp: int, rank: int) -> int:
    """Rank `rank`'s parameter bytes from the plan's layouts and the slicing math, without DTensor."""
    layouts = resolve(load_plan(plan_name), model).param_layouts() if plan_name else {}
    total = 0
    for name, param in model.named_parameters():
        layout, nbytes = layouts.get(name), param.numel() * param.element_size()
        if layout is not None:
            rows = sum(stop - start for start, stop in rank_ranges(layout.block_sizes, tp, rank))
            nbytes = nbytes * rows // param.shape[layout.dim]
        total += nbytes
    return total


@pytest.fixture(scope="module")
def flux_tp2():
    """`dtp check flux-pipeline --tp 2 --json`, and the same components built here, unsharded."""
    rc, out, err = cli("flux-pipeline", "--tp", "2", "--json")
    assert rc == 0, err
    return json.loads(out), build_pipeline(released_pipeline("flux-pipeline"), torch.bfloat16)


def test_flux_pipeline_components_match_an_independent_count(flux_tp2):
    """tp=2: each component's whole bytes = its parameters x 2 (bf16); per rank = its local slices by the plan's
    layouts, the same on both ranks; the VAE (no plan) whole."""
    report, modules = flux_tp2
    rows = {c["name"]: c for c in report["components"]}
    assert {n: c["plan"] for n, c in rows.items()} == FLUX_TP2_PLANS
    for name, module in modules.items():
        whole = sum(p.numel() * 2 for p in module.parameters())
        per_rank = {rank_bytes(module, WEIGHT_PLANS[name], 2, rank) for rank in range(2)}
        assert (rows[name]["total_bytes"], {rows[name]["per_rank_bytes"]}) == (whole, per_rank), name
    assert rows["vae"]["per_rank_bytes"] == rows["vae"]["total_bytes"]
    assert rows["vae"]["whole_reason"] is None  # split by rows (parallel VAE), not kept whole


def test_flux_pipeline_total_is_the_sum_over_tp(flux_tp2):
    report, modules = flux_tp2
    total = sum(p.numel() * 2 for m in modules.values() for p in m.parameters())
    per_rank = sum(c["per_rank_bytes"] for c in report["components"])
    assert (report["total_bytes"], report["per_rank_bytes"]) == (total, per_rank)
    assert report["ratio"] == pytest.approx(per_rank / (total / 2))
    assert 1.0 < report["ratio"] < 1.01  # benchmarks/results/pipeline_memory.md: 1.0069


def test_released_configs_have_the_public_parameter_counts(flux_tp2):
    report, _ = flux_tp2
    for c in report["components"]:
        assert c["params"] == pytest.approx(PUBLIC_PARAMS[c["name"]], rel=1e-3), c["name"]


def test_unknown_pipeline_names_the_known_ones():
    rc, out, err = cli("sd3-pipeline", "--tp", "2")
    assert rc == 1 and out == ""
    assert all(name in err for name in RELEASED_PIPELINES), err
    assert set(RELEASED_PIPELINES) == {
        "flux-pipeline",
        "flux2-pipeline",
        "qwenimage-pipeline",
        "wan-pipeline",
        "wan-vace-pipeline",
        "ltx2-pipeline",
        "hunyuanvideo15-pipeline",
        "flux3-pipeline",
    }


def test_wan_pipeline_is_checked_like_fit_sees_it():
    """`dtp check wan-pipeline --tp 4` (once: "no released pipeline named 'wan-pipeline'"): Wan 2.1 14B sharded by its
    plan, UMT5-XXL by the umt5 plan; per rank 10.355 GB of 40.193 GB (ratio 1.031, measured), the VAE whole."""
    report = check_pipeline("wan-pipeline", tp=4)
    rows = {c["name"]: c for c in report["components"]}
    assert rows["transformer"]["plan"] == "wan" and rows["text_encoder"]["class"] == "UMT5EncoderModel"
    assert rows["text_encoder"]["plan"] is not None, rows["text_encoder"]["whole_reason"]
    assert 20.0e9 < report["params"] < 20.2e9  # 14.3 B transformer + 5.68 B UMT5-XXL encoder + the VAE
    assert report["ratio"] < 1.05, report["ratio"]


def test_help_lists_the_pipelines(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    help_text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, also at hyphens
    assert all(name in help_text for name in RELEASED_PIPELINES), help_text


def test_pipeline_options_are_refused_for_one_model_and_back():
    assert cli("flux", "--tp", "2", "--whole-text-encoders")[0] == 1
    rc, _, err = cli("flux-pipeline", "--tp", "2", "--plan", "flux")
    assert rc == 1 and "--plan and --config apply to one model" in err


def test_text_encoder_that_does_not_fit_stays_whole_and_says_why():
    """Qwen-Image at tp=3: the transformer (24 heads) shards, Qwen2.5-VL (3584 = 28 heads x 128 wide) cannot."""
    report = check_pipeline("qwenimage-pipeline", tp=3)
    rows = {c["name"]: c for c in report["components"]}
    assert rows["transformer"]["plan"] == "qwenimage" and rows["text_encoder"]["plan"] is None
    reason = rows["text_encoder"]["whole_reason"]
    assert "tp=3 does not divide" in reason and "Supported tp: 1, 2, 4" in reason, reason
    assert rows["text_encoder"]["per_rank_bytes"] == rows["text_encoder"]["total_bytes"]
    assert rows["transformer"]["per_rank_bytes"] < 0.34 * rows["transformer"]["total_bytes"]
    text = format_pipeline_report(report)
    assert f"text_encoder: {reason}" in text and "Qwen2_5_VLForConditionalGeneration   whole" in text


# Parameters of the new pipelines' components as the registry builds them (meta device), counted here. Public figures
# where they are known: gemma-3-12b-it "12.2 B" (12,187,325,040 in its safetensors index), LTX-2 "19 B",
# Qwen3-VL-4B "4.4 B"; the others are the diffusers class defaults' counts (the families' RELEASED configs).
NEW_PIPELINE_PARAMS = {
    "wan-vace-pipeline": {"transformer": 17.338e9, "text_encoder": 5.681e9, "vae": 126.89e6},
    # LTX-2's text connectors, audio VAE and vocoder: their diffusers class defaults (issue 45: fit counts them)
    "ltx2-pipeline": {
        "transformer": 18.876e9,
        "text_encoder": 12.187e9,
        "vae": 1222.5e6,
        "connectors": 1431.48e6,
        "audio_vae": 53.248e6,
        "vocoder": 55.593e6,
    },
    "flux3-pipeline": {"transformer": 5.538e9, "text_encoder": 4.438e9, "vae": 84.05e6},
    # HunyuanVideo 1.5: "8.3 B" published; Qwen2.5-VL-7B's language model without its lm_head; byT5-small's encoder.
    "hunyuanvideo15-pipeline": {
        "transformer": 8.3266e9,
        "text_encoder": 7.0706e9,
        "text_encoder_2": 217.66e6,
        "vae": 1260.6e6,
    },
}


@pytest.mark.parametrize("name", sorted(NEW_PIPELINE_PARAMS))
def test_new_released_pipelines_parameter_counts(name):
    modules = build_pipeline(released_pipeline(name), torch.bfloat16)
    counts = {component: sum(p.numel() for p in module.parameters()) for component, module in modules.items()}
    assert counts == pytest.approx(NEW_PIPELINE_PARAMS[name], rel=1e-3), counts


# Qwen/Qwen3-VL-8B-Instruct (Qwen-Image 2.1's context_in_dim 4096): Qwen3-8B's language model (36 layers, width 4096,
# SwiGLU 12288, its own lm_head) and the 27-block SigLIP-2-shaped vision tower; no released pipeline entry yet.
QWEN3_VL_8B = Component(
    class_name="Qwen3VLForConditionalGeneration",
    config_class="Qwen3VLConfig",
    config=dict(
        text_config=dict(
            vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
        ),
        vision_config=dict(out_hidden_size=4096),  # transformers' defaults: depth 27, width 1152, MLP 4304
        tie_word_embeddings=False,
    ),
)  # fmt: skip


@pytest.mark.parametrize(
    ("encoder", "plan"),
    [
        ("ltx2-pipeline", "gemma3"),
        ("flux3-pipeline", "qwen3_vl"),
        pytest.param(QWEN3_VL_8B, "qwen3_vl", marks=pytest.mark.full, id="qwen3-vl-8b"),
    ],
)
def test_new_text_encoders_at_tp8_hold_little_more_than_an_eighth(encoder, plan):
    """Gemma 3 12B (LTX-2) and Qwen3-VL-4B (FLUX.3) at full size, tp=8, by their bundled plans, as `dtp check
    ltx2-pipeline --tp 8` shards them: a rank holds 1.0062 / 1.0068 of total / 8 (Qwen3-VL-8B, 8.77 B: 1.0040; measured;
    the rest is norms, rowwise biases, the vision patch embeddings and position tables, Gemma 3's projector
    weight)."""
    from dtp.analysis.fakepg import fake_world
    from dtp.parallelize import parallelize
    from dtp.runtime.memory import local_param_bytes
    from dtp.runtime.mesh import make_mesh

    if isinstance(encoder, str):
        encoder = released_pipeline(encoder).components["text_encoder"]
    encoder = build_component(encoder, torch.bfloat16)
    whole = local_param_bytes(encoder)
    with fake_world(8):
        parallelize(encoder, make_mesh(tp=8, device_type="cpu"), load_plan(plan))
        ratio = local_param_bytes(encoder) / (whole / 8)
    assert ratio <= 1.01, ratio


def test_fit_prints_for_ltx2_a_command_dtp_run_parses():
    """The first row `dtp fit ltx2-pipeline --gpus 8 --gpu-memory 80GB` prints (tp=8, text encoders sharded) is a
    `dtp run` command line the CLI parses, at LTX-2's 121 x 512 x 768 and its checkpoint folder."""
    import shlex

    from dtp.fit.candidates import Candidate
    from dtp.fit.estimate import command
    from dtp.fit.pipelines import Shape, fit_pipeline
    from dtp.tools.commands import build_parser

    spec = fit_pipeline("ltx2-pipeline")
    frames, height, width = spec.usual_size
    line = command(Candidate(tp=8, text_encoders="sharded"), spec, Shape(1, height, width, frames))
    argv = shlex.split(line)
    assert argv[:5] == ["torchrun", "--nproc-per-node", "8", "-m", "dtp"], line
    args = build_parser().parse_args(argv[5:])
    assert (args.command, args.model_dir, args.frames, args.height, args.width) == ("run", "./LTX-2", 121, 512, 768)
