"""Shard-on-load with each quantization scheme on an accelerator: `dtp.from_pretrained(..., quantization_config=)`
against diffusers' own one-process quantized load, bf16, on every visible device (tp = their count).

float8 dynamic activation (`fp8`, per row; `fp8t`, per tensor) runs only where torchao runs it (CUDA capability
>= 8.9): there it checks torchao's real float8 matmul on dtp's rowwise path (`dtp/quant/dynamic.py`); elsewhere
the row says how dtp refused it. Prints a table and writes benchmarks/results/quant_fp8_device.md.

    python benchmarks/quant_fp8_device.py --device cuda      # or --device cpu (gloo, 1 process: weight-only)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "quant_fp8_device.md")
MODELS = {"flux": "FluxTransformer2DModel", "qwenimage": "QwenImageTransformer2DModel"}
SCHEMES = ("int8wo", "fp8wo", "fp8", "fp8t")


def scheme_config(scheme: str):
    """dtp's config for a scheme; fp8t: float8 dynamic activation with torchao's default (per-tensor) scales."""
    from dtp.quant import config_for

    if scheme == "fp8t":
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig

        return Float8DynamicActivationFloat8WeightConfig()
    return config_for(scheme)


@torch.no_grad()
def compare(rank: int, world_size: int, device_type: str, folder: str) -> list[dict]:
    import warnings

    warnings.filterwarnings("ignore")
    from diffusers import TorchAoConfig

    import dtp
    from dtp.families.tiny import output_tensor, tiny_inputs, tiny_model

    device = torch.device(device_type, rank) if device_type != "cpu" else torch.device("cpu")
    mesh = dtp.make_mesh(tp=world_size, device_type=device_type)
    rows = []
    for name, cls_name in MODELS.items():
        path = os.path.join(folder, name)
        if rank == 0 and not os.path.exists(path):
            tiny_model(cls_name).save_pretrained(path)
        torch.distributed.barrier()
        cls = type(tiny_model(cls_name))
        inputs = {
            k: v.to(device, torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() else _to(v, device)
            for k, v in tiny_inputs(cls_name).items()
        }
        plain = output_tensor(cls.from_pretrained(path, torch_dtype=torch.bfloat16).to(device)(**inputs))
        for scheme in SCHEMES:
            row = dict(model=name, scheme=scheme, tp=world_size, device=str(device))
            try:
                config = scheme_config(scheme)
                model = dtp.from_pretrained(
                    cls, path, mesh, quantization_config=config, torch_dtype=torch.bfloat16, device=device
                )
                out = output_tensor(model(**inputs))
                ref_model = cls.from_pretrained(
                    path, quantization_config=TorchAoConfig(config), torch_dtype=torch.bfloat16
                )
                ref = output_tensor(ref_model.to(device)(**inputs))
                row |= dict(
                    relative=float((out - ref).abs().max() / ref.abs().max()),
                    own=float((ref - plain).abs().max() / plain.abs().max()),
                )
            except Exception as error:  # a refusal (PlanError) or a failure: the row says which
                row["error"] = f"{type(error).__name__}: {str(error)[:160]}"
            rows.append(row)
    return rows


def _to(value, device):
    return value.to(device) if torch.is_tensor(value) else value


def main() -> None:
    from dtp.analysis.launch import spawn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    world = torch.cuda.device_count() if args.device == "cuda" else 1
    with tempfile.TemporaryDirectory() as folder:
        rows = spawn(compare, world, args.device, folder, timeout_s=900)[0]
    lines = [
        "| model | scheme | tp | device | max abs diff / max abs, dtp vs diffusers (same config) | scheme's own error "
        "| refused / failed |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rel = f"{r['relative']:.2e}" if "relative" in r else ""
        own = f"{r['own']:.2e}" if "own" in r else ""
        lines.append(
            f"| {r['model']} | {r['scheme']} | {r['tp']} | {r['device']} | {rel} | {own} | {r.get('error', '')} |"
        )
    text = "\n".join(lines)
    print(text)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        f.write(f"# Quantized shard-on-load on {name}\n\nCommand: `python {' '.join(sys.argv)}`\n\n{text}\n")


if __name__ == "__main__":
    main()
