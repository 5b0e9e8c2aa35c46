"""Plan fuzzing: bundled plans mutated at random, each either refused by `prepare` or exact against one process.

A mutant is a bundled plan with 1-3 of these edits, as a new user makes them: a rule's style changed,
a rule dropped, a rule added on another Linear, an attention glob dropped, packed blocks changed;
and `pad` on or off. Its `cp` section is the bundled one, and a plan that has one runs at (tp=2, cp=2)
as well as (tp=4, cp=1) (`meshes`). Inputs are batch 2, and a model that takes a key mask gets one with
the second sample's last 3 text tokens masked. Each mutant is judged in two steps, so that the many
refused ones stay cheap:

    1. `check_prepare`: `prepare` on rank 0 of a fake process group (one process): refused (PlanError,
       the model untouched), accepted, or crashed (any other exception: a bug);
    2. `parity_worker`: the accepted ones, on a gloo group of tp x cp processes: the sharded forward of
       the tiny model against the same model whole: exact (max |out - ref| <= 1e-5 max |ref|),
       different, or crashed.

The promise is that step 2 never says "different" or "crashed". `overrefusal_worker` runs refused mutants
with the exactness checks (`check_exact`, `check_unpadded`) switched off: one that then runs exactly was
refused needlessly (over-refused; a cost, not a wrong answer). Used by the property test
(`tests/distributed/test_plan_fuzz.py`) and `benchmarks/plan_fuzz.py`.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..engine import prepare
from ..errors import PlanError
from ..parallelize import parallelize
from ..plan import Plan, Rule, load_plan
from ..resolve.binding.heads import HEAD_ATTRS, WIDTH_ATTRS
from ..resolve.binding.text_attention import REWRITTEN_ATTRS
from ..runtime.mesh import make_mesh
from .tiny import PLAN_CLASSES, output_tensor, tiny_inputs, tiny_model
from .tiny_text import hidden_states, tiny_text_inputs, tiny_text_model

TOL = 1e-5  # exact mutants measure 0..1e-6 (fp32 summation order)
MASKED = 3  # text tokens masked at the end of the second sample
TEXT_PLANS = {"t5": "T5EncoderModel", "clip": "CLIPTextModel", "llama": "LlamaModel"}
# The six architectures of the property test: FLUX.1, FLUX.2, Qwen-Image, Wan, LTX-Video, a text encoder.
CORE = ("flux", "flux2", "qwenimage", "wan", "ltx_video", "t5")
LINEAR_STYLES = ("colwise", "rowwise", "colwise_gathered", "packed_colwise", "packed_rowwise")
BLOCK_CHOICES = ((1, 1), (1, 3), (1, 1, 1), (3, 1), (1, 4))
# "gather" (a rule made colwise_gathered) and "unshard" (every rule under one parent dropped, e.g. a whole MLP)
# are edits a user makes to shard less; most other edits are refused, so these keep the parity step fed.
MUTATIONS = ("style", "drop", "add", "attention", "blocks", "gather", "unshard")


def architectures() -> dict[str, str]:
    """Plan name -> class name: every bundled DiT plan with a tiny config, and three text-encoder plans."""
    return {**PLAN_CLASSES, **TEXT_PLANS}


def make_model(plan_name: str) -> nn.Module:
    class_name = architectures()[plan_name]
    return tiny_text_model(class_name) if plan_name in TEXT_PLANS else tiny_model(class_name)


def make_inputs(plan_name: str) -> dict:
    """Batch 2; every [B, S] key mask the model takes (text encoders' attention_mask, Qwen-Image's
    encoder_hidden_states_mask, LTX-Video's encoder_attention_mask) masks the second sample's last tokens."""
    if plan_name in TEXT_PLANS:
        return tiny_text_inputs()  # 2 prompts, the second right-padded by 3
    inputs = tiny_inputs(architectures()[plan_name], batch=2)
    for name, value in inputs.items():
        if name.endswith("mask") and value.ndim == 2:
            value[1, -MASKED:] = 0
    return inputs


def meshes(plan_name: str) -> tuple[tuple[int, int], ...]:
    """The (tp, cp) meshes of 4 ranks a mutant of `plan_name` runs on: (2, 2) too when its plan has a cp section."""
    cp = load_plan(plan_name).cp
    return ((2, 2), (4, 1)) if cp is not None and cp.refused is None else ((4, 1),)


def outputs(plan_name: str, model: nn.Module, inputs: dict) -> list[torch.Tensor]:
    with torch.no_grad():
        if plan_name in TEXT_PLANS:
            return [t.float() for t in hidden_states(model, inputs)]
        return [output_tensor(model(**inputs))]


@dataclass(frozen=True)
class Mutant:
    """A bundled plan with edits: `rules` key -> rule value (as in a YAML plan), `attention` globs, options."""

    arch: str
    rules: tuple[tuple[str, object], ...]
    attention: tuple[str, ...] | None
    models: tuple[str, ...]
    tp: int
    pad: bool
    edits: tuple[str, ...] = field(default=())
    cp: int = 1

    def plan(self) -> Plan:
        """The edited `tp` rules and attention globs, with the bundled plan's `cp` section unchanged."""
        data = {"tp": dict(self.rules), "models": list(self.models)}
        if self.attention is not None:
            data["attention"] = list(self.attention)
        return replace(Plan.from_dict(data, name=f"{self.arch} (fuzzed)"), cp=load_plan(self.arch).cp)

    def __str__(self) -> str:
        return f"{self.arch} tp={self.tp} cp={self.cp} pad={self.pad}: " + "; ".join(self.edits)


def rule_value(rule: Rule) -> object:
    """A rule as its YAML value (the plan's cp section is carried whole by `Mutant.plan`)."""
    value = {"style": rule.style.value}
    if rule.blocks is not None:
        value["blocks"] = list(rule.blocks)
    if rule.optional:
        value["optional"] = True
    if rule.dim is not None:
        value["dim"] = rule.dim
    return value if len(value) > 1 else rule.style.value


def linear_keys(model: nn.Module) -> list[str]:
    """A key for every nn.Linear of `model`: its path with the first ModuleList index written `*`."""
    keys = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear):
            keys[_glob(model, path)] = None
    return list(keys)


