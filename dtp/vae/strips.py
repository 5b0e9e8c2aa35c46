"""Row strips: which rows of an image-like tensor each rank owns, and which rows a convolution needs.

A parallel VAE splits every activation along its height. The partition is fixed once per call, in
*units* of the coarsest grid (the latent rows): rank r owns `units[r]` latent rows, and at a grid
`f` times finer (f = 2, 4, 8 in the up/down blocks) exactly the `f * units[r]` rows above them. So a
stride-2 convolution never straddles a strip boundary: every boundary is a multiple of every stride
between the latent grid and the image.

Worked example: 13 latent rows on 4 ranks -> units (4, 3, 3, 3), bounds (0, 4, 7, 10, 13); at 8x
(the image) bounds (0, 32, 56, 80, 104).

One exception: CogVideoX's decoder re-cuts its strips evenly at the first upsampled level whose height divides by
the ranks (`even_bounds`, `recut.py`; 13 latent rows on 4 ranks: from the 4x level, 52 rows, 13 each), and every x2
level after stays even.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


def split_rows(total: int, parts: int) -> tuple[int, ...]:
    """`total` rows over `parts` ranks, as even as possible, the first `total % parts` ranks one row more.

    split_rows(13, 4) == (4, 3, 3, 3). Every part is >= 1 only when total >= parts (callers check).
    """
    base, extra = divmod(total, parts)
    return tuple(base + (1 if r < extra else 0) for r in range(parts))


def bounds(counts: tuple[int, ...]) -> tuple[int, ...]:
    """Cumulative row bounds: (4, 3, 3, 3) -> (0, 4, 7, 10, 13); rank r owns rows [b[r], b[r + 1])."""
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return tuple(out)


def scaled_bounds(units: tuple[int, ...], rank: int, local_rows: int) -> tuple[int, ...]:
    """The global row bounds of a tensor whose strip on `rank` has `local_rows` rows.

    The grid's scale is local_rows / units[rank] (the same on every rank by construction), so every
    rank derives every rank's strip without a collective. Raises AssertionError when the scale does
    not give whole rows on every rank: a layer changed the height in a way the partition cannot follow.
    """
    scale = Fraction(local_rows, units[rank])
    rows = [u * scale for u in units]
    assert all(r.denominator == 1 for r in rows), f"rows {rows} of units {units} at scale {scale} are not whole"
    return bounds(tuple(int(r) for r in rows))


def even_bounds(height: int, parts: int) -> tuple[int, ...]:
    """`height` rows dealt evenly: even_bounds(120, 8) == (0, 15, 30, ..., 120). `height` must divide by `parts`."""
    rows, rest = divmod(height, parts)
    assert rest == 0, f"{height} rows do not divide over {parts} ranks"
    return bounds((rows,) * parts)


def on_even_level(height: int, first: int) -> bool:
    """Whether a level of `height` rows is `first` rows times a power of 2 (1, 2, 4, ...): `first`'s level or one
    reached from it by x2 upsamplings, which keep an even partition even."""
    times, rest = divmod(height, first)
    return rest == 0 and times >= 1 and times & (times - 1) == 0


@dataclass(frozen=True)
class ConvRows:
    """What one rank computes for a convolution along the height, and the input rows that takes.

    out: the output rows [out[0], out[1]) this rank owns.
    top, bottom: input rows needed above / below the rank's own input strip (negative: own rows to drop).
    zeros_top, zeros_bottom: of those, rows that lie outside the image (the conv's zero padding).
    """

    out: tuple[int, int]
    top: int
    bottom: int
    zeros_top: int
    zeros_bottom: int


def conv_rows(
    in_bounds: tuple[int, ...], rank: int, *, kernel: int, stride: int, dilation: int, pad_top: int, pad_bottom: int
) -> ConvRows:
    """The rows rank `rank` computes for a convolution along the height, and the halo that needs.

    Output row o reads padded input rows [o * stride, o * stride + dilation * (kernel - 1) + 1), i.e.
    input rows shifted up by pad_top. The output partition is the input partition divided by the
    stride (every bound a multiple of it; see the module docstring). Rank r with input rows [i0, i1)
    and output rows [o0, o1) needs input rows [o0 * s - pad_top, (o1 - 1) * s + d * (k - 1) + 1 - pad_top):
    `top = i0 - first`, `bottom = last - i1`; the rows of that window before 0 or past the input height
    are zero padding. Example: 3x3 conv, padding 1, rank 1 of bounds (0, 4, 8): out (4, 8), top 1, bottom 1,
    no zeros; rank 0: top 1 of which 1 zero row.
    """
    total = in_bounds[-1]
    height_out = (total + pad_top + pad_bottom - dilation * (kernel - 1) - 1) // stride + 1
    assert all(b % stride == 0 for b in in_bounds[:-1]), f"strip bounds {in_bounds} straddle stride {stride}"
    out_bounds = [b // stride for b in in_bounds[:-1]] + [height_out]
    o0, o1 = out_bounds[rank], out_bounds[rank + 1]
    i0, i1 = in_bounds[rank], in_bounds[rank + 1]
    first = o0 * stride - pad_top
    last = (o1 - 1) * stride + dilation * (kernel - 1) + 1 - pad_top
    return ConvRows(
        out=(o0, o1),
        top=i0 - first,
        bottom=last - i1,
        zeros_top=max(0, -first),
        zeros_bottom=max(0, last - total),
    )
