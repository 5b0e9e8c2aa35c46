"""dtp.from_pretrained for transformers text encoders on 2 gloo processes (tp=2), and `dtp run`'s pipeline load.

One spawn for the module. Each tiny text encoder (dtp.testing.tiny_text) is saved by transformers'
save_pretrained in the parent; every rank then loads it shard-on-load and compares it with the model
transformers loads whole, cut by dtp.parallelize (the independent construction): the hidden states,
the attention implementation, and the bytes read, which must be exactly the rank's share of what the
sharded reference holds. Extra checkpoints: Qwen2.5-VL in several files (model.safetensors.index.json),
and a T5 that stores both members of its tie (read once). Last, `dtp.load_pipeline` on the
tiny FLUX.1 pipeline loads its CLIP and T5 shard-on-load.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from dtp.testing.launch import spawn
from dtp.testing.tiny_text import TEXT_CLASSES

TOL = 1e-5  # max |loaded - ref| <= TOL * max |ref| over every hidden state (and logits), fp32
MULTI, BOTH_TIED = "Qwen2_5_VLForConditionalGeneration@multi", "T5EncoderModel@both-tied"
CASES = [*TEXT_CLASSES, MULTI, BOTH_TIED]
PIPELINE_ENCODERS = ("text_encoder", "text_encoder_2")  # tiny FLUX.1: CLIP, T5


def _save_checkpoints(root) -> dict:
    from dtp.testing.tiny_text import tiny_text_model

    dirs = {}
    for cls in TEXT_CLASSES:
        dirs[cls] = root / cls
        tiny_text_model(cls).save_pretrained(dirs[cls])
    cls = MULTI.partition("@")[0]
    dirs[MULTI] = root / MULTI
    tiny_text_model(cls).save_pretrained(dirs[MULTI], max_shard_size="60KB")
    assert (dirs[MULTI] / "model.safetensors.index.json").exists()
    dirs[BOTH_TIED] = root / BOTH_TIED  # an older T5 save: `encoder.embed_tokens.weight` stored next to `shared`
    tiny_text_model("T5EncoderModel").save_pretrained(dirs[BOTH_TIED])
    weights = dirs[BOTH_TIED] / "model.safetensors"
    state = load_file(weights)
    save_file(state | {"encoder.embed_tokens.weight": state["shared.weight"].clone()}, weights)
    return {name: str(path) for name, path in dirs.items()}


@torch.no_grad()
def _worker(rank, world_size, dirs, pipeline_dir):
    import transformers

    import dtp
    from dtp.loading.load import load
    from dtp.runtime.memory import local_param_bytes
    from dtp.testing.tiny_text import hidden_states, tiny_text_inputs

    mesh, inputs, results = dtp.make_mesh(tp=world_size, device_type="cpu"), tiny_text_inputs(), {}
    for case, path in dirs.items():
        cls = getattr(transformers, case.partition("@")[0])
        reference = cls.from_pretrained(path).eval()
        ref = hidden_states(reference, inputs)
        loaded, stats = load(cls, path, mesh)
        out = hidden_states(loaded, inputs)
        buffers = dict(reference.named_buffers())
        persistent = sum(t.numel() * t.element_size() for k, t in reference.state_dict().items() if k in buffers)
        sharded_reference = dtp.parallelize(reference, mesh)
        results[case] = dict(
            relative=max(float((o - r).abs().max() / r.abs().max()) for o, r in zip(out, ref, strict=True)),
            attention=(loaded.config._attn_implementation, reference.config._attn_implementation),
            share=local_param_bytes(sharded_reference) + persistent,
            stats=stats,
            tied=_tied(loaded),
        )
    results["pipeline"] = _pipeline(pipeline_dir, mesh)
    return results


def _tied(model) -> bool | None:
    """T5: `shared` and `encoder.embed_tokens` still hold one Parameter; None for other classes."""
    shared = getattr(model, "shared", None)
    return None if shared is None else shared.weight is model.encoder.embed_tokens.weight


def _pipeline(pipeline_dir, mesh) -> dict:
    """`load_pipeline` with a mesh: which encoders were read shard-on-load (and how many bytes), and their
    prompt embeddings against the pipeline loaded whole in this process."""
    from torch.distributed.tensor import DTensor

    import dtp.pipeline.load as run

    reads, original = {}, run.load_prepared

    def recording(model, prepared, directory, *args, **kwargs):
        reads[directory.rstrip("/").rpartition("/")[2]] = stats = original(model, prepared, directory, *args, **kwargs)
        return stats

    run.load_prepared = recording
    try:
        cpu, fp32 = torch.device("cpu"), torch.float32
        sharded = run.load_pipeline(pipeline_dir, mesh, torch_dtype=fp32, plans={"transformer": "flux"}, device=cpu)
    finally:
        run.load_prepared = original
    whole = run.load_pipeline(pipeline_dir, torch_dtype=fp32, device=cpu)
    prompt = "a cat holding a sign that says hello"
    embeds = [pipe.encode_prompt(prompt, None)[:2] for pipe in (sharded, whole)]
    return dict(
        reads={name: (s.bytes_read, s.share_bytes, s.sharded_bytes + s.replicated_bytes) for name, s in reads.items()},
        dtensors={
            name: any(isinstance(p, DTensor) for p in getattr(sharded, name).parameters()) for name in PIPELINE_ENCODERS
        },
        relative=[float((a - b).abs().max() / b.abs().max()) for a, b in zip(*embeds, strict=True)],
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from dtp.families.pipelines import tiny_checkpoint

    root = tmp_path_factory.mktemp("text_load")
    dirs = _save_checkpoints(root)
    return spawn(_worker, 2, dirs, str(tiny_checkpoint("flux")))


@pytest.mark.parametrize("case", CASES)
def test_hidden_states_match_transformers(results, case):
    """Tiny configs (4 heads, 2 kv heads, right-padded prompt), tp=2: every hidden state of the model loaded
    shard-on-load within 1e-5 relative of the one transformers loads whole, with its attention implementation."""
    for rank in results:
        r = rank[case]
        assert r["relative"] <= TOL, (case, r["relative"])
        assert r["attention"][0] == r["attention"][1], (case, r["attention"])


@pytest.mark.parametrize("case", CASES)
def test_each_rank_reads_exactly_its_share(results, case):
    """bytes read == what the rank holds of transformers' model cut by dtp.parallelize (+ persistent buffers),
    == LoadStats' sharded / 2 + replicated, and less than the whole checkpoint."""
    for rank in results:
        r, stats = rank[case], rank[case]["stats"]
        assert stats.tp == 2 and stats.sharded_bytes > 0, case
        assert stats.bytes_read == r["share"] == stats.share_bytes, (case, stats, r["share"])
        assert stats.bytes_read < stats.sharded_bytes + stats.replicated_bytes, case


@pytest.mark.parametrize("case", ["T5EncoderModel", BOTH_TIED])
def test_t5_tie_survives(results, case):
    """T5's `shared` / `encoder.embed_tokens` tie: one Parameter after loading, whichever members the file holds."""
    for rank in results:
        assert rank[case]["tied"] is True


def test_dtp_run_loads_text_encoders_shard_on_load(results):
    """`load_pipeline` (dtp run) at tp=2, tiny FLUX.1: CLIP and T5 read shard-on-load (each rank exactly its
    share, less than the whole), held as DTensors; prompt embeddings within 1e-5 of the whole pipeline's."""
    for rank in results:
        r = rank["pipeline"]
        assert set(PIPELINE_ENCODERS) <= set(r["reads"]), r["reads"]
        for name in PIPELINE_ENCODERS:
            read, share, total = r["reads"][name]
            assert read == share < total, (name, read, share, total)
            assert r["dtensors"][name], name
        assert max(r["relative"]) <= TOL, r["relative"]