def _glob(model: nn.Module, path: str) -> str:
    atoms, module = path.split("."), model
    for i, atom in enumerate(atoms):
        if isinstance(module, nn.ModuleList):
            return ".".join(atoms[:i] + ["*"] + atoms[i + 1 :])
        module = module._modules[atom]
    return path


def mutate(
    arch: str, rng: random.Random, tp: int, pad: bool, linears: list[str], cp: int = 1, kinds: tuple[str, ...] = ()
) -> Mutant:
    """The bundled plan of `arch` with 1-3 random edits (see the module docstring), or exactly the edits `kinds`."""
    plan = load_plan(arch)
    rules = {rule.key: rule_value(rule) for rule in plan.rules}
    attention = list(plan.attention) if plan.attention is not None else None
    edits = []
    for kind in kinds or [rng.choice(MUTATIONS) for _ in range(rng.randint(1, 3))]:
        edits.append(_edit(kind, rules, attention, rng, linears))
    return Mutant(
        arch,
        tuple(rules.items()),
        tuple(attention) if attention is not None else None,
        tuple(plan.models),
        tp,
        pad,
        tuple(edits),
        cp,
    )


def edited(arch: str, changes: dict, tp: int, pad: bool = False) -> Mutant:
    """`arch`'s bundled plan with `changes` (key -> rule value, or None to drop it): a hand-made mutant."""
    plan = load_plan(arch)
    rules = {rule.key: rule_value(rule) for rule in plan.rules}
    for key, value in changes.items():
        rules.pop(key) if value is None else rules.__setitem__(key, value)
    attention = tuple(plan.attention) if plan.attention is not None else None
    edits = tuple(
        f"{'drop' if v is None else 'set'} {k}" + (f": {v}" if v is not None else "") for k, v in changes.items()
    )
    return Mutant(arch, tuple(rules.items()), attention, tuple(plan.models), tp, pad, edits)


def _edit(kind: str, rules: dict, attention: list | None, rng: random.Random, linears: list[str]) -> str:
    if kind == "drop" and rules:
        key = rng.choice(sorted(rules))
        del rules[key]
        return f"drop {key}"
    if kind == "gather":
        key = rng.choice(sorted(rules))
        rules[key] = "colwise_gathered"
        return f"gather {key}"
    if kind == "unshard":
        parent = rng.choice(sorted(rules)).rsplit(".", 1)[0]
        for key in [k for k in rules if k.startswith(parent + ".")]:
            del rules[key]
        return f"unshard {parent}"
    if kind == "attention" and attention:
        glob = attention.pop(rng.randrange(len(attention)))
        return f"drop attention {glob}"
    if kind == "add":
        free = [key for key in linears if key not in rules]
        if free:
            key = rng.choice(free)
            rules[key] = _random_style(rng)
            return f"add {key}: {rules[key]}"
    if kind == "blocks":
        packed = [k for k, v in rules.items() if isinstance(v, dict) and v["style"].startswith("packed")]
        key = rng.choice(packed or sorted(rules))
        value = rules[key] if isinstance(rules[key], dict) else {"style": rules[key]}
        style = value["style"] if value["style"].startswith("packed") else "packed_colwise"
        rules[key] = {**value, "style": style, "blocks": list(rng.choice(BLOCK_CHOICES))}
        return f"blocks {key}: {rules[key]}"
    key = rng.choice(sorted(rules))
    value = _random_style(rng)
    rules[key] = {**rules[key], **value} if isinstance(rules[key], dict) and isinstance(value, dict) else value
    return f"style {key}: {rules[key]}"


