"""Context parallelism for the video families whose plans used to refuse it (issue 45): gloo parity.

ONE 4-process group for the whole module. For each family, a tiny model (perturbed weights, batch 2) at
(cp, tp) = (2, 2) Ulysses and ring ((4, 1) ring and Ulysses with DTP_FULL=1), against one process:
max |out - ref| <= 1e-5 * max |ref| for EVERY output (LTX-2's video and audio samples), and every CP attention
module really routed (Ulysses: one `to_heads` per call; ring: cp key blocks per call). Each new mechanism has a
negative control that must miss by far:
- LTX-2 (a rule per stream: video and audio tokens each cut with their own RoPE coords): the video-to-audio
  attention given the text's rule (`local`: the rank's audio queries over the rank's video keys). Any audio length:
  7 audio tokens padded (with their timesteps and RoPE coords; (2, 2) Ulysses, (4, 1) ring and the pad keys unmasked,
  the control, with DTP_FULL=1).
- HunyuanVideo 1.5 (the text mask cut with its tokens, padded, so the processor's own [video_r, text_r] mask
  lines up): the mask left whole on every rank (the processor then crops it to the local length).
- Wan 2.2 Animate (the face adapter's per-token frame from the rank's global token range): every rank told its
  tokens start at token 0. Its video embedded per rank (`embed` + `added`: the pose added to the rank's tokens from
  the index codes the forward's own add leaves): the codes read without their pose rows.
- Latte (cut along the patches: spatial attention over CP, temporal attention local after the forward's own
  reshape; the temporal timesteps, one per sample repeated per position, cut strided): those timesteps cut
  contiguously (a rank's rows from the wrong sample). The spatial cross-attention's caption keys / values projected
  once per sample (`cp.per_sample`): the queries grouped frame-major (frames attend to the wrong sample's caption).
- Helios (dtp's forward cutting [history_r | current_r] before the forward's own joins, `cp.forward: helios`): every
  rank's temb and modulation rows taken from rank 0's range of the whole [history | current] rows.
- Kandinsky 6 (a rule per stream, as LTX-2; the video cut through the forward's own reshapes, as Kandinsky 5; 9 audio
  tokens, as the pipeline sizes them for 5 frames, padded and gathered at the audio output layer): its av
  cross-modal attention (audio queries, video keys) given the text's rule (`local`); the audio pad keys unmasked.
  One (2, 2) case by default; the rest, the controls and a video-only call (no audio stream) with DTP_FULL=1. Any
  video length (default): 9 video tokens padded (`first`) beside the 9 audio tokens (`last`), each attention masking
  its own stream's pad keys (`runtime/cp/pad_view.py`), at (2, 2) Ulysses and (4, 1) ring; control: the video pad
  keys unmasked.
- Cosmos 3 Omni (one packed, unbatched sequence: dtp's forward packs each rank's rows of the causal text prefix and
  the video tokens, each padded and cut on its own, `cp.forward: cosmos3_omni`; the dual-pathway attention run by
  `runtime/cp/packed.py`): the ring's block-causal prefix with every rank taken as the prefix's first block (offset
  0); every rank packing rank 0's rows ((2, 2) Ulysses); the ring's kv heads (sent unexpanded) expanded per block in
  the wrong order, tiled ((2, 2) ring); the pad keys of both pathways left unmasked ((4, 1), full).
  7 text + 18 video tokens: the prefix padded at cp = 2 and 4, the video at cp = 4. One (2, 2) case by default.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dtp
import dtp.runtime.cp.batch_rows as batch_rows_module
import dtp.runtime.cp.cosmos3 as cosmos3_module
import dtp.runtime.cp.frames as frames_module
import dtp.runtime.cp.grid_embed as grid_embed_module
import dtp.runtime.cp.helios as helios_module
import dtp.runtime.cp.hooks as hooks_module
import dtp.runtime.cp.packed as packed_module
import dtp.runtime.cp.pad_view as pad_view_module
import dtp.runtime.cp.per_sample as per_sample_module
import dtp.runtime.cp.ring as ring_module
import dtp.runtime.cp.ulysses as ulysses_module
from dtp.resolve import resolve, resolve_cp
from dtp.testing.cosmos3 import SOUND_ACTION, add_sound_and_action
from dtp.testing.counting import CallCounter
from dtp.testing.launch import spawn
from dtp.testing.perturb import perturb
from dtp.testing.scope import full_run
from dtp.testing.tiny import PLAN_CLASSES, tiny_inputs, tiny_model

TOL = 1e-5
# (2, 2) is cp=2 Ulysses and ring with tp=2 beside; (4, 1) (cp=4: partial frames, more pad) with DTP_FULL=1
MESHES = ((2, 2, "ulysses"), (2, 2, "ring")) + (((4, 1, "ring"), (4, 1, "ulysses")) if full_run() else ())
FAMILIES = (
    "ltx2", "helios", "hunyuanvideo15", "wan_animate", "anyflow", "kandinsky5", "latte", "allegro", "kandinsky6",
    "cosmos3_omni",
)  # fmt: skip
# the last two families: one (2, 2) case by default (each repeats kinds the others cover), the rest with DTP_FULL=1
FULL = ((2, 2, "ulysses"), (2, 2, "ring"), (4, 1, "ring"), (4, 1, "ulysses"))
OWN_MESHES = {
    "kandinsky6": ((2, 2, "ulysses"),) + (FULL[1:] if full_run() else ()),
    "cosmos3_omni": ((2, 2, "ring"),) + ((FULL[0],) + FULL[2:] if full_run() else ()),
}
PACKED = {"cosmos3_omni"}  # its attention run by `runtime/cp/packed.py` (counted there, not by the generic route)
# By default each family runs one (2, 2) mode, Ulysses and ring alternating down FAMILIES (a family's cut is the same
# in both modes; each mode's exchange runs for half of them); both modes and (4, 1) with DTP_FULL=1.
OWN_MESHES |= {
    name: MESHES if full_run() else (MESHES[i % 2],) for i, name in enumerate(FAMILIES) if name not in OWN_MESHES
}
CASES = tuple((name, *mesh) for name in FAMILIES for mesh in OWN_MESHES[name])
# Helios: 64 current tokens (2 frames of 2 x 16) and 44 history tokens (short 32, mid 8, long 4): each divides by 4
IMG_TOKENS = {"helios": 64}
# HunyuanVideo 1.5: 10 MLLM + 5 ByT5 + 4 image tokens = 19 joint text tokens (padded at cp = 2 and 4), prompts padded
TXT_TOKENS = {"hunyuanvideo15": 10}


def _model(name: str, **overrides):
    model = perturb(tiny_model(PLAN_CLASSES[name], **overrides), seed=7)
    if name == "allegro":  # no QK-norm: N(0, 0.2) weights give logits in the hundreds, where ring's fp32 log-sum-exp
        with torch.no_grad():  # merge alone rounds at ~2e-5 (Ulysses 1.3e-6); halved q / k keep them realistic
            for block in model.transformer_blocks:
                block.attn1.to_q.weight.mul_(0.5)
                block.attn1.to_k.weight.mul_(0.5)
    if name == "wan_animate":  # the tiny perturbed motion encoder's scaled layers shrink the signal ~7x each: its
        _motion_weights(model.motion_encoder)  # output varied by 7e-8 over face crops, so its crops could not matter
    return model


def _motion_weights(encoder) -> None:
    """The motion encoder's scaled conv / linear weights drawn N(0, 1), diffusers' own init (`torch.randn`, each
    layer scaling by 1 / sqrt(fan-in)): its output then varies with the face crop (std over crops ~0.1)."""
    g = torch.Generator().manual_seed(17)
    with torch.no_grad():
        for name, weight in encoder.named_parameters():
            if name.endswith("weight") and weight.ndim > 1 and "motion_synthesis" not in name:
                weight.copy_(torch.randn(weight.shape, generator=g))


def _inputs(name: str) -> dict:
    inputs = tiny_inputs(
        PLAN_CLASSES[name], batch=2, img_tokens=IMG_TOKENS.get(name, 16), txt_tokens=TXT_TOKENS.get(name, 8)
    )
    return CUSTOM[name](inputs) if name in CUSTOM else inputs


def _wan_animate_three_frames(inputs: dict) -> dict:
    """3 latent frames of 2 x 2 tokens (12): at cp=4 rank 1 holds tokens 3..5, the end of frame 0 and the start of
    frame 1, so the face adapter's per-token frames matter (pose latents: 2 frames; face crops: 5, which the face
    encoder's two stride-2 causal convs and its padding frame turn into 3 motion frames)."""
    g = torch.Generator().manual_seed(11)
    latent, pose, face = inputs["hidden_states"], inputs["pose_hidden_states"], inputs["face_pixel_values"]
    inputs["hidden_states"] = torch.randn(2, latent.shape[1], 3, 4, 4, generator=g)
    inputs["pose_hidden_states"] = torch.randn(2, pose.shape[1], 2, 4, 4, generator=g)
    inputs["face_pixel_values"] = torch.rand(2, 3, 5, *face.shape[-2:], generator=g) * 2 - 1
    return inputs


