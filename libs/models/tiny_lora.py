"""A LoRA adapter for a Llama-shaped model, written for tests (the e2e suites, the vLLM
conformance runner's LoRA fixtures): PEFT's on-disk format
(adapter_config.json, adapter_model.safetensors), rank 8 on every layer's q_proj and v_proj,
fixed non-zero weights from a seeded generator. vLLM loads it as it loads one from peft's
save_pretrained; v_proj changes the KV itself, so KV computed under the adapter is wrong for
the base model and the other way round."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

RANK = 8
ALPHA = 16
# Large enough that greedy output leaves the base model's within a few tokens, small enough
# that it stays text.
WEIGHT_STD = 0.08


def write_adapter(folder: Path, model_dir: Path, seed: int = 0) -> Path:
    config = json.loads((model_dir / "config.json").read_text())
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    shapes = {
        "q_proj": (hidden, config["num_attention_heads"] * head_dim),
        "v_proj": (hidden, config["num_key_value_heads"] * head_dim),
    }
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (fan_in, fan_out) in shapes.items():
            name = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(RANK, fan_in, generator=generator) * WEIGHT_STD
            tensors[f"{name}.lora_B.weight"] = torch.randn(fan_out, RANK, generator=generator) * WEIGHT_STD
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": sorted(shapes),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return folder
