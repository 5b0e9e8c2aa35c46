"""LoRA adapters on a dtp-sharded model: diffusers/peft load them, dtp splits them like their bases.

    model = dtp.parallelize(FluxTransformer2DModel.from_pretrained(...), dtp.make_mesh(tp=4))
    dtp.load_lora(model, "my_lora.safetensors", adapter_name="style")        # or a state dict / folder
    dtp.load_lora(model, other_state_dict, adapter_name="detail")
    model.set_adapters(["style", "detail"], weights=[0.8, 0.5])              # diffusers' own methods from here
    model.fuse_lora(lora_scale=0.7); model.unfuse_lora(); model.disable_lora()

    dtp.load_lora_weights(pipe, "my_lora.safetensors", adapter_name="style")  # pipe.transformer sharded

keys.py reads and checks (PlanError before anything changes), shard.py says how each factor is split
and places it, lora.py runs the two around diffusers' `load_lora_adapter`.
"""

from .lora import LoraStats, load_lora, load_lora_weights

__all__ = ["LoraStats", "load_lora", "load_lora_weights"]