def _hunyuanvideo15_eighteen_tokens(inputs: dict) -> dict:
    """3 latent frames of 2 x 3 tokens (18): padded to 20 at cp=4 (the text, 19 tokens, to 20 as well)."""
    latent = inputs["hidden_states"]
    inputs["hidden_states"] = torch.randn(2, latent.shape[1], 3, 2, 3, generator=torch.Generator().manual_seed(12))
    return inputs


def _cosmos3_odd(inputs: dict) -> dict:
    """7 text tokens (the causal prefix) and 3 latent frames of 2 x 3 patches (18 video tokens), frame 0 a clean
    condition, frames 1-2 noisy: the prefix is padded at cp = 2 and 4 (to 8), the video at cp = 4 (to 20)."""
    g = torch.Generator().manual_seed(13)
    text, frames, h, w = 7, 3, 2, 3
    channels, patch = inputs["vision_tokens"][0].shape[1], 2
    video = torch.arange(text, text + frames * h * w)
    grid = torch.stack(torch.meshgrid(*(torch.arange(n) for n in (frames, h, w)), indexing="ij")).flatten(1)
    inputs.update(
        input_ids=inputs["input_ids"][:text],
        text_indexes=torch.arange(text),
        position_ids=torch.cat([torch.arange(text).expand(3, -1), grid + text], dim=1),
        und_len=text,
        sequence_length=text + len(video),
        vision_tokens=[torch.randn(1, channels, frames, h * patch, w * patch, generator=g)],
        vision_token_shapes=[(frames, h, w)],
        vision_sequence_indexes=video,
        vision_mse_loss_indexes=video[h * w :],
        vision_timesteps=torch.rand((frames - 1) * h * w, generator=g) * 1000,
        vision_noisy_frame_indexes=[torch.arange(1, frames)],
    )
    return inputs


