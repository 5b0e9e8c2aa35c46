"""`dtp check --fsdp` traces a rank's bytes with FSDP2 (`analysis/fsdp.py`), the figure `dtp fit`'s fsdp rows use.

FLUX.1 with 2 double + 2 single blocks at its full width (meta device, fake process group). The expectation is
built here from the tp-only sharded model and torch.chunk: a block matrix holds chunk 0 of its tp slice's rows
over F = cfg x cp ranks, a root matrix its whole tp slice (gathered after the first call), a vector (bias, norm
weight: left out of FSDP2) its whole tp slice everywhere; before the first call the root's matrices are chunked as
well.
"""

from __future__ import annotations

import json

import pytest
import torch

from dtp.analysis.check import check_fsdp
from dtp.analysis.fakepg import fake_world, meta_model
from dtp.analysis.fsdp import fsdp_bytes
from dtp.engine import apply, prepare
from dtp.fit.candidates import Candidate
from dtp.fit.fsdp import component_figures
from dtp.fit.measure import Setup
from dtp.fit.pipelines import fit_pipeline
from dtp.runtime.fsdp import block_lists
from dtp.runtime.memory import local_tensor_bytes
from dtp.runtime.mesh import make_mesh
from dtp.tools import cli

FLUX = "FluxTransformer2DModel"
SMALL = {"num_layers": 2, "num_single_layers": 2, "guidance_embeds": True}  # full width, 4 blocks: 1.1 GB in bf16


def _expected(tp: int, cp: int, cfg: int, vectors_whole: bool = True) -> dict:
    """(resident, sharded) bytes of rank 0 from the tp-only model: rows chunked over F as torch.chunk does, the vectors
    whole (`vectors_whole=False`: chunked too, the rule before round 15: the negative control)."""
    model = meta_model(FLUX, SMALL, torch.bfloat16)
    with fake_world(tp * cp * cfg):
        apply(model, prepare(model, make_mesh(tp=tp, cp=cp, cfg=cfg, device_type="cpu"), None))
        in_blocks = {id(p) for _, lst in block_lists(model) for b in lst for p in b.parameters()}
        out = {"resident": 0, "sharded": 0, "tp_only": 0, "root": 0}
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            whole = local_tensor_bytes(p)
            chunk0 = torch.chunk(torch.empty(local.shape[0], device="meta"), cp * cfg)[0].numel()
            shard = whole // local.shape[0] * chunk0 if p.ndim >= 2 or not vectors_whole else whole  # a vector: whole
            out["sharded"] += shard
            out["resident"] += shard if id(p) in in_blocks else whole
            out["root"] += 0 if id(p) in in_blocks else whole
            out["tp_only"] += whole
    return out


