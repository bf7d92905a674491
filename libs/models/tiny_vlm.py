"""A tiny random-weight vision-language model (Idefics3: SigLIP-style vision tower, pixel-
shuffle projector, Llama text model) with SmolLM2's real tokenizer: the multimodal test fixture.

Generated at test time, never committed (like tiny.py's Llama). Why Idefics3 and not LLaVA:
vLLM 0.32's llava module imports its pixtral module, which imports transformers' pixtral
image processor, which needs torchvision, and PyPI's torchvision is CUDA-linked (it breaks on
CPU, so the lock leaves it out). vLLM's idefics3 module and transformers' PIL image processor
(Idefics3ImageProcessorPil) need no torchvision. SmolVLM (the same architecture) was the
other candidate; its processor requires a video processor, which needs torchvision too.

Image splitting is off, so every image is resized to one 128x128 tile and becomes exactly
IMAGE_SEQ_LEN embeddings: (128/16)^2 patches, pixel-shuffled by scale_factor 2.
"""

from __future__ import annotations

from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

TINY_VLM_SEED = 0
IMAGE_SIZE = 128
PATCH_SIZE = 16
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
# The tokens Idefics3's processor writes around each image; added to SmolLM2's vocabulary.
IMAGE_TOKENS = ("<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>")

# ChatML as SmolLM2's own template, plus list content: an image part renders as "<image>",
# which the engine's processor expands to the image's embedding positions. Written here (not
# taken from a model repository): the fixture's own template.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_vlm(dest: Path, tokenizer_from: Path) -> Path:
    """Write a tiny deterministic float32 Idefics3 model and its processor into `dest`
    (absent or empty), with the tokenizer of the HF folder `tokenizer_from`; returns `dest`."""
    import torch
    from transformers import (
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )

    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise FileExistsError(f"make_tiny_vlm needs an empty folder, {dest} is not empty")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from, local_files_only=True)
    tokenizer.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    assert isinstance(image_token_id, int)
    config = Idefics3Config(
        vision_config={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
        },
        text_config={
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "head_dim": 32,  # vLLM's CPU attention needs 32 or more
            "num_key_value_heads": 2,
            "max_position_embeddings": 2048,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "tie_word_embeddings": False,
        },
        scale_factor=SCALE_FACTOR,
        pad_token_id=tokenizer.pad_token_id,
        image_token_id=image_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_VLM_SEED)
        model = Idefics3ForConditionalGeneration(config)  # float32, transformers' default
    model.save_pretrained(dest)
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        image_seq_len=IMAGE_SEQ_LEN,
    )
    processor.save_pretrained(dest)
    log.info("models.tiny_vlm_written", dest=str(dest))
    return dest
