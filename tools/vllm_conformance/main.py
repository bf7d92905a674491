"""vLLM's own tests of /v1/completions and /v1/chat/completions, run against a Cleave gateway.

    ./bazel run //tools/vllm_conformance -- --vllm-tests /path/to/vllm [--mode pd|1p1d]
        [--server cleave|vllm] [--report report.xml] [-- PYTEST ARGS]

`--vllm-tests` is a checkout of vLLM's sources (the version of the lock, or as close as one
can be found); nothing of it is kept in this repository. The runner copies the test files
below into a fresh folder, with a `tests/utils.py` whose `RemoteOpenAIServer` starts a
Cleave local stack instead of `vllm serve` (shim/tests_utils.py, serve_args.py) and a conftest that
points the tokenizers the tests build at the served model (shim/tests_conftest.py), then runs
pytest there. Tests that exercise vLLM's classes in process, or need what Cleave does not
serve (prompt embeddings, a tokenizer-less engine), are left out by name, each
with its reason in LEFT_OUT; tests that fail against vLLM's own server with the same model
are deselected by id (deselected.py), or run marked xfail where they sample without a seed
and deselecting them would change what the module's later tests draw (FAIL_ON_VLLM_TOO).
`--server vllm` runs the same selection against vLLM's own
server with the same model (vllm_control.py): what fails there depends on the model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest_asyncio  # noqa: F401  (the plugin vLLM's tests are written for; fail here if absent)

from libs.config.groups import DEFAULT_CACHE_DIR
from libs.models.resolve import resolve_model
from tools.cli_args import split_gateway_args, user_path
from tools.vllm_conformance.deselected import DESELECTED, FAIL_ON_VLLM_TOO

OPENAI_TESTS = "tests/entrypoints/openai"
# The files of vLLM's tests that talk to a server over HTTP about these two endpoints.
FILES = [
    "completion/test_completion.py",
    "completion/test_prompt_validation.py",
    "chat_completion/test_chat.py",
    "chat_completion/test_chat_completion.py",
    "chat_completion/test_chat_echo.py",
    "chat_completion/test_chat_logit_bias_validation.py",
    "chat_completion/test_completion_with_function_calling.py",
    "chat_completion/test_enable_force_include_usage.py",
    "chat_completion/test_batched_chat_completions.py",
    "chat_completion/test_root_path.py",
    "test_return_token_ids.py",
    "test_return_tokens_as_ids.py",
    # /v1/models and the run-time LoRA endpoints, with adapters for the runner's model.
    "models/test_models.py",
    "../serve/lora/test_lora_adapters.py",
]
# pytest -k expressions -> why they are not run against Cleave.
LEFT_OUT = {
    "kimi_k2": "Kimi-K2's tool-call id format: its parser and model are not loadable here",
    "test_load_prompt_embeds or test_disable_prompt_embeds": (
        "vLLM's prompt-embeds loader in process (no server): Cleave refuses prompt_embeds"
    ),
    "test_chat_completion_request_n_parameter": (
        "vLLM's ChatCompletionRequest in process (VLLM_MAX_N_SEQUENCES monkeypatched), no server"
    ),
    "test_responses_api_logprobs_with_return_tokens_as_token_ids": (
        "vLLM's Responses API serving class in process (imports vllm.entrypoints.openai.engine, absent here)"
    ),
}
# Files left out whole: they test vLLM's serving classes in process, with mocks, no HTTP.
FILES_LEFT_OUT = {
    "completion/test_completion_error.py": "vLLM's OpenAIServingCompletion in process, mocked engine",
    "chat_completion/test_chat_error.py": "vLLM's OpenAIServingChat in process, mocked engine",
    "completion/test_token_in_token_out.py": "--skip-tokenizer-init: Cleave's tokenizer service owns text",
}

# vLLM runs these tests with pytest-asyncio (a function-scoped event loop per test, strict
# mode); so does the runner, with anyio's plugin off so that only one plugin drives them.
PYTEST_INI = """[pytest]
asyncio_mode = strict
asyncio_default_fixture_loop_scope = function
filterwarnings =
    ignore::DeprecationWarning
