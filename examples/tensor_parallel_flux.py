"""FLUX with its transformer split across GPUs by dtp, launched with torchrun.

    torchrun --nproc-per-node 4 examples/tensor_parallel_flux.py            # FLUX.2-dev on 4 GPUs

The same flow as diffusers' TensorParallelConfig example, written with dtp: load the pipeline on
the CPU, shard the transformer with its bundled plan on the mesh's "tp" axis (each rank keeps one
slice of every planned weight), then move the sharded transformer and the whole text encoder and
VAE to this rank's accelerator. A fixed CPU generator gives every rank the same starting latents;
rank 0 saves the image. On a CPU-only machine it runs with gloo, e.g. on the demo's checkpoint:

    torchrun --nproc-per-node 2 examples/tensor_parallel_flux.py \
        --model ~/.cache/dtp/tiny-flux-pipeline-v3 --steps 4 --height 64 --width 64
"""

import argparse
import os

import torch
from diffusers import DiffusionPipeline
from torch import distributed as dist

import dtp


def setup_distributed() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return device


def main(args) -> None:
    device = setup_distributed()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    mesh = dtp.make_mesh(tp=dist.get_world_size(), device_type=device.type)

    pipeline = DiffusionPipeline.from_pretrained(args.model, torch_dtype=dtype)  # weights stay on CPU
    if dist.get_rank() == 0:
        print(f"tp degrees this transformer supports: {dtp.tp_candidates(pipeline.transformer)}")
    # Shard the transformer first (plan: dtp.plan_for(transformer), e.g. plans/flux2.yaml), then move
    # only each rank's slice onto the accelerator. Raises dtp.PlanError, changing nothing, when the
    # world size does not divide the heads or a packed block.
    dtp.parallelize(pipeline.transformer, mesh)
    pipeline.transformer.to(device)
    # The remaining, non-sharded components move whole.
    pipeline.text_encoder.to(device)
    if getattr(pipeline, "text_encoder_2", None) is not None:  # FLUX.1 has a second (T5) encoder
        pipeline.text_encoder_2.to(device)
    pipeline.vae.to(device)
    pipeline.set_progress_bar_config(disable=dist.get_rank() != 0)

    generator = torch.Generator().manual_seed(args.seed)
    options = {k: v for k, v in dict(num_inference_steps=args.steps, height=args.height, width=args.width).items() if v}
    image = pipeline(prompt=args.prompt, generator=generator, **options).images[0]
    if dist.get_rank() == 0:
        image.save(args.output)
    dist.barrier()  # tear down together, not while rank 0 still writes the image
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="black-forest-labs/FLUX.2-dev", help="hub id or local pipeline directory")
    parser.add_argument("--prompt", default="a cat holding a sign that says hello")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output", default="output.png")
    main(parser.parse_args())