CUSTOM = {
    "wan_animate": _wan_animate_three_frames,
    "hunyuanvideo15": _hunyuanvideo15_eighteen_tokens,
    "cosmos3_omni": _cosmos3_odd,
}


def _outputs(output) -> list[torch.Tensor]:
    """Every tensor a forward returns (a tuple's elements, those of its lists: Cosmos 3's per-item predictions, or
    the sample), as fp32."""
    items = output if isinstance(output, (tuple, list)) else (output,)
    items = [x for o in items for x in (o if isinstance(o, list) else (o,))]
    return [o.float() for o in items if isinstance(o, torch.Tensor)]


@torch.no_grad()
def _run(model, mesh, mode: str, inputs: dict, refs: list, plan) -> dict:
    model = dtp.parallelize(model, mesh, dtp.load_plan(plan) if isinstance(plan, str) else plan, cp_mode=mode)
    with (
        CallCounter(ulysses_module, "to_heads") as a2a,
        CallCounter(ring_module, "block_attention") as blocks,
        CallCounter(packed_module, "heads_to_seq") as packed_a2a,
        CallCounter(packed_module, "ring_causal") as packed_causal,
    ):
        outs = _outputs(model(**inputs))
    return dict(
        rel=max(float((o - r).abs().max() / r.abs().max()) for o, r in zip(outs, refs)),
        shape_ok=[o.shape for o in outs] == [r.shape for r in refs],
        a2a=a2a.calls,
        blocks=blocks.calls,
        packed_a2a=packed_a2a.calls,  # Cosmos 3: one return all-to-all per pathway and layer under Ulysses
        packed_causal=packed_causal.calls,  # Cosmos 3: one block-causal ring per layer under ring
    )


def _family(name: str, meshes: dict) -> dict:
    plan, inputs = dtp.load_plan(name), _inputs(name)
    reference = _model(name)
    with torch.no_grad():
        refs = _outputs(reference(**inputs))
    routed = [spec for spec in resolve_cp(resolve(plan, reference), reference).attention if not spec.linear]
    results = {(name, "modules"): len(routed)}  # adapters that run the attention themselves route nothing
    for cp, tp, mode in OWN_MESHES[name]:
        results[name, cp, tp, mode] = _run(_model(name), meshes[cp, tp], mode, inputs, refs, plan)
    return results


def _local(name: str, globs: tuple[str, ...]):
    """`name`'s plan with the attentions at `globs` marked `local` (attending over this rank's keys only)."""
    plan = dtp.load_plan(name)
    return dataclasses.replace(plan, cp=dataclasses.replace(plan.cp, local_attention=plan.cp.local_attention + globs))


def _helios_rank0_modulation(mesh) -> dict:
    """Helios' temb and modulation rows on every rank taken from rank 0's range (the first h_r + n_r rows) of the whole
    [history | current] rows: the rank's current tokens then get history (timestep 0) rows."""
    modulation, cp = helios_module._modulation, mesh["cp"].size()

    def rank0(self, timestep, text, batch, history, current):
        temb, proj, text = modulation(self, timestep, text, batch, history * cp, current * cp)
        return temb[:, : history + current], proj[:, : history + current], text

    helios_module._modulation = rank0
    try:
        return _control("helios", mesh, "ring", "helios")
    finally:
        helios_module._modulation = modulation


def _unstrided(name: str):
    """`name`'s plan with its strided cuts made contiguous (rank r keeps rows [r n / cp, (r + 1) n / cp))."""
    plan = dtp.load_plan(name)
    splits = tuple(dataclasses.replace(rule, strided=False) for rule in plan.cp.splits)
    return dataclasses.replace(plan, cp=dataclasses.replace(plan.cp, splits=splits))


def _without_split(name: str, key: str, tensor: str):
    """`name`'s plan without its split of `tensor` at `key` (that tensor reaches the module whole on every rank)."""
    plan = dtp.load_plan(name)
    splits = tuple(rule for rule in plan.cp.splits if (rule.key, rule.name) != (key, tensor))
    return dataclasses.replace(plan, cp=dataclasses.replace(plan.cp, splits=splits))


def _without_pad_attention(plan, glob: str):
    """`plan` with the attention `glob` dropped from every split's `pad.attention`."""
    splits = tuple(
        rule
        if rule.pad is None
        else dataclasses.replace(
            rule, pad=dataclasses.replace(rule.pad, attention=tuple(a for a in rule.pad.attention if a != glob))
        )
        for rule in plan.cp.splits
    )
    return dataclasses.replace(plan, cp=dataclasses.replace(plan.cp, splits=splits))