def _random_style(rng: random.Random) -> object:
    style = rng.choice(LINEAR_STYLES)
    if style.startswith("packed"):
        return {"style": style, "blocks": list(rng.choice(BLOCK_CHOICES))}
    return style


def mutants(arch: str, count: int, seed: int, tps=(2,), pads=(False, True), cp: int = 1) -> list[Mutant]:
    """`count` mutants of `arch`'s plan, drawn from `seed` and `tps` (tp and pad cycled): another tp, other edits."""
    rng = random.Random(f"{arch}:{seed}:{','.join(map(str, tps))}:{cp}")
    linears = linear_keys(make_model(arch))
    return [mutate(arch, rng, tps[i % len(tps)], pads[(i // len(tps)) % len(pads)], linears, cp) for i in range(count)]


def snapshot(model: nn.Module) -> tuple:
    """What `prepare` must leave as it was: every tensor's value, the module tree, every head count and width."""
    tensors = {key: value.detach().clone() for key, value in model.state_dict().items()}
    attrs = {
        (name, attr): getattr(module, attr)
        for name, module in model.named_modules()
        for attr in HEAD_ATTRS + WIDTH_ATTRS + REWRITTEN_ATTRS
        if isinstance(getattr(module, attr, None), int)
    }
    return tensors, attrs, [(name, type(module).__name__) for name, module in model.named_modules()]


def unchanged(model: nn.Module, before: tuple) -> bool:
    tensors, attrs, structure = snapshot(model)
    same_values = tensors.keys() == before[0].keys() and all(
        type(tensors[k]) is type(v) and torch.equal(tensors[k], v) for k, v in before[0].items()
    )
    return same_values and attrs == before[1] and structure == before[2]


def check_prepare(mutant: Mutant, model: nn.Module, mesh) -> tuple[str, str]:
    """("refused" | "accepted" | "crashed", detail): `prepare` of the mutant on `mesh` (a fake group of tp ranks)."""
    try:
        prepare(model, mesh, mutant.plan(), pad=mutant.pad)
    except PlanError as error:
        return "refused", str(error)
    except Exception as error:  # anything but a PlanError is a bug the fuzzer is here to find
        return "crashed", f"prepare: {type(error).__name__}: {error}"
    return "accepted", ""


def compare(arch: str, mutant: Mutant, mesh) -> tuple[str, str]:
    """("exact" | "different" | "crashed" | "refused", detail) of one sharded forward against the whole model."""
    inputs = make_inputs(arch)
    ref = outputs(arch, make_model(arch), inputs)
    try:
        sharded = parallelize(make_model(arch), mesh, mutant.plan(), pad=mutant.pad)
        out = outputs(arch, sharded, inputs)
    except PlanError as error:  # accepted by the fake group, refused here: still no harm done
        return "refused", str(error)
    except Exception as error:
        return "crashed", f"forward: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
    if [o.shape for o in out] != [r.shape for r in ref]:
        return "different", f"shapes {[tuple(o.shape) for o in out]} != {[tuple(r.shape) for r in ref]}"
    rel = max(float((o - r).abs().max()) / max(float(r.abs().max()), 1e-30) for o, r in zip(out, ref))
    return ("exact", f"{rel:.1e}") if rel <= TOL else ("different", f"max |out - ref| / max |ref| = {rel:.2e}")


def parity_worker(rank: int, world: int, batch: list[Mutant]) -> list[tuple[str, str]]:
    """Run in every rank of a gloo group of `world` = tp x cp processes (one (tp, cp) for the whole batch):
    `compare` each mutant (rank 0's verdicts)."""
    torch.set_num_threads(1)
    meshes = {(m.tp, m.cp) for m in batch}
    assert len(meshes) == 1 and batch[0].tp * batch[0].cp == world, (meshes, world)
    mesh = make_mesh(tp=batch[0].tp, cp=batch[0].cp, device_type="cpu")
    return [compare(mutant.arch, mutant, mesh) for mutant in batch]


EXACTNESS_CHECKS = ("check_exact", "check_unpadded")  # the engine's steps that refuse a plan for giving wrong numbers


@contextmanager
def exactness_checks_off():
    """The engine's exactness checks replaced by no-ops for the duration (the over-refusal measure only)."""
    from .. import engine

    real = {name: getattr(engine, name) for name in EXACTNESS_CHECKS}
    for name in EXACTNESS_CHECKS:
        setattr(engine, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for name, check in real.items():
            setattr(engine, name, check)


def overrefusal_worker(rank: int, world: int, batch: list[Mutant]) -> list[tuple[str, str]]:
    """`parity_worker` with the engine's exactness checks switched off: for refused mutants, "exact" here means
    the refusal was not needed (over-refused)."""
    with exactness_checks_off():
        return parity_worker(rank, world, batch)
