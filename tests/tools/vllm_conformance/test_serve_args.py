"""vLLM's test servers' `vllm serve` arguments -> the gateway's flags."""

from __future__ import annotations

import json

from tools.vllm_conformance.serve_args import control_args, translate


def test_flags_the_gateway_shares_with_vllm_pass_and_gpu_settings_are_named_as_ignored() -> None:
    out = translate(
        ["--dtype", "bfloat16", "--max-model-len", "2048", "--max-num-seqs", "128", "--enforce-eager",
         "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-logprobs=151936",
         "--gpu-memory-utilization", "0.4", "--enable-lora", "--lora-modules", "a=/x", "b=/y",
         "--max-lora-rank", "64", "--seed", "0"]
    )  # fmt: skip
    assert out.flags == [
        "--dtype", "bfloat16", "--max-model-len", "2048", "--decode-max-num-seqs", "128",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-logprobs", "151936",
        "--enable-lora", "--lora-modules", "a=/x", "b=/y", "--max-lora-rank", "64",
    ]  # fmt: skip
    assert out.ignored == ["--enforce-eager", "--gpu-memory-utilization 0.4", "--seed 0"]


def test_dotted_structured_outputs_keys_become_one_json_config() -> None:
    out = translate(["--structured-outputs-config.backend", "xgrammar", "--enable-force-include-usage"])
    assert out.flags[0] == "--enable-force-include-usage"
    assert out.flags[1] == "--structured-outputs-config"
    assert json.loads(out.flags[2]) == {"backend": "xgrammar"}


def test_the_api_key_from_the_environment_becomes_the_flag() -> None:
    assert translate([], {"VLLM_API_KEY": "k"}).flags == ["--api-key", "k"]
    assert translate(["--api-key", "a"], {"VLLM_API_KEY": "k"}).flags == ["--api-key", "a"]


def test_the_control_run_keeps_the_tests_arguments_but_the_address() -> None:
    kept = control_args(
        ["--dtype", "bfloat16", "--enable-lora", "--lora-modules", "a=/x", "--max-lora-rank=64", "--port",
         "8000", "--host=0.0.0.0", "--reasoning-parser", "qwen3", "--max-cpu-loras", "2", "--enforce-eager"]
    )  # fmt: skip
    assert kept == ["--dtype", "bfloat16", "--enable-lora", "--lora-modules", "a=/x", "--max-lora-rank=64",
                    "--reasoning-parser", "qwen3", "--max-cpu-loras", "2", "--enforce-eager"]  # fmt: skip
