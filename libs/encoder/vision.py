"""The vision tower and projector of a Hugging Face vision-language model: pixels in, image
embeddings (in the language model's embedding space) out.

The model's own processor preprocesses (resize, normalize, tiles) and the model's own
`get_image_features` runs the tower and projector, so the embeddings are the ones the
language model expects for its image placeholder positions; the workers take them through
vLLM's `enable_mm_embeds` and never run a vision tower.

Why not vLLM's encoder-cache connectors (ECExampleConnector: an encoder vLLM instance saves
its encoder cache to a shared folder, keyed by vLLM's multimodal hash, and the prefill
instance loads it): the encoder instance is a whole vLLM engine of the full model (language
model and KV cache included), the transfer is a shared filesystem, and ECCPUConnector needs
the V2 model runner, which is not enabled on CPU. The encoder contract sends the tensors over
gRPC instead, and vLLM's precomputed-embedding input is the seam on the worker side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import Image

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class VisionTower:
    def __init__(self, model: Any, image_processor: Any, hidden_size: int, dtype: torch.dtype) -> None:
        self._model = model
        self._image_processor = image_processor
        self.hidden_size = hidden_size
        self.dtype = dtype

    @classmethod
    def load(cls, path: Path, dtype: str) -> VisionTower:
        """`dtype` must be the workers' (auto = the model's own): embeddings are the language
        model's inputs, so they are made in the precision it runs in."""
        from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

        config = AutoConfig.from_pretrained(path, local_files_only=True)
        torch_dtype = DTYPES.get(dtype) or _config_dtype(config)
        processor = AutoProcessor.from_pretrained(path, local_files_only=True)
        image_processor = getattr(processor, "image_processor", None)
        if image_processor is None:
            raise ValueError(f"{path} has no image processor: not a vision-language model")
        # The whole model is loaded, the language model included (transformers has no
        # vision-only loader across architectures); only get_image_features ever runs.
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch_dtype, local_files_only=True)
        model.eval()
        text_config = config.get_text_config()
        return cls(model, image_processor, int(text_config.hidden_size), torch_dtype)

    def encode(self, image: Image.Image) -> torch.Tensor:
        """[num_image_tokens, hidden_size] for one image (all its tiles, in order)."""
        inputs = self._image_processor(images=[image], return_tensors="pt")
        kwargs = {
            key: value.to(self.dtype) if key == "pixel_values" else value
            for key, value in inputs.items()
            if key in ("pixel_values", "pixel_attention_mask", "image_sizes", "image_grid_thw")
        }
        with torch.inference_mode():
            features = self._model.model.get_image_features(**kwargs)
        # transformers 5 returns a model output (pooler_output = the projected features);
        # older releases a tensor or a tuple of per-image tensors.
        if hasattr(features, "pooler_output") and features.pooler_output is not None:
            features = features.pooler_output
        if isinstance(features, (list, tuple)):
            features = torch.cat([f.reshape(-1, f.shape[-1]) for f in features])
        return features.reshape(-1, features.shape[-1]).contiguous()


def _config_dtype(config: Any) -> torch.dtype:
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    return DTYPES.get(str(dtype), torch.bfloat16)