"""
PLUGINS = ["-p", "no:anyio"]  # pytest-asyncio loads as an installed plugin


class ExpectedFailures:
    """A pytest plugin: the tests of FAIL_ON_VLLM_TOO run, marked xfail with their reason."""

    def __init__(self, reasons: dict[str, str]) -> None:
        self._reasons = reasons

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        import pytest

        for item in items:
            reason = self._reasons.get(item.nodeid)
            if reason is not None:
                item.add_marker(pytest.mark.xfail(reason=f"fails on vLLM too: {reason}", strict=False))


def prepare(vllm_root: Path, work: Path, files: list[str]) -> list[str]:
    """Copies the test files and the shim into `work`; returns the test paths to run."""
    shim = Path(__file__).resolve().parent / "shim"
    tests = work / "tests"
    for folder in (tests, tests / "entrypoints", work / OPENAI_TESTS):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").touch()
    shutil.copy(shim / "tests_utils.py", tests / "utils.py")
    shutil.copy(shim / "tests_conftest.py", tests / "conftest.py")
    (work / "pytest.ini").write_text(PYTEST_INI)
    # vLLM's fixtures the tests share (sample schemas, LoRA paths), from the same checkout.
    shared = vllm_root / "tests" / "entrypoints" / "conftest.py"
    if shared.is_file():
        shutil.copy(shared, tests / "entrypoints" / "conftest.py")
    paths = []
    for name in files:
        source = vllm_root / OPENAI_TESTS / name
        target = (work / OPENAI_TESTS / name).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        for package in target.relative_to(tests.resolve()).parents:  # every folder a package
            (tests / package / "__init__.py").touch()
        shutil.copy(source, target)
        paths.append(str(target.relative_to(work.resolve())))
    return paths


def main(argv: list[str]) -> int:
    own, pytest_args = split_gateway_args(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-tests", type=Path, required=True, help="a checkout of vLLM's sources")
    parser.add_argument("--mode", default="pd", help="the local stack's topology (pd, 1p1d, ...)")
    parser.add_argument("--model", default="smollm2", help="the model every test's server serves")
    parser.add_argument(
        "--server",
        choices=("cleave", "vllm"),
        default="cleave",
        help="cleave: a Cleave local stack; vllm: the control run, vLLM's own server with the same model",
    )
    parser.add_argument("--files", nargs="*", default=FILES, help=f"test files under {OPENAI_TESTS}")
    parser.add_argument("--report", type=Path, help="a JUnit XML report of the run")
    parser.add_argument("--work-dir", type=Path, help="where the run's copy goes (default: a temp folder)")
    parser.add_argument(
        "--with-deselected",
        action="store_true",
        help="also run the tests in deselected.py (they fail against vLLM's own server with this model too)",
    )
    parser.add_argument(
        "--gateway-arg", action="append", default=[], help="an extra gateway flag for every server"
    )
    args = parser.parse_args(own)
    vllm_root = user_path(args.vllm_tests)
    model = resolve_model(args.model, DEFAULT_CACHE_DIR / "models", progress=False).path
    work = user_path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="vllm-conformance-"))
    paths = prepare(vllm_root, work, args.files)
    os.environ["CLEAVE_CONFORMANCE_MODEL"] = str(model)
    os.environ["CLEAVE_CONFORMANCE_MODE"] = args.mode
    os.environ["CLEAVE_CONFORMANCE_SERVER"] = args.server
    os.environ["CLEAVE_CONFORMANCE_LOG_DIR"] = str(work / "logs")
    os.environ["CLEAVE_CONFORMANCE_GATEWAY_ARGS"] = json.dumps(args.gateway_arg)
    target = f"mode {args.mode}" if args.server == "cleave" else "vLLM's own server (control run)"
    print(f"vllm-conformance: {len(paths)} files in {work}, {target}, model {model}", flush=True)
    for name, reason in {**FILES_LEFT_OUT, **LEFT_OUT}.items():
        print(f"  left out: {name}: {reason}", flush=True)
    os.chdir(work)
    sys.path.insert(0, str(work))
    import pytest

    selection = "not (" + " or ".join(f"({expr})" for expr in LEFT_OUT) + ")"
    if "-k" in pytest_args:  # the caller's selection, within what is not left out
        at = pytest_args.index("-k")
        selection = f"({pytest_args[at + 1]}) and {selection}"
        pytest_args = pytest_args[:at] + pytest_args[at + 2 :]
    options = ["-p", "no:cacheprovider", *PLUGINS, "-q", "-rA", f"--rootdir={work}", "-k", selection]
    if not args.with_deselected:
        print(
            f"  deselected: {len(DESELECTED)} tests that fail against vLLM itself (deselected.py)", flush=True
        )
        options += [f"--deselect={test_id}" for test_id in DESELECTED]
    plugins = [] if args.with_deselected else [ExpectedFailures(FAIL_ON_VLLM_TOO)]
    if args.report:
        options.append(f"--junitxml={user_path(args.report)}")
    return int(pytest.main([*options, *pytest_args, *paths], plugins=plugins))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
