"""Write a tiny but complete Llama GGUF file (quantized weights, byte-level BPE tokenizer,
ChatML template), so conversion can be tested in about a second without the 98 MB SmolLM2."""

from pathlib import Path

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

HIDDEN = 64
INTERMEDIATE = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
CONTEXT = 256

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A few merges, so the tokenizer is a real BPE and not only bytes ("Ġ" is GPT-2's space).
MERGES = ("h e", "l l", "he ll", "Ġ w", "o r")

_CONTROL_TOKEN_TYPE = 3
_NORMAL_TOKEN_TYPE = 1


def _byte_level_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes, in byte order."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    spelled = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in spelled:
            spelled[byte] = chr(256 + extra)
            extra += 1
    return [spelled[byte] for byte in range(256)]


def tiny_vocabulary() -> list[str]:
    merged = ["".join(merge.split(" ")) for merge in MERGES]
    return list(SPECIAL_TOKENS) + _byte_level_alphabet() + merged


def tiny_llama_weights(seed: int = 0) -> dict[str, npt.NDArray[np.float32]]:
    """The model's float32 weights in Hugging Face layout and names: the reference a correct
    conversion must reproduce (up to Q8_0 and bf16 rounding)."""
    rng = np.random.default_rng(seed)

    def matrix(rows: int, columns: int) -> npt.NDArray[np.float32]:
        return (rng.standard_normal((rows, columns)) * 0.05).astype(np.float32)

    def norm() -> npt.NDArray[np.float32]:
        return (1.0 + rng.standard_normal(HIDDEN) * 0.1).astype(np.float32)

    kv_width = KV_HEADS * (HIDDEN // HEADS)
    weights = {"model.embed_tokens.weight": matrix(len(tiny_vocabulary()), HIDDEN)}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        weights[f"{prefix}.input_layernorm.weight"] = norm()
        weights[f"{prefix}.self_attn.q_proj.weight"] = matrix(HIDDEN, HIDDEN)
        weights[f"{prefix}.self_attn.k_proj.weight"] = matrix(kv_width, HIDDEN)
        weights[f"{prefix}.self_attn.v_proj.weight"] = matrix(kv_width, HIDDEN)
        weights[f"{prefix}.self_attn.o_proj.weight"] = matrix(HIDDEN, HIDDEN)
        weights[f"{prefix}.post_attention_layernorm.weight"] = norm()
        weights[f"{prefix}.mlp.gate_proj.weight"] = matrix(INTERMEDIATE, HIDDEN)
        weights[f"{prefix}.mlp.up_proj.weight"] = matrix(INTERMEDIATE, HIDDEN)
        weights[f"{prefix}.mlp.down_proj.weight"] = matrix(HIDDEN, INTERMEDIATE)
    weights["model.norm.weight"] = norm()
    # No lm_head: the output projection is tied to the embedding, as in SmolLM2.
    return weights


_GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    layer, module = hf_name.removeprefix("model.layers.").removesuffix(".weight").split(".", 1)
    return f"blk.{layer}.{_GGUF_NAMES[module]}.weight"


def _llama_cpp_rope_permute(weights: npt.NDArray[np.float32], heads: int) -> npt.NDArray[np.float32]:
    """What llama.cpp's convert_hf_to_gguf does to Llama Q and K rows (interleaved rotary
    halves); a converter back to HF layout has to undo it exactly."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_tiny_llama_gguf(path: Path, seed: int = 0) -> Path:
    """Write the model with `tiny_llama_weights(seed)` to `path`, laid out as llama.cpp would."""
    tokens = tiny_vocabulary()
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("tiny-test-llama")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [_CONTROL_TOKEN_TYPE if token in SPECIAL_TOKENS else _NORMAL_TOKEN_TYPE for token in tokens]
    )
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    for hf_name, weights in tiny_llama_weights(seed).items():
        if ".self_attn.q_proj." in hf_name:
            weights = _llama_cpp_rope_permute(weights, HEADS)
        elif ".self_attn.k_proj." in hf_name:
            weights = _llama_cpp_rope_permute(weights, KV_HEADS)
        if weights.ndim == 1:
            writer.add_tensor(_gguf_name(hf_name), weights)  # norms stay float32, as in SmolLM2
        else:
            # Q8_0, like SmolLM2's embedding: the converter must dequantize, not just copy.
            writer.add_tensor(
                _gguf_name(hf_name),
                quantize(weights, GGMLQuantizationType.Q8_0),
                raw_dtype=GGMLQuantizationType.Q8_0,
            )

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