def _control(name: str, mesh, mode: str, plan) -> dict:
    """`name` run with a broken `plan`: its result, or, where the break raises instead, the error (rel = inf)."""
    inputs = _inputs(name)
    with torch.no_grad():
        refs = _outputs(_model(name)(**inputs))
    try:
        return _run(_model(name), mesh, mode, inputs, refs, plan)
    except Exception as error:  # noqa: BLE001 - a control may fail loudly as well as silently
        return dict(rel=float("inf"), error=repr(error)[:200])


def _helios_odd() -> dict:
    """Helios with 1 current frame of 2 x 3 tokens (6) and its histories cut to the same 4 x 6 latent grid: at cp=4
    both runs are padded (current 6 -> 8)."""
    inputs = _inputs("helios")
    for key in ("hidden_states", "latents_history_short", "latents_history_mid", "latents_history_long"):
        inputs[key] = inputs[key][..., :4, :6].contiguous()
    inputs["hidden_states"] = inputs["hidden_states"][:, :, :1].contiguous()
    inputs["indices_hidden_states"] = inputs["indices_hidden_states"][:, :1]
    return inputs


def _padded(meshes: dict) -> dict:
    inputs, results = _helios_odd(), {}
    with torch.no_grad():
        refs = _outputs(_model("helios")(**inputs))
    for cp, tp, mode in ((4, 1, "ring"), (2, 2, "ulysses")):
        results["helios", "padded", cp, tp, mode] = _run(_model("helios"), meshes[cp, tp], mode, inputs, refs, "helios")
    unmasked = hooks_module.PadState.key_valid
    hooks_module.PadState.key_valid = lambda self, keys, batch, device: None
    try:  # negative control: the same padding, the pad keys not masked
        results["helios", "pad_control"] = _run(_model("helios"), meshes[4, 1], "ring", inputs, refs, "helios")
    finally:
        hooks_module.PadState.key_valid = unmasked
    return results


def _wan_animate_offset_control(mesh) -> dict:
    """The face adapter told that every rank's tokens start at global token 0 (a wrong global offset)."""
    offset = frames_module.WanAnimateFaceCpProcessor.offset
    frames_module.WanAnimateFaceCpProcessor.offset = lambda self, local: 0
    try:
        return _control("wan_animate", mesh, "ring", "wan_animate")
    finally:
        frames_module.WanAnimateFaceCpProcessor.offset = offset


def _wan_animate_pose_control(mesh) -> dict:
    """The index codes read as plain tokens: the rank's tokens embedded without their pose rows."""
    decode = grid_embed_module.decode
    grid_embed_module.decode = lambda codes, count: (codes % count, torch.full_like(codes, -1))
    try:
        return _control("wan_animate", mesh, "ulysses", "wan_animate")
    finally:
        grid_embed_module.decode = decode


def _frame_major(x: torch.Tensor, batch: int) -> torch.Tensor:
    """[B x F, P, C] rows grouped as if frame-major ([F, B]): a sample's group holds frames of both samples."""
    return x.view(-1, batch, *x.shape[1:]).transpose(0, 1).reshape(batch, -1, x.shape[-1])


def _wan_animate_rows_control(mesh) -> dict:
    """Wan Animate's motion encoder with every rank running rank 0's rows of each call (gathered cp times)."""
    rows_of = batch_rows_module.rows_of
    batch_rows_module.rows_of = lambda n, rank, cp: rows_of(n, 0, cp)
    try:
        return _control("wan_animate", mesh, "ring", "wan_animate")
    finally:
        batch_rows_module.rows_of = rows_of


def _latte_context_control(mesh) -> dict:
    """Latte's spatial cross-attention with the queries grouped frame-major: frames attend to the wrong caption."""
    by_sample = per_sample_module.by_sample
    per_sample_module.by_sample = _frame_major
    try:
        return _control("latte", mesh, "ulysses", "latte")
    finally:
        per_sample_module.by_sample = by_sample


def _cosmos3_rank0_rows(mesh) -> dict:
    """Cosmos 3's forward (`cp.forward: cosmos3_omni`) with every rank packing rank 0's rows of both pathways (its
    text, video, timestep and RoPE rows), the read-back still taking each prediction from its owner rank."""
    rows = cosmos3_module.PackedRows.rows

    def rank0(self, total, device):
        rank, self.rank = self.rank, 0
        try:
            return rows(self, total, device)
        finally:
            self.rank = rank

    cosmos3_module.PackedRows.rows = rank0
    try:
        return _control("cosmos3_omni", mesh, "ulysses", "cosmos3_omni")
    finally:
        cosmos3_module.PackedRows.rows = rows


def _cosmos3_sound_action(meshes: dict) -> dict:
    """Cosmos 3 built with its sound and action heads: 5 sound tokens (frames 1-4 noisy, read back) and 4 action tokens
    (frames 2-3 noisy, domain 1) after the 18 video tokens (34 rows): every output at (2, 2) Ulysses and (4, 1) ring."""
    options = SOUND_ACTION
    g = torch.Generator().manual_seed(5)
    inputs = add_sound_and_action(_inputs("cosmos3_omni"), g)
    with torch.no_grad():
        refs = _outputs(_model("cosmos3_omni", **options)(**inputs))
    return {
        ("cosmos3_omni", "sound_action", cp, tp, mode): _run(
            _model("cosmos3_omni", **options), meshes[cp, tp], mode, inputs, refs, "cosmos3_omni"
        )
        for cp, tp, mode in ((2, 2, "ulysses"), (4, 1, "ring"))
    }


