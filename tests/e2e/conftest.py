"""Fixtures shared by the end-to-end suites: the real default model, the prompt set, and the
stacks that the suites of one target share."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from libs.models.tiny_lora import write_adapter
from libs.tokenization.tokenizer import Tokenizer, TokenizerConfig
from tests.e2e.harness import Service, log_dir
from tests.e2e.prompts import build_prompts, question, shared_prefix
from tests.e2e.reference_commands import REFERENCE_PD_COMMAND
from tests.e2e.reference_vllm import ReferenceRun
from tests.e2e.stack import (
    StackSpec,
    default_model_dir,
    keep_stack_logs,
    start_gateway_stack,
    start_gateway_stacks,
    stop_gateway_stack,
)

# Ours (ChatML with Hermes-style tools): runfiles hold it at this path under the workspace.
HERMES_TEMPLATE = "tests/e2e/chat_templates/hermes_tools.jinja"
# The flags of the stacks that test_vllm_extensions and test_structured_output share.
API_MAX_MODEL_LEN = "2048"
API_STACK_FLAGS = (
    "--max-model-len", API_MAX_MODEL_LEN,
    # xgrammar's JSON grammar allows any whitespace between tokens, and SmolLM2 can fill
    # max_tokens with it: request 27 of the 50 (seed 27) ends `{"field_27": "{" \n \n ...`
    # (finish_reason length) in every 1p1d run so far, with and without this engine-wide
    # disable_any_whitespace, which xgrammar itself honours offline (it refuses that text).
    # Open: why the decode engine's grammar still allows the whitespace.
    "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
    # `tool_choice: auto` through vLLM's hermes parser, with a template that renders tools
    # (SmolLM2's own renders none).
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    "--chat-template", os.path.abspath(HERMES_TEMPLATE),
)  # fmt: skip


# The test LoRA adapter's name on the stacks that serve it (test_lora, test_gateway_failures).
LORA_NAME = "smol-lora"


def lora_flags(adapter_dir: Path) -> tuple[str, ...]:
    """vLLM's LoRA flags serving the test adapter (rank 8) under LORA_NAME."""
    return ("--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"{LORA_NAME}={adapter_dir}")


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return default_model_dir()


@pytest.fixture(scope="session")
def lora_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test LoRA adapter (libs/models/tiny_lora.py), written once per test process."""
    return write_adapter(tmp_path_factory.mktemp("lora") / "smol-lora", default_model_dir())


# test_lora's prompts: two of ~400 tokens (several KV blocks each); its reference tokens
# max_tokens long.
LORA_MAX_TOKENS = 12


def lora_prompts() -> list[list[int]]:
    tokenizer = Tokenizer.from_config(TokenizerConfig(path=default_model_dir()))
    question_ids = question(tokenizer, "Which topic comes up most?")
    return [shared_prefix(tokenizer, seed=20 + i, tokens=400) + question_ids for i in range(2)]


@pytest.fixture(scope="session")
def lora_reference_run(lora_adapter: Path) -> Iterator[ReferenceRun]:
    """vLLM's offline greedy tokens for lora_prompts(), from the base model and under the
    adapter: started before the API stacks (which wait for it), so that it loads beside them."""
    run = ReferenceRun(
        log_dir(), "lora", default_model_dir(), lora_prompts(), LORA_MAX_TOKENS, "float32",
        API_MAX_MODEL_LEN, str(lora_adapter),
    )  # fmt: skip
    try:
        yield run
    finally:
        run.stop()


@pytest.fixture(scope="module")
def prompts(model_dir: Path) -> list[tuple[str, list[int]]]:
    return build_prompts(Tokenizer.from_config(TokenizerConfig(path=model_dir)))


@pytest.fixture(scope="session")
def api_stacks(
    tmp_path_factory: pytest.TempPathFactory, lora_adapter: Path, lora_reference_run: ReferenceRun
) -> Iterator[dict[str, tuple[Service, str]]]:
    """A 1p1d and a pd stack with API_STACK_FLAGS and the test LoRA adapter, started at once,
    by mode: each gateway and its base URL. The suites of //tests/e2e:test_vllm_api share them
    (two 1p1d starts less); nothing they check depends on another suite's requests."""
    modes = ("1p1d", "pd")
    # The same suites through other gateway flags, e.g. several API processes:
    # ./bazel test //tests/e2e:test_vllm_api --test_env=CLEAVE_E2E_GATEWAY_FLAGS="--api-server-count 2"
    flags = (
        *API_STACK_FLAGS,
        *lora_flags(lora_adapter),
        *shlex.split(os.environ.get("CLEAVE_E2E_GATEWAY_FLAGS", "")),
    )
    specs = (StackSpec(mode, tmp_path_factory.mktemp(f"api-{mode}"), flags) for mode in modes)
    started = start_gateway_stacks(*specs)
    try:
        yield dict(zip(modes, started, strict=True))
    finally:
        for service, _ in started:
            stop_gateway_stack(service)


# The colocated stack of //tests/e2e:test_edge_and_lifecycle: short contexts keep fuzzed prompts
# cheap; a dead worker is restarted after half a second.
EDGE_MAX_MODEL_LEN = 512
EDGE_STACK_FLAGS = ("--max-model-len", str(EDGE_MAX_MODEL_LEN), "--restart-backoff-s", "0.5")


@pytest.fixture(scope="session")
def edge_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str]]:
    """One pd stack in the users' default dtype (bf16) for test_fuzz_http and then
    test_lifecycle, in that order (the target's srcs): the lifecycle suite ends the stack with
    SIGKILL of its gateway, after which only the stragglers check is left to do."""
    service, base_url = start_gateway_stack(
        "pd", tmp_path_factory.mktemp("edge"), *EDGE_STACK_FLAGS, dtype="auto"
    )
    try:
        yield service, base_url
    finally:
        if service.process.poll() is None:
            stop_gateway_stack(service)
        else:
            service.running.stop(timeout_s=60)  # whatever is left of its tree
            keep_stack_logs(service)


@pytest.fixture(scope="session")
def reference_pd_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str, Path]]:
    """The 1p1d stack of qaic_disagg's prefill/decode command (its gateway, base URL and log
    folder), for test_reference_commands and then test_speculative (its run without
    speculation), in that order (the target's srcs). test_speculative stops it when done, to
    free the cores for its own stacks."""
    cache = tmp_path_factory.mktemp("reference-pd")
    service, base_url = start_gateway_stack("1p1d", cache, *REFERENCE_PD_COMMAND)
    try:
        yield service, base_url, cache / "logs"
    finally:
        if service.process.poll() is None:
            stop_gateway_stack(service)
