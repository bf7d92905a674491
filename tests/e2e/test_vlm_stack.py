"""The NaN-vision copy of tests/e2e/vlm_stack.py can make test_encoder fail: on the tiny VLM,
in Hugging Face transformers on CPU (seconds, no vLLM engine), the copy's vision tower and
connector turn an image into NaN, every logit from the image on is NaN and the greedy
tokens change, while a text-only prompt gives bit-identical logits (the language model is the
same bytes). Were nan_vision_copy to stop poisoning the tower (a renamed weight, a regex that
no longer matches), these tests fail.

What this does not show: that vLLM's own Idefics3 path on the copy answers differently (that
takes two engine starts; vLLM loads the same tensor names from the same files, so it runs the
same NaN weights, and NaN has no way out of a matmul)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from libs.models.tiny_vlm import make_tiny_vlm
from tests.e2e.vlm_stack import VISION, nan_vision_copy
from tests.fixtures.smollm2 import save_smollm2_tokenizer

NEW_TOKENS = 6


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("vlm")
    real = make_tiny_vlm(work / "real", save_smollm2_tokenizer(work / "tokenizer"))
    return real, nan_vision_copy(real, work / "nan")


@pytest.fixture(scope="module")
def models(folders: tuple[Path, Path]) -> tuple[Any, Any, Any]:
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    real, nan = (Idefics3ForConditionalGeneration.from_pretrained(f).eval() for f in folders)
    return AutoProcessor.from_pretrained(folders[0]), real, nan


def inputs(processor: Any, content: list[dict[str, Any]], images: list[Image.Image]) -> Any:
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    return processor(text=prompt, images=[images] if images else None, return_tensors="pt")


def noise(size: int, seed: int) -> Image.Image:
    return Image.frombytes("RGB", (size, size), random.Random(seed).randbytes(size * size * 3))


def greedy(model: Any, batch: Any) -> list[int]:
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, batch["input_ids"].shape[1] :].tolist()


def test_copy_poisons_every_vision_weight_and_nothing_else(models: tuple[Any, Any, Any]) -> None:
    # As loaded (not just as saved): a weight the loader renamed or re-initialised would
    # show here as a finite vision weight.
    _, real, nan = models
    real_params = dict(real.named_parameters())
    vision = 0
    for name, param in nan.named_parameters():
        if VISION.search(name):
            vision += 1
            assert torch.isnan(param).all(), name
        else:
            assert torch.equal(param, real_params[name]), name
    assert vision and vision < len(real_params)


def test_image_prompt_becomes_nan_from_the_image_on(models: tuple[Any, Any, Any]) -> None:
    processor, real, nan = models
    content = [{"type": "text", "text": "Look:"}, {"type": "image"}, {"type": "text", "text": "What is it?"}]
    batch = inputs(processor, content, [noise(64, 1)])
    image_id = real.config.image_token_id
    first_image = int((batch["input_ids"][0] == image_id).nonzero()[0])
    with torch.no_grad():
        real_logits, nan_logits = (m(**batch).logits[0] for m in (real, nan))
    assert torch.isfinite(real_logits).all()
    # Every position from the image on (including the last, whose logits pick the first
    # answer token) is NaN. (Here the text before the image is NaN too: transformers' masked
    # attention multiplies the NaN values of later positions by a zero weight, which is NaN;
    # whether vLLM's attention does so too does not matter to the proof.)
    assert torch.isnan(nan_logits[first_image:]).all()
    assert greedy(real, batch) != greedy(nan, batch)


def test_text_prompt_is_identical(models: tuple[Any, Any, Any]) -> None:
    processor, real, nan = models
    batch = inputs(processor, [{"type": "text", "text": "Tell me a story about a cat."}], [])
    with torch.no_grad():
        real_logits, nan_logits = (m(**batch).logits for m in (real, nan))
    assert torch.isfinite(real_logits).all()
    assert torch.equal(real_logits, nan_logits)
    assert greedy(real, batch) == greedy(nan, batch)
