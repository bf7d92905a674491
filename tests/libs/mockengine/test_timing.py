"""The step-time formula, the time scale, the zero profile and the profile files."""

from __future__ import annotations

import json

import pytest

from libs.mockengine.profiles import PROFILES_DIR, load_profile, profile_from_dict
from libs.mockengine.timing import FORMULA, BatchShape, StepCoefficients, StepTimeModel
from tests.libs.mockengine.helpers import add, simulator

COEFFICIENTS = StepCoefficients(
    base_s=0.010,
    per_seq_s=0.001,
    per_prefill_token_s=0.0001,
    per_context_token_s=0.00001,
    per_prefill_attention_s=1e-7,
)


def test_the_batch_shape_separates_decode_and_prefill_chunks() -> None:
    # (chunk_start, chunk_len, is_decode): two decodes at context 100 and 50, a prompt chunk
    # of 20 tokens starting at 40.
    shape = BatchShape.of([(100, 1, True), (50, 1, True), (40, 20, False)])
    assert shape == BatchShape(
        num_seqs=3, prefill_tokens=20, context_tokens_attended=150, prefill_attention_pairs=20 * 50
    )


def test_the_formula() -> None:
    model = StepTimeModel(COEFFICIENTS)
    shape = BatchShape(
        num_seqs=3, prefill_tokens=20, context_tokens_attended=150, prefill_attention_pairs=1000
    )
    expected = 0.010 + 0.003 + 0.002 + 0.0015 + 0.0001
    assert model.seconds(shape) == pytest.approx(expected)
    assert model.seconds(BatchShape()) == 0.0  # an empty step costs nothing


def test_the_time_scale_multiplies_every_duration() -> None:
    shape = BatchShape(num_seqs=2, prefill_tokens=10)
    slow = StepTimeModel(COEFFICIENTS, time_scale=10.0)
    assert slow.seconds(shape) == pytest.approx(10 * StepTimeModel(COEFFICIENTS).seconds(shape))
    assert slow.scaled(0.5) == 5.0


def test_the_zero_profile_costs_nothing() -> None:
    profile = load_profile("zero")
    model = StepTimeModel(profile.coefficients, time_scale=100.0)
    assert model.is_zero
    assert model.seconds(BatchShape(num_seqs=256, prefill_tokens=2048, context_tokens_attended=10**6)) == 0.0


def test_a_simulated_step_reports_its_shape() -> None:
    sim = simulator(max_num_batched_tokens=64)
    add(sim, "long", range(1, 41), max_tokens=3)
    first = sim.step()
    assert first.shape == BatchShape(1, 40, 0, 40 * 20)
    second = sim.step()  # one decode reading 40 tokens of context
    assert second.shape == BatchShape(1, 0, 40, 0.0)


@pytest.mark.parametrize("path", sorted(PROFILES_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_profile_loads_and_states_its_formula_and_sources(path) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(path.read_text())
    assert data["formula"] == FORMULA
    profile = load_profile(path.stem)
    assert profile.sources and profile.calibration
    assert profile.model.kv_bytes_per_block() > 0


def test_profiles_hold_the_documented_model_facts() -> None:
    smol = load_profile("cpu-smollm2")
    assert smol.calibrated and smol.by_cores.keys() == {1, 2}  # tools/bench/calibrate_mock, 1 and 2 cores
    assert (smol.model.num_layers, smol.model.num_kv_heads, smol.model.head_dim) == (30, 3, 64)
    assert (smol.model.vocab_size, smol.model.max_model_len, smol.model.block_size) == (49152, 8192, 128)
    assert smol.model.kv_bytes_per_token() == 23040  # docs: KV per token in bf16
    h100 = load_profile("h100-llama3-8b")
    assert h100.model.block_size == 16
    assert h100.model.kv_bytes_per_token() == 131072
    assert h100.coefficients.per_prefill_token_s > 0 and h100.coefficients.per_context_token_s > 0


def test_a_profile_with_another_formula_is_refused() -> None:
    data = json.loads((PROFILES_DIR / "zero.json").read_text())
    data["formula"] = "t = 0"
    with pytest.raises(ValueError, match="formula"):
        profile_from_dict(data)


def test_an_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="h100-llama3-8b"):
        load_profile("nope")


def test_coefficients_measured_on_a_number_of_cores_are_picked_by_the_engines_cores() -> None:
    data = json.loads((PROFILES_DIR / "zero.json").read_text())
    data["coefficients_by_cores"] = {"1": {"base_s": 0.02}, "2": {"base_s": 0.01}}
    profile = profile_from_dict(data)
    assert profile.coefficients_for(None) == profile.coefficients  # not said: the default set
    assert profile.coefficients_for(1).base_s == 0.02
    assert profile.coefficients_for(2).base_s == profile.coefficients_for(16).base_s == 0.01
    assert profile.coefficients_for(0) == profile.coefficients  # fewer cores than any measured


def test_a_served_models_tokenizer_replaces_the_profiles_vocabulary_and_eos() -> None:
    from libs.mockengine.config import CoreConfig, resolve

    resolved = resolve(CoreConfig(profile="h100-llama3-8b", vocab_size=49152, eos_token_id=2))
    assert (resolved.profile.model.vocab_size, resolved.profile.model.eos_token_id) == (49152, 2)
    own = resolve(CoreConfig(profile="h100-llama3-8b")).profile.model
    assert own.vocab_size > 49152  # Llama 3's own, when no tokenizer is named