def _cosmos3_kv_heads_tiled(mesh) -> dict:
    """Cosmos 3 at (2, 2) ring with the ring's per-step kv-head expansion tiling the heads (query head i reading kv
    head i % Hkv) instead of repeating each in a row (i // (H / Hkv), SDPA's `enable_gqa`)."""
    expand = ring_module.expand_kv_heads
    ring_module.expand_kv_heads = lambda t, groups, dim: t.repeat(*[groups if d == dim else 1 for d in range(t.ndim)])
    try:
        return _control("cosmos3_omni", mesh, "ring", "cosmos3_omni")
    finally:
        ring_module.expand_kv_heads = expand


def _cosmos3_controls(meshes: dict) -> dict:
    """Cosmos 3 broken: the block-causal ring with every rank's prefix block taken as the first (no earlier
    block seen: a wrong global offset) at (2, 2); every rank packing rank 0's rows; the ring's kv heads expanded in
    the wrong order (tiled); with DTP_FULL=1, both pathways' pad keys unmasked at (4, 1) ring."""
    results, sees = {}, packed_module.sees_whole
    packed_module.sees_whole = lambda source, rank: False
    try:
        results["cosmos3_omni", "control"] = _control("cosmos3_omni", meshes[2, 2], "ring", "cosmos3_omni")
    finally:
        packed_module.sees_whole = sees
    results["cosmos3_omni", "rank0_control"] = _cosmos3_rank0_rows(meshes[2, 2])
    results["cosmos3_omni", "kv_control"] = _cosmos3_kv_heads_tiled(meshes[2, 2])
    if full_run():
        # the config whose generation queries see the text keys through their own norm (`k_norm_und_for_gen`): a
        # third key tensor in the Ulysses exchange
        options = dict(qk_norm_for_text=False, use_und_k_norm_for_gen=True)
        inputs = _inputs("cosmos3_omni")
        with torch.no_grad():
            refs = _outputs(_model("cosmos3_omni", **options)(**inputs))
        model = _model("cosmos3_omni", **options)
        results["cosmos3_omni", "und_k_norm"] = _run(model, meshes[2, 2], "ulysses", inputs, refs, "cosmos3_omni")
        results.update(_cosmos3_sound_action(meshes))
        unmasked = hooks_module.PadState.key_valid
        hooks_module.PadState.key_valid = lambda self, keys, batch, device: None
        try:
            results["cosmos3_omni", "pad_control"] = _control("cosmos3_omni", meshes[4, 1], "ring", "cosmos3_omni")
        finally:
            hooks_module.PadState.key_valid = unmasked
    return results


def _kandinsky6_more(meshes: dict) -> dict:
    """Kandinsky 6 called without audio (video only: the last block returns (video, None)) at (2, 2) ring and, with 9
    video tokens (padded to 12), at (4, 1) ring; and its audio pad keys left unmasked at (4, 1) ring (9 audio tokens
    padded to 12)."""
    inputs = _inputs("kandinsky6")
    video = {k: v for k, v in inputs.items() if k != "audio_hidden_states"}
    with torch.no_grad():
        refs, video_refs = (_outputs(_model("kandinsky6")(**x)) for x in (inputs, video))
    results = {
        ("kandinsky6", "video_only"): _run(_model("kandinsky6"), meshes[2, 2], "ring", video, video_refs, "kandinsky6")
    }
    odd = _kandinsky6_nine_video_tokens(dict(video))  # 9 video tokens, no audio: the `first` slot padded alone
    with torch.no_grad():
        odd_refs = _outputs(_model("kandinsky6")(**odd))
    results["kandinsky6", "video_only_odd"] = _run(
        _model("kandinsky6"), meshes[4, 1], "ring", odd, odd_refs, "kandinsky6"
    )
    unmasked = hooks_module.PadState.key_valid
    hooks_module.PadState.key_valid = lambda self, keys, batch, device: None
    try:
        results["kandinsky6", "pad_control"] = _run(
            _model("kandinsky6"), meshes[4, 1], "ring", inputs, refs, "kandinsky6"
        )
    finally:
        hooks_module.PadState.key_valid = unmasked
    return results


def _kandinsky6_nine_video_tokens(inputs: dict) -> dict:
    """3 latent frames of 3 x 1 tokens (9 video tokens, as many as the 9 audio ones): both streams padded at cp = 2
    (to 10) and 4 (to 12)."""
    latent, types = inputs["hidden_states"], inputs["visual_token_type_ids"]
    g = torch.Generator().manual_seed(21)
    inputs["hidden_states"] = torch.randn(latent.shape[0], 3, 6, 2, latent.shape[-1], generator=g)
    inputs["visual_token_type_ids"] = types[:, :1].expand(-1, 3).contiguous()
    return inputs


