"""One value for the parallel setup: the degrees, the mesh built from them, and the options every sharded module shares.

torchtitan's `ParallelDims` is the model: the degrees are validated on construction (`__post_init__`), the mesh
is built from them in one place (or an existing mesh is adopted and its degrees read and checked), and the
submeshes are asked for by name (`tp_mesh`, `cp_mesh`, `fsdp_mesh`) wherever needed. So no signature carries
`mesh, cp_mode, device, pad` loose and no submesh rule is written twice. The public keyword arguments of
`dtp.parallelize`, `dtp.from_pretrained`, ... stay as they are; they are folded into a `Parallelism` at the entry.

    Parallelism(tp=2, cp=2, fsdp=True)      # builds the ("cp", "tp") mesh over the initialized process group
    Parallelism(mesh, cp_mode="ring")       # adopts a dtp.make_mesh mesh; tp, cp, cfg read from it
    Parallelism(tp=1, cp=1, fsdp=True)      # PlanError: FSDP needs a non-tp axis larger than 1

Submesh rules (one home):
- a diffusers model takes the whole ("cp", "tp") mesh: TP on `tp`, its plan's sequence split on `cp`;
- a transformers model (a text encoder) takes the `tp` axis only: it has no `cp` section and runs the
  same on every cp rank and every cfg group (`for_model`); `root` keeps the whole mesh, where FSDP's axes are;
- the `cfg` axis (outermost) pairs the ranks at one (cp, tp) place of each cfg group: a denoiser's guidance
  branches run on different groups (`runtime/cfg`);
- FSDP (`fsdp=True`) shards every weight over the non-tp axes of the whole mesh, flattened into one axis
  named "fsdp" (cfg x cp ranks; `fsdp_mesh`): TP inside, FSDP across, torchtitan's 2-D layout.
A new axis is a degree here plus its submesh rule in `mesh.py`.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, replace
from functools import cached_property

import torch
from torch import nn

from ..errors import PlanError
from ..plan.transformers import is_transformers_model
from ..policy import check_attention_backend, check_cp_mode, check_degree, ulysses_degree
from .fsdp_unit import check_fsdp_option
from .mesh import CP_AXIS, TP_AXIS, cfg_degree, cp_degree, make_mesh, non_tp_submesh, tp_submesh, usp_groups


@dataclass(frozen=True)
class Parallelism:
    """The degrees, the mesh and the options of one sharding; validated on construction (PlanError).

    mesh: the ("cp", "tp") or ("cfg", "cp", "tp") DeviceMesh (or a 1-D "tp" mesh) the model is sharded on;
        None builds it from the degrees (`make_mesh`, over the initialized process group).
    tp, cp, cfg: the degrees; None reads them from an adopted mesh (1 when building one); a degree given with
        a mesh must equal the mesh's.
    fsdp: shard every weight over the non-tp axes of `root` as well (FSDP2, `runtime/fsdp.py`); True for dtp's
        units, or a unit size: blocks per unit (4) or a byte budget per unit ("1GB") (`runtime/fsdp_unit.py`).
    cp_mode: context-parallel attention, "ulysses" or "ring" (used when the `cp` axis is > 1); a USP mesh
        (`make_mesh(cp=C, ulysses=U)`, 1 < U < C) runs Ulysses x ring whatever it says (`ulysses`, `ring`).
    pad: zero-pad heads and widths the TP degree does not divide (exact).
    device: where slices (and then everything else) go; None leaves parameters where they are.
    attention_backend: the attention kernel (`choices.ATTENTION_BACKENDS`; None or "auto": the model's default),
        kept as diffusers' name ("cudnn" -> "_native_cudnn"); checked against `cp_mode` when cp > 1 (ring takes
        the backends whose kernel returns the log-sum-exp: `policy.check_attention_backend`).
    root: the whole mesh (default: `mesh`); a text encoder runs on its `tp` axis (`for_model`) but FSDP shards it
        over the whole mesh's other axes.
    """

    mesh: object = None
    _: KW_ONLY
    tp: int | None = None
    cp: int | None = None
    cfg: int | None = None
    fsdp: bool | int | str = False
    cp_mode: str = "ulysses"
    pad: bool = False
    device: torch.device | None = None
    attention_backend: str | None = None
    root: object = None

    def __post_init__(self):
        for name in ("tp", "cp", "cfg"):
            if getattr(self, name) is not None:
                check_degree(getattr(self, name), name)
        check_cp_mode(self.cp_mode)
        object.__setattr__(self, "fsdp", check_fsdp_option(self.fsdp))  # True, False or a unit size (fsdp_unit.py)
        if self.mesh is None:
            built = make_mesh(tp=self.tp or 1, cp=self.cp or 1, cfg=self.cfg or 1)
            object.__setattr__(self, "mesh", built)
        self._adopt(self.mesh)
        ring = ("ring" if self.ring > 1 else "ulysses") if self.cp > 1 else None  # USP's blocks run ring's kernels
        object.__setattr__(self, "attention_backend", check_attention_backend(self.attention_backend, ring))
        if self.root is None:
            object.__setattr__(self, "root", self.mesh)
        if self.fsdp and self.fsdp_degree == 1:
            names = self.root.mesh_dim_names or ()
            shape = " x ".join(f"{n}={s}" for n, s in zip(names, self.root.shape))
            raise PlanError(
                f"fsdp=True shards weights over the mesh's non-tp axes (cfg x cp), but mesh {shape} has none larger "
                f"than 1; build the mesh with dtp.make_mesh(tp=..., cp=2) or cfg=2, or pass fsdp=False."
            )

    def _adopt(self, mesh) -> None:
        """Read the degrees from `mesh` (PlanError without a `tp` axis); a degree given must match it."""
        found = {"tp": tp_submesh(mesh).size(), "cp": cp_degree(mesh), "cfg": cfg_degree(mesh)}
        for name, size in found.items():
            given = getattr(self, name)
            if given is not None and given != size:
                raise PlanError(
                    f"{name}={given} does not match the mesh's '{name}' axis of size {size}; pass {name}={size} "
                    f"or build the mesh with dtp.make_mesh({name}={given}, ...)."
                )
            object.__setattr__(self, name, size)

    @classmethod
    def build(
        cls,
        mesh,
        *,
        cp_mode: str = "ulysses",
        pad: bool = False,
        device=None,
        fsdp: bool | int | str = False,
        attention_backend: str | None = None,
    ):
        """Adopt `mesh` with these options (the entry points' keyword arguments); PlanError when they are wrong."""
        return cls(mesh, cp_mode=cp_mode, pad=pad, device=device, fsdp=fsdp, attention_backend=attention_backend)

    @cached_property
    def tp_mesh(self):
        """The `tp` axis: every planned module's weights are split over it. Sliced once: `apply` asks for it per
        planned Linear, and each `mesh["tp"]` slice cost ~0.7 ms (FLUX.1-dev: 498 asks, 0.35 s of `dtp check`)."""
        return tp_submesh(self.mesh)

    @property
    def cp_mesh(self):
        """The `cp` axis (only when `cp` > 1)."""
        return self.mesh[CP_AXIS]

    @property
    def ulysses(self) -> int:
        """The Ulysses degree inside `cp`: the USP side mesh's (`make_mesh(cp=C, ulysses=U)`), else `cp_mode`'s
        (cp under "ulysses", 1 under "ring"). Heads must split over it; ring attention runs over cp / ulysses."""
        if self.cp == 1:
            return 1
        usp = usp_groups(self.mesh)
        return usp[1].size() if usp is not None else ulysses_degree(self.cp, self.cp_mode)

    @property
    def ring(self) -> int:
        """The ring degree: cp / ulysses (1 under plain Ulysses, cp under plain ring)."""
        return self.cp // self.ulysses

    @property
    def fsdp_degree(self) -> int:
        """The ranks FSDP shards each weight over: every rank of the whole mesh at this rank's tp place."""
        return self.root.size() // tp_submesh(self.root).size()

    @property
    def fsdp_mesh(self):
        """The whole mesh's non-tp axes (cfg, cp) flattened into one axis named "fsdp" (FSDP2's `mesh`)."""
        return non_tp_submesh(self.root)

    @property
    def axes(self) -> dict[str, int]:
        """{"cfg": ..., "cp": ..., "tp": ...}: the degrees, outermost first."""
        return {"cfg": self.cfg, CP_AXIS: self.cp, TP_AXIS: self.tp}

    def for_model(self, model: nn.Module) -> Parallelism:
        """The setup `model` is sharded with: a text encoder on the `tp` axis only, a diffusers model on all."""
        if not is_transformers_model(model):
            return self
        return replace(self, mesh=tp_submesh(self.mesh), tp=None, cp=None, cfg=None, root=self.root)

    def with_device(self, device) -> Parallelism:
        return replace(self, device=device)


def model_mesh(model: nn.Module, mesh):
    """The mesh a model is sharded on: the whole one for a diffusers model, the `tp` axis for a text encoder."""
    return tp_submesh(mesh) if is_transformers_model(model) else mesh