@pytest.mark.parametrize("tp,cp,cfg", [(2, 2, 1), pytest.param(1, 2, 2, marks=pytest.mark.full)])
def test_traced_bytes_are_fsdp2s_chunks_with_the_root_gathered(tp, cp, cfg):
    """Traced resident bytes == blocks' chunk 0 + root whole at tp (exact); before the first call every parameter is
    chunked. Both differ from the old model whole / (cfg x cp): the root is held whole, chunks round up."""
    got = fsdp_bytes(FLUX, None, tp=tp, cp=cp, cfg=cfg, config=SMALL)
    want = _expected(tp, cp, cfg)
    assert got["fsdp"] == cp * cfg
    assert got["fsdp_per_rank_bytes"] == want["resident"], (got, want)
    assert got["fsdp_sharded_bytes"] == want["sharded"], (got, want)
    modelled = -(-want["tp_only"] // (cp * cfg))  # what `dtp check --fsdp` reported before it traced
    assert got["fsdp_per_rank_bytes"] > modelled, (got, modelled)
    old_rule = _expected(tp, cp, cfg, vectors_whole=False)  # control: the figures of the vectors sharded differ
    assert old_rule["resident"] < want["resident"] and old_rule["sharded"] < want["sharded"], (old_rule, want)


@pytest.mark.parametrize("cfg,cp,tp", [(1, 2, 2), pytest.param(2, 2, 2, marks=pytest.mark.full)])
def test_fit_rows_use_the_checked_figures(cfg, cp, tp):
    """`dtp fit`'s fsdp rows (fit/fsdp.component_figures: the released pipeline's transformer) and `dtp check flux
    --fsdp` (the bundled plan's class at its released config) report the same resident and in-flight bytes for
    FLUX.1-dev at full size, at tp > 1 too (the formula fit used before differed there): (cp=2, tp=2) and
    (cfg=2, cp=2, tp=2)."""
    c = Candidate(cfg=cfg, cp=cp, tp=tp, cp_mode="ulysses", fsdp=True)
    fit = component_figures(fit_pipeline("flux-pipeline"), "transformer", c, Setup(tp=tp, cp=cp), torch.bfloat16)
    check = check_fsdp("flux", tp=tp, cp=cp, cfg=cfg)
    assert check["fsdp"] == fit.fsdp == cfg * cp
    assert (check["fsdp_per_rank_bytes"], check["fsdp_in_flight_bytes"]) == (fit.resident, fit.in_flight)


def test_check_cli_fsdp_json(tmp_path, capsys):
    """`dtp check flux --tp 2 --cp 2 --fsdp --config small.json --json` reports the traced figures; --cp 1 refuses."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL))
    args = ["check", "flux", "--tp", "2", "--config", str(config), "--json", "--no-forward", "--fsdp"]
    assert cli.main([*args, "--cp", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fsdp"] == 2
    assert report["fsdp_per_rank_bytes"] == _expected(2, 2, 1)["resident"]
    assert cli.main([*args, "--cp", "1"]) == 1
    assert "--cp 2 (or --cfg 2)" in capsys.readouterr().err


@pytest.mark.full  # a full-size pipeline on meta: ~20 s; the model path above covers the traced figure by default
def test_check_pipeline_fsdp_is_traced(capsys):
    """`dtp check flux-pipeline --tp 1 --cp 2 --fsdp`: the transformer's figure is the model path's (same released
    config), the T5 and CLIP encoders are divided too, the row-split VAE is not."""
    assert cli.main(["check", "flux-pipeline", "--tp", "1", "--cp", "2", "--fsdp", "--json"]) == 0
    rows = {c["name"]: c for c in json.loads(capsys.readouterr().out)["components"]}
    alone = fsdp_bytes(FLUX, None, tp=1, cp=2)["fsdp_per_rank_bytes"]
    assert rows["transformer"]["fsdp_per_rank_bytes"] == alone
    for encoder in ("text_encoder", "text_encoder_2"):
        assert rows[encoder]["fsdp_per_rank_bytes"] < 0.7 * rows[encoder]["per_rank_bytes"], rows[encoder]
    assert rows["vae"]["fsdp_per_rank_bytes"] == rows["vae"]["per_rank_bytes"]


def test_check_says_what_fsdp_does_along_cp(tmp_path, capsys):
    """The text report: without --fsdp 'weights are replicated along cp'; with it, what FSDP2 does instead, and the
    in-flight line."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL))
    args = ["check", "flux", "--tp", "2", "--cp", "2", "--config", str(config), "--no-forward", "--no-peak"]
    assert cli.main(args) == 0
    assert "weights are replicated along cp" in capsys.readouterr().out
    assert cli.main([*args, "--fsdp"]) == 0
    out = capsys.readouterr().out
    assert "replicated along cp" not in out and "FSDP2 divides the weights over the 2 cfg x cp ranks" in out, out
    assert "with --fsdp (in flight)" in out


@pytest.mark.full  # a full-size pipeline on meta: ~25 s
def test_check_pipeline_fsdp_with_cfg(capsys):
    """`dtp check flux-pipeline --tp 1 --fsdp --cfg 2`: the weights divided over the 2 cfg ranks, the transformer's
    figures the model path's at cfg=2; without --fsdp, --cfg on a pipeline is still refused (no one model's
    forward to size the exchange from)."""
    assert cli.main(["check", "flux-pipeline", "--tp", "1", "--fsdp", "--cfg", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {c["name"]: c for c in report["components"]}
    alone = fsdp_bytes(FLUX, None, tp=1, cfg=2)
    assert report["fsdp"] == 2 and report["fsdp_cfg"] == 2
    assert rows["transformer"]["fsdp_per_rank_bytes"] == alone["fsdp_per_rank_bytes"]
    assert rows["transformer"]["fsdp_in_flight_bytes"] == alone["fsdp_in_flight_bytes"]
    assert cli.main(["check", "flux-pipeline", "--tp", "1", "--cfg", "2"]) == 1
    assert "--cfg needs the measured forward of one model" in capsys.readouterr().err


def test_check_cli_fsdp_unit_size(tmp_path, capsys):
    """`dtp check flux --fsdp 2` traces FLUX.1 (2 double + 2 single blocks, full width) with 2 blocks a unit: the same
    resident bytes as `--fsdp` (grouping moves no shard), in flight twice the double pair (its copy-out: all-gather
    buffer and parameters; more than the pair and the single pair after it), not two single blocks; `--fsdp 0`
    refuses with what --fsdp takes."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL))
    args = ["check", "flux", "--tp", "2", "--cp", "2", "--config", str(config), "--json", "--no-forward", "--fsdp"]
    reports = {}
    for unit in ([], ["2"]):
        assert cli.main([*args, *unit]) == 0
        reports[tuple(unit)] = json.loads(capsys.readouterr().out)
    default, grouped = reports[()], reports[("2",)]
    assert grouped["fsdp_per_rank_bytes"] == default["fsdp_per_rank_bytes"] == _expected(2, 2, 1)["resident"]
    model = meta_model(FLUX, SMALL, torch.bfloat16)
    # bf16 bytes (2 a weight) halved by tp=2 (all but a few norm weights are split)
    double, single = (sum(p.numel() for b in lst for p in b.parameters()) for _, lst in block_lists(model))
    assert grouped["fsdp_in_flight_bytes"] == pytest.approx(2 * double, rel=0.01), (grouped, double, single)
    assert default["fsdp_in_flight_bytes"] < grouped["fsdp_in_flight_bytes"] / 3
    assert cli.main([*args, "0"]) == 1
    assert "byte budget per unit" in capsys.readouterr().err