def _kandinsky6_odd_video(meshes: dict) -> dict:
    """Kandinsky 6 with 9 video and 9 audio tokens at (2, 2) Ulysses and (4, 1) ring; the control, at (4, 1) ring:
    the video pad keys unmasked (the attentions over the video keys see its pad rows), the audio's still masked."""
    inputs = _kandinsky6_nine_video_tokens(_inputs("kandinsky6"))
    with torch.no_grad():
        refs = _outputs(_model("kandinsky6")(**inputs))
    results = {
        ("kandinsky6", "odd_video", cp, tp, mode): _run(
            _model("kandinsky6"), meshes[cp, tp], mode, inputs, refs, "kandinsky6"
        )
        for cp, tp, mode in ((2, 2, "ulysses"), (4, 1, "ring"))
    }
    masked = pad_view_module.PadView.key_valid

    def video_unmasked(self, keys, batch, device):
        return None if self.at == ("first",) else masked(self, keys, batch, device)

    pad_view_module.PadView.key_valid = video_unmasked
    try:
        results["kandinsky6", "video_pad_control"] = _run(
            _model("kandinsky6"), meshes[4, 1], "ring", inputs, refs, "kandinsky6"
        )
    finally:
        pad_view_module.PadView.key_valid = masked
    return results


def _ltx2_odd_audio(meshes: dict) -> dict:
    """LTX-2 with 7 audio tokens (padded to 8): (2, 2) Ulysses by default; (4, 1) ring and, as the negative control,
    its audio pad keys unmasked with DTP_FULL=1."""
    inputs = _inputs("ltx2")
    inputs["audio_hidden_states"] = inputs["audio_hidden_states"][:, :7].contiguous()
    inputs["audio_num_frames"] = 7
    with torch.no_grad():
        refs = _outputs(_model("ltx2")(**inputs))
    results = {("ltx2", "odd_audio", 2, 2): _run(_model("ltx2"), meshes[2, 2], "ulysses", inputs, refs, "ltx2")}
    if full_run():
        results["ltx2", "odd_audio", 4, 1] = _run(_model("ltx2"), meshes[4, 1], "ring", inputs, refs, "ltx2")
        unmasked = hooks_module.PadState.key_valid
        hooks_module.PadState.key_valid = lambda self, keys, batch, device: None
        try:
            results["ltx2", "odd_audio_control"] = _run(_model("ltx2"), meshes[4, 1], "ring", inputs, refs, "ltx2")
        finally:
            hooks_module.PadState.key_valid = unmasked
    return results


def _controls(meshes: dict) -> dict:
    # video_to_audio only (audio queries over the video keys): audio_to_video's keys are the padded audio, whose pad
    # keys need CP attention (a PlanError otherwise)
    cross_modal = ("transformer_blocks.*.video_to_audio_attn",)
    kandinsky6 = {}
    if full_run():  # Kandinsky 6's streams: the kind of LTX-2's control, which runs by default
        # av (audio queries over the video keys) only: va's keys are the padded audio, whose pad keys need CP; av's
        # are the video, padded when cp does not divide it (not in this call's 16 tokens): dropped from its pad rules
        broken = _without_pad_attention(
            _local("kandinsky6", ("visual_transformer_blocks.*.av_cross_attention",)),
            "visual_transformer_blocks.*.av_cross_attention",
        )
        kandinsky6["kandinsky6", "control"] = _control("kandinsky6", meshes[2, 2], "ring", broken)
        kandinsky6.update(_kandinsky6_more(meshes))
    return {
        **kandinsky6,
        **_kandinsky6_odd_video(meshes),
        **_cosmos3_controls(meshes),
        **_ltx2_odd_audio(meshes),
        ("ltx2", "control"): _control("ltx2", meshes[2, 2], "ring", _local("ltx2", cross_modal)),
        ("helios", "control"): _helios_rank0_modulation(meshes[4, 1]),
        ("wan_animate", "control"): _wan_animate_offset_control(meshes[4, 1]),
        ("wan_animate", "pose_control"): _wan_animate_pose_control(meshes[2, 2]),
        ("wan_animate", "rows_control"): _wan_animate_rows_control(meshes[4, 1]),
        ("latte", "control"): _control("latte", meshes[4, 1], "ring", _unstrided("latte")),
        ("latte", "context_control"): _latte_context_control(meshes[2, 2]),
        ("hunyuanvideo15", "control"): _control(
            "hunyuanvideo15",
            meshes[2, 2],
            "ulysses",
            _without_split("hunyuanvideo15", "transformer_blocks.*", "attention_mask"),
        ),
    }


