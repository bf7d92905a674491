"""Precomputed image embeddings for vLLM's Idefics3 (the tests' tiny vision-language model).

vLLM 0.32's Idefics3 model takes `image_embeds`, but its multimodal processor expands an
image placeholder only for pixel inputs (`get_items("image", ImageProcessorItems)` raises
for `ImageEmbeddingItems`), so `enable_mm_embeds` fails there before the engine sees the
request. This fills that gap as vLLM's own LLaVA and PaliGemma processors do: for an
embedding item the placeholder becomes the untiled image's tokens
(`<fake_token_around_image><global-img>` + n x `<image>` + `<fake_token_around_image>`, what
the pixel path writes for one tile), n = the embedding's length. Tiled images (image
splitting) cannot be laid out from their length alone: their embeddings are refused.
Pixel inputs keep vLLM's own code. Installed in the worker process, where vLLM processes
inputs, before the engine starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def install() -> None:
    from vllm.model_executor.models import idefics3
    from vllm.multimodal.parse import ImageEmbeddingItems
    from vllm.multimodal.processing import PromptReplacement, PromptUpdateDetails

    processor_cls: Any = idefics3.Idefics3MultiModalProcessor
    if getattr(processor_cls, "_cleave_mm_embeds", False):
        return
    original = processor_cls._get_prompt_updates

    def _get_prompt_updates(
        self: Any, mm_items: Any, hf_processor_mm_kwargs: Mapping[str, object], out_mm_kwargs: Any
    ) -> Sequence[Any]:
        images = mm_items.get("image")
        if not isinstance(images, ImageEmbeddingItems):
            return list(original(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs))
        hf_processor = self.info.get_hf_processor(**hf_processor_mm_kwargs)
        image_token_id = hf_processor.image_token_id
        image_token, fake_token, global_token = self.info._get_image_token(hf_processor)
        tokenizer = self.info.get_tokenizer()
        expected = int(hf_processor.image_seq_len)

        def replacement(item_idx: int) -> Any:
            tokens = images.get_feature_size(item_idx)
            if tokens != expected:
                raise ValueError(
                    f"image embeddings of {tokens} tokens; this model's untiled image has {expected} "
                    "(embeddings of tiled images are not supported)"
                )
            text = fake_token + global_token + image_token * tokens + fake_token
            ids = tokenizer.encode(text, add_special_tokens=False)
            return PromptUpdateDetails.select_token_id(ids, image_token_id)

        return [PromptReplacement(modality="image", target=[image_token_id], replacement=replacement)]

    processor_cls._get_prompt_updates = _get_prompt_updates
    processor_cls._cleave_mm_embeds = True
