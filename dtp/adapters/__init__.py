"""LoRA adapters on a dtp-sharded model: diffusers/peft load them, dtp splits them like their bases."""

from .lora import LoraStats, load_lora, load_lora_weights

__all__ = ["LoraStats", "load_lora", "load_lora_weights"]
