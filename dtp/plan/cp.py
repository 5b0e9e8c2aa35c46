"""The `cp` section of a plan: which tensors are split along the sequence, and where they are gathered.

Context parallelism (CP) cuts the sequence into `cp` contiguous chunks, one per rank of the mesh's
`cp` axis. Everything per-token (linears, norms, MLPs, RoPE) then runs on the local chunk; only
attention needs the other chunks, and gets them through Ulysses or ring attention (see
`attention.py`). A `cp` section says where chunks are cut and where the result is put back::

    cp:
      split:                                   # module path ("" = the model) -> its tensors
        "":
          hidden_states: {dim: 1, expected_dims: 3}
          img_ids: {dim: 0, expected_dims: 2}
        pos_embed:
          0: {dim: 0, expected_dims: 2, output: true}   # int key: element 0 of the module's OUTPUT
      gather:                                  # module path -> its output is all-gathered on `cp`
        proj_out: {dim: 1, expected_dims: 3}   # (`element: i`: element i of a tuple output only; `trim`: pad rows)
      local: [blocks.*.attn2]                  # optional: attention whose keys stay whole on every rank
      halo: {blocks.*.ff.conv_depth: {dim: 2}} # optional: convolutions over the token grid's split rows
      keep: {norm_final: {input: {of: blocks.0.hidden_states, after: blocks.0.encoder_hidden_states}}}
                                               # optional: a slice by a global count after the blocks (`KeepRule`)
      gathered: {blocks.*.mlp: expert_choice}  # optional: a choice over the whole sequence, made from gathered
                                               # scores (`GATHERED_KINDS`)
      grid: {out_layer: {input: x, tokens: blocks.-1}}  # optional: the tokens stay cut through the forward's own
                                               # reshape to the grid; the per-token output layer's patch grid is
                                               # gathered in grid order (`GridRule`)
      forward: {name: helios, pad: {...}}      # optional: dtp's forward for the model's class cuts the sequence
                                               # before the forward's own joins (`ForwardRule`)
      per_sample: {blocks.*.attn2: caption_projection}  # optional: `local` cross-attention to that module's
                                               # output, which the forward repeats per frame: K / V once per sample
      batch_rows: [motion_encoder]             # optional: modules over a whole batch of independent rows: each rank
                                               # runs ceil(rows / cp) of them, the outputs all-gathered

A split key `name[i]` cuts element i of a tuple input only (JoyImage's RoPE argument ((image cos, sin), text
tables); Allegro's ((t, h, w) tables, (t, h, w) position ids)): each element with its own rule (`pad` slot), the
other elements and a None element passing whole (`SplitRule.element`; `element: i` in the rule says the same).

`cp: {refused: "why"}` instead says the model cannot take CP; any cp > 1 is then a PlanError quoting it.
`ring_refused: "why"` beside `split`/`gather` says the model takes Ulysses only (e.g. a per-query mask that
Ulysses, holding the whole sequence for its heads, applies whole, and ring attention's key blocks cannot):
cp > 1 with cp_mode='ring' is then a PlanError quoting it.

`local` names attention modules whose keys and values are NOT split (cross-attention from the local
image/video chunk to the whole text): each query chunk attends over every key already, so they run
unchanged. Every other attention module is routed through CP attention (Ulysses or ring).

`halo` names convolutions that run over the token grid (Sana's Mix-FFN 3 x 3 depthwise conv on the tokens
unflattened to [B, C, H, W]): with the grid's rows split over `cp` (dim 2), each rank needs `padding` rows of each
neighbour: the conv runs on the rank's rows, then the rows received from the neighbours add their contribution to
the first and last `padding` output rows, which the conv's zero padding left out (`runtime/cp/halo.py`), so the zero
padding counts only at the image's edges: exact.

Rank r of `cp` keeps elements `[r * n / cp, (r + 1) * n / cp)` of a length-`n` dim, so a gather
concatenating the chunks in rank order restores the original order. A diffusers `_cp_plan`
(`ContextParallelInput` / `ContextParallelOutput` objects, matched by class name) reads into the
same types.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ..errors import PlanError
from ..policy import check_degree, is_int


@dataclass(frozen=True)
class SplitRule:
    """Cut one tensor of the module(s) at `key` into `cp` contiguous chunks along `dim`.

    key: module path, `*` over a ModuleList allowed, `""` for the model itself.
    name: a forward() parameter name (an input), or an int index into the module's output tuple.
    dim: the sequence dim of that tensor.
    expected_dims: if set, the tensor's ndim must equal it (catches a plan written for another layout).
    output: split the module's output (`name` is then an output index, or 0 for a bare tensor)
        instead of its input; for outputs computed from the whole sequence, such as RoPE tables.
    segments: for a joint tensor (a [video | text] attention mask) whose `dim` concatenates the
        sequences of these other inputs of the same module, in this order: each segment is cut on its
        own, so the result lines up with the rank's [video_r | text_r] tokens. Segment lengths are
        cp x the (local) lengths of the named inputs along dim 1. Example: mask [B, 1, 1, 24 + 8],
        cp = 2, rank 1 -> mask[..., 12:24] ++ mask[..., 28:32].
    when_dims: split the tensor only when it has this many dims and pass it whole otherwise: a
        timestep is per sample ([B], the same for every token, whole on every rank) or per token
        ([B, S], Wan 2.2 ti2v / LTX; [B, S, D] embeddings for Cosmos' per-frame timesteps), and only
        the per-token form is cut, with its tokens.
    flatten: with `output`: dims `dim`.. of the output are the token grid (Wan's patch embedding returns
        [B, C, F, H, W] and its caller flattens dims 2.. into tokens): they are flattened, this rank's
        contiguous chunk of them is copied out and returned shaped [..., 1, ..., L] (same ndim), so the
        caller's own flatten yields the rank's tokens and the whole embedded sequence is freed at once
        instead of staying alive until the first block has run. A channels-last grid (Cosmos' patch
        embedding, [B, T, H, W, D], `expected_dims: 5`) is cut on its token dims 1..3 by the embedding's
        local forward (`runtime/cp/local_embed.py`), which computes only the rank's tokens.
    count: the input is an int that counts the rows of the split token grid (a block's grid `height`), not a
        tensor: each rank gets count / cp, its whole rows (no `dim`: `{count: true}` alone). Sana's blocks unflatten
        their tokens with the global (height, width) before the Mix-FFN; rank r's N / cp contiguous tokens are
        height / cp whole rows. 64 x 64 grid, cp = 4: every rank gets height 16. A count cp does not divide is a
        ForwardError at call time (the rows would not split whole).
    tail: the tensor is [head | tail] along `dim`, the tail's length given by the module's int input of this name
        (its global value, read before a `count` split of it): head and tail are each cut into cp chunks and the
        rank keeps [head_r | tail_r] (`runtime/cp/tail.py`). Helios' blocks split their tokens at the global
        `original_context_length` into [history, current]; with both cut on their own, every rank's chunk is
        [history_r | current_r] and `original_context_length: {count: true}` hands it the local current count (the
        bundled Helios plan now makes the same cut before its forward's joins: `cp.forward`, `ForwardRule`).
        40 history + 24 current tokens, cp = 4: rank 1 keeps history 10..19 and current 6..11 (tokens 46..51).
        With `pad` (`at: first`), the head and the tail are each zero-padded to a multiple of cp, as the forward's
        `first` and `last` padded sequences: the listed attentions mask both pad runs, `trim: last` drops the tail's.
    strided: rank r keeps elements r, r + cp, ... of `dim` (`runtime/cp/strided.py`): for a per-sample tensor repeated
        once per token position ([B x P] rows, sample-major; Latte's temporal timesteps), whose rows each rank needs
        one per local position of each sample, the batch B unknown to the hook.
    element: the input is a tuple whose element `element` (a tensor, or a tuple of them) is cut; the other elements,
        and a None element or argument, pass whole. Written `name[i]` as the split key (or `element: i` in the
        rule: the same rule), with dim, expected_dims and pad only; one rule per element, each its own `pad` slot.
        Allegro's blocks take image_rotary_emb = ((t, h, w) frequency tables, (t, h, w) position ids [1, S]): the
        position ids are cut with their tokens (`image_rotary_emb[1]`), the tables stay whole; JoyImage's
        ((image cos, sin), text tables or None): `[0]` padded `first` with the image, `[1]` `last` with the text.
    embed: a module path: the tensor is that patch embedding's output after the forward's own flatten (raster, or
        6 SR's 64-token blocks), and the embedding computes the rank's tokens only (`runtime/cp/grid_embed.py`): it
        hands the forward a grid of token indices instead of the embedded grid, this split cuts the indices like
        tokens, and the rank's indices are embedded here. A plain input split ([B, S, D] at dim 1, `pad` allowed).
        Kandinsky 5 held the whole embedded video [B, S, D] through its first block otherwise (its forward's local).
    per_frame: with `embed`, a module whose [B, F, D] output the forward adds to the embedded grid per frame
        (Kandinsky 6's token types, `embed + types[:, :, None, None, :]`): it hands the forward zeros [B, F, 1]
        (int64: the indices pass the sum unchanged) and each rank's token gets its frame's row when embedded.
    added: with `embed`, a second patch embedding whose grid the forward adds into part of the embedded grid (Wan 2.2
        Animate's pose, `hidden_states[:, :, 1:] = hidden_states[:, :, 1:] + pose_patch_embedding(pose)`): it hands
        the forward int64 codes S (1 + its token index), S the embedded grid's tokens, so the sum tells each token
        which added row it got (none: code < S), and the rank's tokens get theirs when embedded (`grid_embed.py`).
    frames_of: with `output`: output 0 is [B x F, P, D], the F frames of each of the B samples of the model's input of
        this name (B its dim 0), which the caller makes frame-major tokens [B, F x P, D]: the rank keeps its chunk of
        each sample's F x P tokens, returned [B, F x P / cp, D] (`runtime/cp/framewise.py`; Allegro's per-frame
        `pos_embed`, whose `PatchEmbed` then projects only the frames the rank's tokens touch). `dim` is 1.
    skip: with `output`: output 0's first rows along `dim`, as many as the module's input of this name has, pass whole
        and only the rest is cut (with `pad`, zero-padded and recorded like an input split): a joint [text | video]
        embedding whose caller slices the text off by the text input's length (ConsisID's and CogVideoX's
        `CogVideoXPatchEmbed`, which then projects only the rank's video frames; `runtime/cp/joint_embed.py`).
    """

    key: str
    name: str | int
    dim: int
    expected_dims: int | None = None
    output: bool = False
    segments: tuple[str, ...] = ()
    when_dims: int | None = None
    pad: PadRule | None = None
    flatten: bool = False
    count: bool = False
    tail: str | None = None
    strided: bool = False
    element: int | None = None
    embed: str | None = None
    per_frame: str | None = None
    added: str | None = None
    frames_of: str | None = None
    skip: str | None = None


@dataclass(frozen=True)
class PadRule:
    """A split tensor whose length cp need not divide: zero-padded at its end to a multiple of cp, the
    padding masked out of attention, so the result is exact.

    at: where this tensor's tokens sit in the joint key sequence of each listed attention module's
        processor (`first`: CogVideoX's [text, video]; `last`: SD3's [image, text]), so that the
        rank's padded keys can be located among its local keys.
    attention: the attention globs whose keys include this tensor's tokens: their pad keys are masked
        (weight 0, as if absent). Pad queries give outputs nobody reads, as long as the tensor is only
        ever dropped by the model (text streams are), never gathered.
    Example: 226 text tokens, cp = 4 -> padded to 228, 57 per rank; rank 3 holds 55 real + 2 pad.
    Several splits may carry the same rule when they are one sequence (Lumina2's joint tokens, their key mask
    and RoPE): each is zero-padded alike. A padded tensor that is gathered keeps its pad at the end (Lumina2's
    unpatchify reads each sample's tokens by their lengths, so trailing pad tokens are never read).
    """

    at: str
    attention: tuple[str, ...]


PAD_AT = ("first", "last")


@dataclass(frozen=True)
class GatherRule:
    """All-gather the output of the module(s) at `key` on the `cp` axis, along `dim`, in rank order."""

    key: str
    dim: int
    expected_dims: int | None = None
    trim: str | None = None  # `first`|`last`: the output is that padded split's sequence: its pad rows are dropped
    element: int | None = None  # gather element i of a tuple output only, the others pass (Kandinsky 6's last
    # fused block returns (video, audio): the video gathered there, the padded audio at its output layer)


@dataclass(frozen=True)
class HaloRule:
    """The convolution(s) at `key` run over a token grid whose rows (input dim `dim`) are split over `cp`: each rank
    takes `padding` rows from each neighbour and adds their contribution to its seam output rows (see the module
    docstring). The conv must be a zero-padded, stride-1, undilated 'same' conv along `dim` (checked in resolve)."""

    key: str
    dim: int


@dataclass(frozen=True)
class KeepRule:
    """The forward keeps part of a split sequence by a *global* count after the blocks (a slice outside any module):
    a hook on the module at `key` rewrites its input `name` (a str; a pre-hook) or output element `name` (an int, 0
    for a bare tensor; a forward hook) so that the forward's slice, run on a rank's chunk, leaves that rank's own
    tokens (`runtime/cp/kept.py`). `key` may end in a negative index (`single_transformer_blocks.-1`: the last block,
    whatever the depth). `of` is the split id (`"<module path>.<input name or output index>"`) whose chunk the
    tensor holds; exactly one of:

    last: a module path: the forward keeps the last n tokens, n the length (dim 1) of that module's output this
        forward (FramePack: `hidden_states[:, -n:]`, n = the noisy latents' tokens after the history tokens). Rank r
        of cp holds global rows [r c, (r + 1) c) of the `of` sequence (c rows a rank, S = c cp); it keeps the ones in
        [S - n, S), which may be none; `gather` (a module path) then all-gathers those ragged chunks in rank order.
    after: a split id: the input is [that split's chunk, the `of` chunk] and the forward drops the first T rows, T
        the whole (unpadded) length of that split (ConsisID: `cat([text, video])[:, T:]`): the input becomes
        [T zero rows, the `of` chunk], so the slice leaves the rank's `of` chunk (gathered by a plain `gather`).
    """

    key: str
    name: str | int
    of: str
    last: str | None = None
    after: str | None = None
    gather: str | None = None


@dataclass(frozen=True)
class GridRule:
    """The tokens stay cut through the forward's own reshape of them to the token grid, and the per-token module at
    `key` (an output layer) runs on the rank's rows only; its output, a patch grid, is gathered in grid order
    (`runtime/cp/grid.py`). Instead of a `gather` at the last block, after which every rank runs the output layer on
    the whole sequence (Kandinsky 5's fp32 norm and modulation over [B, F, H, W, D]: the per-rank peak).

    tokens: the module whose output holds the rank's tokens as the blocks leave them (`blocks.-1`: the last block),
        element `element` of a tuple output (None: a bare tensor). Its hook keeps the rank's rows and hands the
        forward an index stand-in instead: token indices [B, S, 1] (int64, S the whole length, a zero-stride view
        along B), which the forward's reshape / permute between the blocks and `key` lay out as the grid.
    key: the output layer; its input `input` must be that grid of indices ([B, F, H, W, 1]: the grid order of the
        tokens, whatever order the forward flattened them in: raster, or NABLA's 64-token blocks). It gets the rank's
        rows instead, shaped [B, 1, 1, n, D]; its output [B, p0, p1, n p2, C] (each token's p0 x p1 x p2 patch, the
        channels-last layout of the Kandinsky output layers) is all-gathered and put in grid order: [B, F p0, H p1,
        W p2, C].
    trim: `first`|`last`: the tokens are that padded split's sequence: its pad rows are dropped after the gather.
    Example: 2 frames of 2 x 3 tokens (S = 12), cp = 2, patch (1, 2, 2): rank 1 runs the layer on tokens 6..11 as
    [B, 1, 1, 6, D] -> [B, 1, 2, 12, C]; the gather puts token 6 (frame 1, row 0, column 0) at [:, 1, 0:2, 0:2].
    """

    key: str
    input: str
    tokens: str
    element: int | None = None
    trim: str | None = None


@dataclass(frozen=True)
class ForwardRule:
    """The model's forward is replaced under CP by dtp's copy of it (`name`, one of `CP_FORWARDS`) with the sequence
    cut moved before the forward's own joins: where diffusers concatenates whole-sequence tensors in the forward's
    body (no module boundary a hook could cut at), the copy builds the rank's rows of each and hands the blocks the
    local tensors (`runtime/cp/helios.py`). It stands for the splits of those tensors (the plan lists none).

    pad: as a split's `PadRule`: each run the forward cuts is zero-padded to a multiple of cp (`CP_FORWARDS` says which
        is `first` / `last`), the listed attentions mask the pad keys, a gather's `trim` drops the pad rows. None: a
        run cp does not divide is a ForwardError at call time.
    """

    name: str
    pad: PadRule | None = None


# `cp.forward` names: helios: HeliosTransformer3DModel, [history | current] cut as `tail` splits do (history `first`,
# current `last`), before the forward joins the history and current tokens, their RoPE rows and the per-token
# modulation, so none of them is built whole; framepack: HunyuanVideoFramepackTransformer3DModel, the packed [4x, 2x,
# clean, noisy] tokens and RoPE rows cut contiguously (`first`) from the streams, never packed whole; recorded as the
# split id `forward` (a `keep`'s `of`). The model's class is checked in `resolve/binding/cp.py`.
# cosmos3_omni: Cosmos3OmniTransformer, each rank packing its own rows of the text prefix (`first`) and the generation
# tokens (`last`), cut as padded splits of `und_seq` / `gen_seq`, its RoPE rows and timestep embeddings alike; the
# read-back gathers proj_out's output only (`runtime/cp/cosmos3.py`).
CP_FORWARDS = ("helios", "framepack", "cosmos3_omni")
GATHERING_FORWARDS = ("cosmos3_omni",)  # forwards that gather their own output: the plan needs no `gather`


@dataclass(frozen=True)
class CpPlan:
    """A parsed `cp` section: the splits and the gathers, in file order."""

    splits: tuple[SplitRule, ...]
    gathers: tuple[GatherRule, ...]
    local_attention: tuple[str, ...] = ()  # attention globs whose keys are whole on every rank
    refused: str | None = None  # `cp: {refused: why}`: this model cannot take CP; cp > 1 is a PlanError saying why
    ring_refused: str | None = None  # `ring_refused: why`: Ulysses only; cp_mode='ring' is a PlanError saying why
    halo: tuple[HaloRule, ...] = ()  # convolutions over the split token grid: halo rows from the neighbours
    keep: tuple[KeepRule, ...] = ()  # slices by a global count after the blocks (`KeepRule`)
    gathered: tuple[tuple[str, str], ...] = ()  # (module glob, kind): whole-sequence choices (`GATHERED_KINDS`)
    grid: tuple[GridRule, ...] = ()  # output layers run on the rank's rows past the forward's reshape (`GridRule`)
    forward: ForwardRule | None = None  # dtp's forward for the model's class, cutting before its joins (`ForwardRule`)
    # (attention glob, context module path): `local` cross-attentions whose context [B x F, L, D] is that module's
    # [B, L, D] output repeated once per frame by the forward (`repeat_interleave(F, dim=0)`, Latte's spatial blocks
    # and `caption_projection`): the module's output is kept, the forward repeats an int64 stand-in [B, L, 1], and
    # the keys / values are projected once per sample (`runtime/cp/per_sample.py`): no [B x F, L, D] tensor
    per_sample: tuple[tuple[str, str], ...] = ()
    # modules whose input 0 is whole on every rank and whose rows (dim 0) are independent (Wan Animate's motion encoder
    # over a batch of face crops): each rank runs its ceil(rows / cp) and the outputs are all-gathered in rank order
    # (`runtime/cp/batch_rows.py`)
    batch_rows: tuple[str, ...] = ()


# `cp.gathered` kinds: a module that chooses over the whole sequence runs a CP forward that makes the choice from
# gathered scores (all-gather in, the exact choice on every rank, each rank keeping its own tokens' part):
# expert_choice: expert-choice MoE routing, each expert taking the top-C tokens of the sequence (Nucleus-Image's
#     `NucleusMoELayer`; `runtime/cp/expert_choice.py`). Modules of the glob of another class are left alone (a
#     dense MLP in the first blocks); at least one must be of the kind's class (`resolve/binding/cp.py`).
GATHERED_KINDS = ("expert_choice",)


_SPLIT_FIELDS = {
    "dim",
    "expected_dims",
    "output",
    "segments",
    "when_dims",
    "pad",
    "flatten",
    "tail",
    "strided",
    "element",
    "embed",
    "per_frame",
    "added",
    "frames_of",
    "skip",
}
_SECTION_FIELDS = {
    "split",
    "gather",
    "local",
    "ring_refused",
    "halo",
    "keep",
    "gathered",
    "grid",
    "forward",
    "per_sample",
    "batch_rows",
}
_ITEM = re.compile(r"(\w+)\[(\d+)\]")
_DIFFUSERS_INPUT = "ContextParallelInput"
_DIFFUSERS_OUTPUT = "ContextParallelOutput"


def cp_plan_from_mapping(data, name: str) -> CpPlan:
    """Parse a dtp `cp` mapping (`{split: ..., gather: ...}`) or a diffusers `_cp_plan` dict."""
    if not isinstance(data, dict) or not data:
        raise PlanError(f"plan {name}: `cp` must be a non-empty mapping, got {data!r}.")
    if set(data) == {"refused"}:
        if not isinstance(data["refused"], str) or not data["refused"].strip():
            raise PlanError(f"plan {name}: cp.refused must say why the model cannot take CP, got {data['refused']!r}.")
        return CpPlan(splits=(), gathers=(), refused=data["refused"].strip())
    sections = ("split", "gather", "halo", "keep", "gathered", "grid", "per_sample")
    if set(data) <= _SECTION_FIELDS and all(isinstance(data.get(k, {}), dict) for k in sections):
        return _from_dtp(data, name)
    return _from_diffusers(data, name)


def _from_dtp(data: dict, name: str) -> CpPlan:
    splits = []
    for key, entries in data.get("split", {}).items():
        if not isinstance(entries, dict) or not entries:
            raise PlanError(f"plan {name}: cp.split['{key}'] must map tensor names to {{dim: ...}}, got {entries!r}.")
        for tensor, spec in entries.items():
            splits.append(_split_rule(key, tensor, spec, name))
    gathers = [_gather_rule(key, spec, name) for key, spec in data.get("gather", {}).items()]
    local = _local_attention(data.get("local", []), name)
    ring_refused = data.get("ring_refused")
    if ring_refused is not None and (not isinstance(ring_refused, str) or not ring_refused.strip()):
        raise PlanError(f"plan {name}: cp.ring_refused must say why ring attention cannot run, got {ring_refused!r}.")
    ring_refused = None if ring_refused is None else ring_refused.strip()
    halo = tuple(_halo_rule(key, spec, name) for key, spec in data.get("halo", {}).items())
    keep = tuple(
        _keep_rule(key, tensor, spec, name) for key, entries in data.get("keep", {}).items()
        for tensor, spec in (entries or {}).items()
    )  # fmt: skip
    gathered = tuple(_gathered_rule(key, kind, name) for key, kind in data.get("gathered", {}).items())
    grid = tuple(_grid_rule(key, spec, name) for key, spec in data.get("grid", {}).items())
    forward = None if data.get("forward") is None else _forward_rule(data["forward"], name)
    per_sample = tuple(
        _per_sample_rule(key, context, local, name) for key, context in data.get("per_sample", {}).items()
    )
    batch_rows = _batch_rows(data.get("batch_rows", []), name)
    cp_plan = CpPlan(
        tuple(splits), tuple(gathers), local_attention=local, ring_refused=ring_refused, halo=halo, keep=keep,
        gathered=gathered, grid=grid, forward=forward, per_sample=per_sample, batch_rows=batch_rows,
    )  # fmt: skip
    return _checked(cp_plan, name)


def _forward_rule(spec, name: str) -> ForwardRule:
    where = f"plan {name}: cp.forward"
    if not isinstance(spec, dict) or spec.get("name") not in CP_FORWARDS or set(spec) - {"name", "pad"}:
        raise PlanError(
            f"{where}: expected {{name: {'|'.join(CP_FORWARDS)}, pad: {{at: first, attention: [glob, ...]}}?}} "
            f"(dtp's forward for the model's class, plan/cp.py ForwardRule), got {spec!r}."
        )
    return ForwardRule(spec["name"], None if spec.get("pad") is None else _pad_rule(spec["pad"], where))


def _local_attention(keys, name: str) -> tuple[str, ...]:
    if not isinstance(keys, list) or not all(isinstance(key, str) and key for key in keys):
        raise PlanError(f"plan {name}: cp.local must be a list of attention module paths, got {keys!r}.")
    for key in keys:
        _check_key(key, name)
    return tuple(keys)


def _halo_rule(key, spec, name: str) -> HaloRule:
    where = f"plan {name}: cp.halo['{key}']"
    _check_key(key, name)
    if not isinstance(spec, dict) or set(spec) != {"dim"}:
        raise PlanError(f"{where}: expected {{dim: int}} (the conv input's row dim, 2 for [B, C, H, W]), got {spec!r}.")
    return HaloRule(key, _int(spec["dim"], where, "dim"))


def _gathered_rule(key, kind, name: str) -> tuple[str, str]:
    _check_key(key, name)
    if kind not in GATHERED_KINDS:
        raise PlanError(
            f"plan {name}: cp.gathered['{key}'] must be one of {', '.join(GATHERED_KINDS)} (the choice the module "
            f"makes over the whole sequence), got {kind!r}."
        )
    return key, kind


def _batch_rows(keys, name: str) -> tuple[str, ...]:
    if not isinstance(keys, list) or not all(isinstance(key, str) and key for key in keys):
        raise PlanError(f"plan {name}: cp.batch_rows must be a list of module paths, got {keys!r}.")
    for key in keys:
        _check_key(key, name)
    return tuple(keys)


def _per_sample_rule(key, context, local: tuple[str, ...], name: str) -> tuple[str, str]:
    _check_key(key, name)
    if not isinstance(context, str) or not context or "*" in context:
        raise PlanError(
            f"plan {name}: cp.per_sample['{key}'] names the module (no `*`) whose [B, L, D] output the forward repeats "
            f"per frame as this attention's context, got {context!r}."
        )
    if key not in local:
        raise PlanError(
            f"plan {name}: cp.per_sample['{key}'] must also be in cp.local (a cross-attention over the whole context "
            f"on every rank); cp.local is {list(local)}."
        )
    return key, context


def _grid_rule(key, spec, name: str) -> GridRule:
    where = f"plan {name}: cp.grid['{key}']"
    _check_key(key, name)
    fields = set(spec) if isinstance(spec, dict) else set()
    names = isinstance(spec, dict) and all(isinstance(spec.get(f), str) and spec[f] for f in ("input", "tokens"))
    if not names or fields - {"input", "tokens", "element", "trim"} or "*" in key or "*" in spec["tokens"]:
        raise PlanError(
            f"{where}: expected {{input: the output layer's grid input, tokens: the module path whose output holds "
            f"the rank's tokens, element: int?, trim: first|last?}} (no `*`; plan/cp.py GridRule), got {spec!r}."
        )
    element, trim = spec.get("element"), spec.get("trim")
    if element is not None and (not is_int(element) or element < 0):
        raise PlanError(f"{where}: `element` is the index (>= 0) of the tokens in the `tokens` module's tuple output.")
    if trim is not None and trim not in PAD_AT:
        raise PlanError(f"{where}: `trim` names the padded split (`pad.at`) whose pad rows to drop: first|last.")
    return GridRule(key, spec["input"], spec["tokens"], element, trim)


def _keep_rule(key, tensor, spec, name: str) -> KeepRule:
    where = f"plan {name}: cp.keep['{key}']['{tensor}']"
    _check_key(key, name)
    fields = set(spec) if isinstance(spec, dict) else set()
    strings = isinstance(spec, dict) and all(isinstance(v, str) and v for v in spec.values())
    named = isinstance(tensor, str) or is_int(tensor)
    if not strings or not named or "of" not in fields or len(fields & {"last", "after"}) != 1:
        raise PlanError(
            f"{where}: expected {{of: split id, last: module path, gather: module path?}} or {{of: split id, after: "
            f"split id}} (see dtp/plan/cp.py KeepRule), got {spec!r}."
        )
    if fields - {"of", "last", "after", "gather"} or ("gather" in fields and "last" not in fields):
        raise PlanError(f"{where}: unknown fields, or `gather` without `last`: {spec!r}.")
    return KeepRule(key, tensor, spec["of"], spec.get("last"), spec.get("after"), spec.get("gather"))


def _count_rule(key, tensor, spec, where: str) -> SplitRule:
    """`{count: true}`: an int input counting the split grid's rows, divided by cp (see `SplitRule.count`)."""
    if set(spec) != {"count"} or spec["count"] is not True or not isinstance(tensor, str):
        raise PlanError(
            f"{where}: a count split is `{{count: true}}` alone, on a named int input (the grid rows each rank gets "
            f"count / cp of), got {spec!r}."
        )
    return SplitRule(key, tensor, 0, count=True)


def _split_rule(key, tensor, spec, name: str) -> SplitRule:
    where = f"plan {name}: cp.split['{key}']['{tensor}']"
    _check_key(key, name)
    if isinstance(spec, dict) and "count" in spec:
        return _count_rule(key, tensor, spec, where)
    if not isinstance(spec, dict) or "dim" not in spec or set(spec) - _SPLIT_FIELDS:
        raise PlanError(
            f"{where}: expected {{dim: int, expected_dims: int?, output: bool?, segments: [str]?, when_dims: int?}}, "
            f"got {spec!r}."
        )
    output = spec.get("output", False)
    if not isinstance(output, bool):
        raise PlanError(f"{where}: `output` must be true or false, got {output!r}.")
    _check_tensor_key(tensor, output, where)
    segments = spec.get("segments", [])
    if not isinstance(segments, list) or not all(isinstance(n, str) for n in segments) or (segments and output):
        raise PlanError(f"{where}: `segments` must be a list of input names of the same module, got {segments!r}.")
    dim, expected = _int(spec["dim"], where, "dim"), _opt_int(spec.get("expected_dims"), where)
    when = _opt_int(spec.get("when_dims"), where, "when_dims")
    if when is not None and expected is not None:
        raise PlanError(f"{where}: `when_dims` (split only tensors of that many dims) excludes `expected_dims`.")
    pad = None if spec.get("pad") is None else _pad_rule(spec["pad"], where)
    if pad is not None and segments:
        raise PlanError(f"{where}: `pad` applies to a plain split (no `segments`).")
    flatten = spec.get("flatten", False)
    if not isinstance(flatten, bool) or (flatten and not output):
        raise PlanError(f"{where}: `flatten` (a token grid output cut after flattening) needs `output: true`.")
    tail = spec.get("tail")
    if tail is not None and (not isinstance(tail, str) or output or segments):
        raise PlanError(f"{where}: `tail` names an int input of the same module (a plain input split), got {tail!r}.")
    if tail is not None and pad is not None and pad.at != "first":
        raise PlanError(f"{where}: with `tail`, `pad.at` is `first` (the head's run; the tail's is `last`).")
    strided = spec.get("strided", False)
    if not isinstance(strided, bool) or (strided and (output or segments or pad is not None or tail is not None)):
        raise PlanError(f"{where}: `strided` (true / false) is a plain input split, got {strided!r}.")
    tensor, element = _element(tensor, spec.get("element"), where)
    if element is not None and (output or segments or flatten or when is not None or tail is not None or strided):
        raise PlanError(f"{where}: an element split (`name[i]` or `element: i`) takes dim, expected_dims, pad only.")
    embed, per_frame, added = _embed_fields(spec, where, output, segments, flatten, when, tail, strided, element)
    frames_of, skip = _output_cut_fields(spec, where, output, tensor, dim, expected, pad, flatten, when)
    rule = SplitRule(key, tensor, dim, expected, output, tuple(segments), when, pad, flatten)
    return dataclasses.replace(
        rule,
        tail=tail,
        strided=strided,
        element=element,
        embed=embed,
        per_frame=per_frame,
        added=added,
        frames_of=frames_of,
        skip=skip,
    )


def _embed_fields(spec, where, output, segments, flatten, when, tail, strided, element) -> tuple:
    """`embed` / `per_frame` / `added` (module paths) of a plain input split, checked."""
    plain = not (output or segments or flatten or when is not None or tail is not None or strided)
    embed, per_frame, added = spec.get("embed"), spec.get("per_frame"), spec.get("added")
    if any(v is not None and not (isinstance(v, str) and v and "*" not in v) for v in (embed, per_frame, added)):
        raise PlanError(
            f"{where}: `embed`, `per_frame` and `added` are module paths (no `*`), got {embed!r}, {per_frame!r}, "
            f"{added!r}."
        )
    if (embed is not None and (not plain or element is not None)) or (embed is None and (per_frame or added)):
        raise PlanError(f"{where}: `embed` (with `per_frame` / `added` or not) goes with a plain input split only.")
    if per_frame is not None and added is not None:
        raise PlanError(f"{where}: `per_frame` and `added` are two encodings of the index grid: one of them only.")
    return embed, per_frame, added


def _output_cut_fields(spec, where, output, tensor, dim, expected, pad, flatten, when) -> tuple:
    """`frames_of` / `skip` (cuts of an embedding's output 0), checked."""
    frames_of = spec.get("frames_of")
    plain_output = output and tensor == 0 and dim == 1 and expected in (None, 3) and not (pad or flatten or when)
    if frames_of is not None and (not isinstance(frames_of, str) or not plain_output):
        raise PlanError(
            f"{where}: `frames_of` (a model input whose dim 0 is the batch) cuts output 0 along dim 1 with nothing "
            f"else but `expected_dims: 3`, got {spec!r}."
        )
    skip = spec.get("skip")
    if skip is not None and (not isinstance(skip, str) or not output or tensor != 0 or flatten or when or frames_of):
        raise PlanError(
            f"{where}: `skip` (an input of the module whose length of rows passes whole) cuts output 0, with dim, "
            f"expected_dims and pad only, got {spec!r}."
        )
    return frames_of, skip


def _element(tensor, element, where: str) -> tuple:
    """(input name, element index or None) of a split key `name[i]` or a rule's `element: i` (one of the two)."""
    if element is not None and (not is_int(element) or element < 0):
        raise PlanError(f"{where}: `element` is the index (>= 0) of the cut element of a tuple input, got {element!r}.")
    matched = _ITEM.fullmatch(tensor) if isinstance(tensor, str) else None
    if matched is None:
        return tensor, element
    if element is not None:
        raise PlanError(f"{where}: name the element once: `{tensor}` or `element: {element}`, not both.")
    return matched[1], int(matched[2])


def _pad_rule(spec, where: str) -> PadRule:
    if not isinstance(spec, dict) or set(spec) != {"at", "attention"} or spec["at"] not in PAD_AT:
        raise PlanError(f"{where}: `pad` must be {{at: first|last, attention: [glob, ...]}}, got {spec!r}.")
    keys = spec["attention"]
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
        raise PlanError(f"{where}: pad.attention must list the attention globs that see these tokens, got {keys!r}.")
    return PadRule(spec["at"], tuple(keys))


def _gather_rule(key, spec, name: str) -> GatherRule:
    where = f"plan {name}: cp.gather['{key}']"
    _check_key(key, name)
    if not isinstance(spec, dict) or "dim" not in spec or set(spec) - {"dim", "expected_dims", "trim", "element"}:
        raise PlanError(
            f"{where}: expected {{dim: int, expected_dims: int?, trim: first|last?, element: int?}}, got {spec!r}."
        )
    trim = spec.get("trim")
    if trim is not None and trim not in PAD_AT:
        raise PlanError(f"{where}: `trim` names the padded split (`pad.at`) whose pad rows to drop: first|last.")
    element = spec.get("element")
    if element is not None and (not is_int(element) or element < 0):
        raise PlanError(f"{where}: `element` is the index (>= 0) of the gathered element of a tuple output.")
    rule = GatherRule(key, _int(spec["dim"], where, "dim"), _opt_int(spec.get("expected_dims"), where), trim)
    return dataclasses.replace(rule, element=element)


def _from_diffusers(data: dict, name: str) -> CpPlan:
    """`{module: {input name or output index: ContextParallelInput}}` and `{module: ContextParallelOutput}`."""
    splits, gathers = [], []
    for key, value in data.items():
        _check_key(key, name)
        if type(value).__name__ == _DIFFUSERS_OUTPUT:
            gathers.append(GatherRule(key, value.gather_dim, value.expected_dims))
            continue
        if not isinstance(value, dict):
            raise PlanError(
                f"plan {name}: cp key '{key}': expected a mapping of inputs or a ContextParallelOutput, "
                f"got {type(value).__name__}."
            )
        for tensor, spec in value.items():
            if type(spec).__name__ != _DIFFUSERS_INPUT:
                raise PlanError(
                    f"plan {name}: cp key '{key}', '{tensor}': expected a ContextParallelInput, got {spec!r} "
                    f"(lists of inputs per tensor are not supported)."
                )
            where = f"plan {name}: cp key '{key}', '{tensor}'"
            _check_tensor_key(tensor, spec.split_output, where)
            splits.append(SplitRule(key, tensor, spec.split_dim, spec.expected_dims, spec.split_output))
    return _checked(CpPlan(splits=tuple(splits), gathers=tuple(gathers)), name)


def _checked(plan: CpPlan, name: str) -> CpPlan:
    if not plan.splits and plan.forward is None:
        raise PlanError(f"plan {name}: the `cp` section splits nothing; name the inputs to cut along the sequence.")
    gathering = plan.forward is not None and plan.forward.name in GATHERING_FORWARDS
    if not plan.gathers and not plan.grid and not any(rule.gather for rule in plan.keep) and not gathering:
        raise PlanError(
            f"plan {name}: the `cp` section gathers nothing, so the output would stay split; add a `gather` entry."
        )
    pads = [rule.pad for rule in plan.splits if rule.pad is not None]
    spanning = any(rule.pad is not None and rule.tail is not None for rule in plan.splits)
    if plan.forward is not None and plan.forward.pad is not None:
        pads, spanning = pads + [plan.forward.pad], True
    # at most two padded sequences per forward (`PadState`: one `first`, one `last` among the keys); a sequence's
    # tensors (Lumina2's tokens, their mask and RoPE) each carry its rule, so one `attention` per slot. The two slots
    # may name different attentions (Kandinsky 6's video and audio streams, `runtime/cp/pad_view.py`), unless one
    # rule fills both (a `tail` split, a forward's pad)
    per_slot = [{pad.attention for pad in pads if pad.at == at} for at in PAD_AT]
    if any(len(lists) > 1 for lists in per_slot) or (spanning and len({pad.attention for pad in pads}) > 1):
        raise PlanError(
            f"plan {name}: the padded cp splits (`pad`) of one slot (`at`: first / last) must name the same "
            f"`attention` (and every one of them, with a `tail` split's or a forward's pad, which fill both)."
        )
    seen = set()
    for rule in plan.splits:
        ident = (rule.key, rule.name, rule.output, rule.element)
        if ident in seen:
            raise PlanError(f"plan {name}: cp split of '{rule.name}' at '{rule.key}' is listed twice.")
        seen.add(ident)
    return plan


def _check_key(key, name: str) -> None:
    if not isinstance(key, str):
        raise PlanError(f"plan {name}: cp key {key!r} must be a module path string ('' for the model).")
    if key.count("*") > 1 or ("*" in key and "*" not in key.split(".")):
        raise PlanError(f"plan {name}: cp key '{key}': at most one `*`, as a whole path atom.")


def _check_tensor_key(tensor, output: bool, where: str) -> None:
    if not (isinstance(tensor, str) or is_int(tensor)):
        raise PlanError(f"{where}: the tensor key must be a parameter name or an output index.")
    if isinstance(tensor, int) != output:
        raise PlanError(
            f"{where}: an input is named by its forward() parameter; an output element (`output: true`) by "
            f"its integer index (0 for a module returning one tensor)."
        )


def _int(value, where: str, field: str) -> int:
    if not is_int(value):
        raise PlanError(f"{where}: `{field}` must be an integer, got {value!r}.")
    return value


def _opt_int(value, where: str, field: str = "expected_dims") -> int | None:
    return None if value is None else check_degree(value, f"{where}: `{field}`")