def _all(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    meshes = {(cp, tp): dtp.make_mesh(tp=tp, cp=cp) for cp, tp in ((2, 2), (4, 1))}
    results = {}
    for name in FAMILIES:
        results.update(_family(name, meshes))
    results.update(_controls(meshes))
    results.update(_padded(meshes))
    return results


@pytest.fixture(scope="module")
def four():
    return spawn(_all, 4)


@pytest.mark.parametrize("name,cp,tp,mode", CASES)
def test_parity(four, name, cp, tp, mode):
    """Tiny model, batch 2, at (cp, tp, mode) on 4 gloo ranks: every output within 1e-5 * max |ref|, and every CP
    attention module routed once per call (Cosmos 3's two pathways each once per layer)."""
    for rank, results in enumerate(four):
        r, modules = results[name, cp, tp, mode], results[name, "modules"]
        assert r["shape_ok"] and r["rel"] <= TOL, (rank, name, cp, tp, mode, r)
        if name in PACKED:  # Ulysses: both pathways' outputs sent home; ring: the causal ring and the full one
            expected = (2 * modules, 0, 0) if mode == "ulysses" else (0, modules, cp * modules)
            assert (r["packed_a2a"], r["packed_causal"], r["blocks"]) == expected, (rank, name, r, modules)
        elif mode == "ulysses":
            assert (r["a2a"], r["blocks"]) == (modules, 0), (rank, name, r, modules)
        else:
            assert (r["a2a"], r["blocks"]) == (0, cp * modules), (rank, name, r, modules)


def test_ltx2_cross_modal_attention_with_the_text_rule_fails(four):
    """Negative control: LTX-2's video-to-audio attention left `local` (the rank's audio queries over the rank's
    chunk of the video) at (2, 2) ring is far off."""
    for results in four:
        assert "error" not in results["ltx2", "control"], results["ltx2", "control"]
        assert results["ltx2", "control"]["rel"] > 1e-3, results["ltx2", "control"]


@pytest.mark.parametrize("cp,tp", ((2, 2), (4, 1)))
def test_ltx2_any_audio_length_is_padded_exactly(four, cp, tp):
    """LTX-2, 7 audio tokens: zero-padded to a multiple of cp with their timesteps and RoPE coords, the pad keys
    masked in audio_attn1 / audio_to_video_attn, the pad rows trimmed: max |out - ref| <= 1e-5 * max |ref| ((4, 1)
    ring with DTP_FULL=1); the control, the same pad keys unmasked, far off."""
    for results in four:
        if (cp, tp) == (4, 1) and not full_run():
            pytest.skip("(4, 1) with DTP_FULL=1")
        r = results["ltx2", "odd_audio", cp, tp]
        assert r["shape_ok"] and r["rel"] <= TOL, r
        if full_run():
            assert results["ltx2", "odd_audio_control"]["rel"] > 1e-3, results["ltx2", "odd_audio_control"]


def test_helios_modulation_rows_of_rank_0_fail(four):
    """Negative control: Helios' temb and modulation rows on every rank taken from rank 0's range of the whole rows
    (44 history + 64 current at cp = 4: 27 history rows), so the current tokens get timestep 0: far off at (4, 1)."""
    for results in four:
        assert results["helios", "control"]["rel"] > 1e-2, results["helios", "control"]


@pytest.mark.parametrize("cp,tp,mode", ((4, 1, "ring"), (2, 2, "ulysses")))
def test_helios_any_history_and_current_length_is_padded_exactly(four, cp, tp, mode):
    """Helios, 6 current tokens and a history cp does not divide: both runs zero-padded, the pad keys masked, the
    current pad rows dropped at the gather: max |out - ref| <= 1e-5 * max |ref|."""
    for results in four:
        r = results["helios", "padded", cp, tp, mode]
        assert r["shape_ok"] and r["rel"] <= TOL, r


def test_helios_unmasked_pad_keys_fail(four):
    """Negative control: the same padding at (4, 1) ring with the pad keys left unmasked is far off."""
    for results in four:
        assert results["helios", "pad_control"]["rel"] > 1e-2, results["helios", "pad_control"]


def test_hunyuanvideo15_whole_text_mask_fails(four):
    """Negative control: HunyuanVideo 1.5's text mask reaching every block whole (not cut with the text) at (2, 2)
    Ulysses: the processor pads / crops it to the rank's [video_r, text_r] length, the wrong keys masked: far off."""
    for results in four:
        r = results["hunyuanvideo15", "control"]
        assert r["rel"] > 1e-2, r


def test_report(four):
    """Prints rank 0's figures (`pytest -s`), the numbers docs/cp.md quotes."""
    for key, r in sorted(four[0].items(), key=str):
        if isinstance(r, dict):
            print(key, f"{r['rel']:.2e}", r.get("error", ""))


def test_wan_animate_face_adapter_with_a_wrong_offset_fails(four):
    """Negative control: Wan Animate's face adapter at (4, 1) ring with every rank's global offset taken as 0 (its
    tokens paired with the first frames' motion tokens): far off."""
    for results in four:
        assert results["wan_animate", "control"]["rel"] > 1e-2, results["wan_animate", "control"]


def test_wan_animate_tokens_without_their_pose_rows_fail(four):
    """Negative control: the video embedded per rank with the pose codes ignored (no pose rows added): measured 0.12."""
    for rank, results in enumerate(four):
        assert results["wan_animate", "pose_control"]["rel"] > 1e-2, (rank, results["wan_animate", "pose_control"])


def test_latte_contiguous_temporal_timesteps_fail(four):
    """Negative control: Latte's temporal timesteps ([B x P] rows) cut contiguously at (4, 1) ring: a rank's rows
    come from the wrong sample (batch 2, two timesteps): far off."""
    for results in four:
        assert results["latte", "control"]["rel"] > 1e-2, results["latte", "control"]


def test_wan_animate_motion_encoder_rows_of_rank_0_fail(four):
    """Negative control: the motion encoder's share of the face crops, every rank running rank 0's rows."""
    for rank, results in enumerate(four):
        assert results["wan_animate", "rows_control"]["rel"] > 1e-2, (rank, results["wan_animate", "rows_control"])


def test_latte_caption_of_the_wrong_sample_fails(four):
    """Negative control: the per-sample caption keys / values, the queries grouped frame-major: measured 0.21."""
    for rank, results in enumerate(four):
        assert results["latte", "context_control"]["rel"] > 1e-2, (rank, results["latte", "context_control"])


def test_cosmos3_causal_prefix_with_a_wrong_offset_fails(four):
    """Negative control: Cosmos 3's block-causal ring at (2, 2) with every rank's text block taken as the prefix's
    first (offset 0: the earlier ranks' keys never seen): far off."""
    for results in four:
        assert "error" not in results["cosmos3_omni", "control"], results["cosmos3_omni", "control"]
        assert results["cosmos3_omni", "control"]["rel"] > 1e-3, results["cosmos3_omni", "control"]  # 1.5e-2 seen


def test_cosmos3_ranks_packing_rank_0s_rows_fail(four):
    """Negative control: Cosmos 3's forward at (2, 2) Ulysses with every rank packing rank 0's rows of the text
    prefix and the video tokens (the read-back by owner rank intact): far off."""
    for results in four:
        r = results["cosmos3_omni", "rank0_control"]
        assert "error" not in r and r["rel"] > 1e-2, r


def test_cosmos3_ring_with_kv_heads_tiled_fails(four):
    """Negative control: Cosmos 3 at (2, 2) ring (8 q / 4 kv heads, 2 a group at tp=2) with the kv heads, which travel
    the ring unexpanded, expanded per block in the wrong order (tiled, not grouped): far off (0.16 seen)."""
    for results in four:
        r = results["cosmos3_omni", "kv_control"]
        assert "error" not in r and r["rel"] > 1e-2, r


@pytest.mark.full
def test_cosmos3_with_its_own_text_key_norm_for_generation(four):
    """Cosmos 3 built with `use_und_k_norm_for_gen` (no text QK-norm): the generation queries' text keys are normed
    apart; (2, 2) Ulysses exact."""
    for results in four:
        r = results["cosmos3_omni", "und_k_norm"]
        assert r["shape_ok"] and r["rel"] <= TOL and r["packed_a2a"] == 4, r


@pytest.mark.full
@pytest.mark.parametrize("cp,tp,mode", ((2, 2, "ulysses"), (4, 1, "ring")))
def test_cosmos3_sound_and_action_outputs(four, cp, tp, mode):
    """Cosmos 3 with sound and action tokens in the generation pathway: dtp's forward packs each rank's rows of them
    and gathers the sound and action heads' outputs as the video's: every output within 1e-5 (5.3e-7 / 4.4e-7 seen)."""
    for results in four:
        r = results["cosmos3_omni", "sound_action", cp, tp, mode]
        assert r["shape_ok"] and r["rel"] <= TOL, r


@pytest.mark.full
def test_cosmos3_unmasked_pad_keys_fail(four):
    """Negative control: Cosmos 3 at (4, 1) ring (7 text tokens padded to 8, 18 video tokens to 20) with the pad keys
    of both pathways left unmasked: far off."""
    for results in four:
        assert "error" not in results["cosmos3_omni", "pad_control"], results["cosmos3_omni", "pad_control"]
        assert results["cosmos3_omni", "pad_control"]["rel"] > 1e-3, results["cosmos3_omni", "pad_control"]  # 2.0e-2


@pytest.mark.full
def test_kandinsky6_cross_modal_attention_with_the_text_rule_fails(four):
    """Negative control: Kandinsky 6's av cross-modal attention left `local` (the rank's audio queries over the rank's
    chunk of the video keys) at (2, 2) ring: far off."""
    for results in four:
        assert "error" not in results["kandinsky6", "control"], results["kandinsky6", "control"]
        assert results["kandinsky6", "control"]["rel"] > 1e-3, results["kandinsky6", "control"]


@pytest.mark.parametrize("cp,tp,mode", ((2, 2, "ulysses"), (4, 1, "ring")))
def test_kandinsky6_any_video_length_is_padded_exactly(four, cp, tp, mode):
    """Kandinsky 6, 9 video and 9 audio tokens: the video zero-padded (`first`) with its RoPE rows, its pad keys
    masked in the video self-attention and av, its pad rows dropped at the grid's gather; the audio as before:
    max |out - ref| <= 1e-5 * max |ref| (measured 3.7e-7 Ulysses, 3.4e-7 ring). Control: the video pad keys
    unmasked at (4, 1) ring, far off."""
    for results in four:
        r = results["kandinsky6", "odd_video", cp, tp, mode]
        assert r["shape_ok"] and r["rel"] <= TOL, r
        control = results["kandinsky6", "video_pad_control"]
        assert "error" not in control and control["rel"] > 1e-3, control


@pytest.mark.full
def test_kandinsky6_video_only_and_unmasked_audio_pad_keys(four):
    """Kandinsky 6 without audio at (2, 2) ring, and with 9 video tokens at (4, 1) ring: exact; negative control: its
    audio pad keys (9 audio tokens padded to 12 at (4, 1) ring) left unmasked: far off."""
    for results in four:
        for case in ("video_only", "video_only_odd"):  # the second: 9 video tokens padded to 12 at (4, 1) ring
            r = results["kandinsky6", case]
            assert r["shape_ok"] and r["rel"] <= TOL, (case, r)
        assert results["kandinsky6", "pad_control"]["rel"] > 1e-3, results["kandinsky6", "pad_control"]
