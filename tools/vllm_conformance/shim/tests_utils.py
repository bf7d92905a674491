"""Stands in for vLLM's `tests/utils.py` when vLLM's OpenAI tests run against Cleave.

`RemoteOpenAIServer` keeps the interface vLLM's tests use (a context manager with `url_for`,
`get_client`, `get_async_client`, `host`, `port`) but starts a Cleave local stack, the
gateway started as `bazel run //services/gateway` would, serving the runner's model under the
test's model name (or, for the runner's `--server vllm` control run, vLLM's own server with
the same model). Copied by tools/vllm_conformance/main.py into the run's folder as
`tests/utils.py`; not imported anywhere else.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai

from tools.local_gateway import local_gateway
from tools.vllm_conformance.serve_args import translate
from tools.vllm_conformance.vllm_control import vllm_server

# What tests import besides the server (ROCm-only settings: none here).
ROCM_ENV_OVERRIDES: dict[str, str] = {}
ROCM_EXTRA_ARGS: list[str] = []

STARTUP_TIMEOUT_S = 900.0


def _runner_flags() -> list[str]:
    # Set by the runner: the model folder, the mode and any extra gateway flags (JSON list).
    import json

    return [
        "--model",
        os.environ["CLEAVE_CONFORMANCE_MODEL"],
        "--mode",
        os.environ.get("CLEAVE_CONFORMANCE_MODE", "pd"),
        *json.loads(os.environ.get("CLEAVE_CONFORMANCE_GATEWAY_ARGS", "[]")),
    ]


@contextlib.contextmanager
def _environment(extra: Mapping[str, str] | None) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in extra or {}}
    os.environ.update(extra or {})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class RemoteOpenAIServer:
    DUMMY_API_KEY = "token-abc123"  # vLLM's tests' key; servers started without --api-key ignore it

    def __init__(
        self,
        model: str,
        vllm_serve_args: list[str],
        *,
        env_dict: dict[str, str] | None = None,
        seed: int | None = 0,
        auto_port: bool = True,
        max_wait_seconds: float | None = None,
        override_hf_configs: dict[str, Any] | None = None,
    ) -> None:
        self._stack = contextlib.ExitStack()
        if os.environ.get("CLEAVE_CONFORMANCE_SERVER") == "vllm":
            # The control run (tools/vllm_conformance/vllm_control.py): vLLM itself.
            print(f"[control] vllm serve {model} {' '.join(vllm_serve_args)}", file=sys.stderr)
            url = self._stack.enter_context(vllm_server(
                os.environ["CLEAVE_CONFORMANCE_MODEL"], model, vllm_serve_args, env_dict or {},
                Path(os.environ["CLEAVE_CONFORMANCE_LOG_DIR"]), max_wait_seconds or STARTUP_TIMEOUT_S,
            ))  # fmt: skip
        else:
            translation = translate(vllm_serve_args, env_dict)
            flags = [*_runner_flags(), "--served-model-name", model, *translation.flags]
            print(f"[cleave] vllm serve {model} {' '.join(vllm_serve_args)}", file=sys.stderr)
            print(f"[cleave] -> gateway {' '.join(flags)}", file=sys.stderr)
            if translation.ignored:
                print(f"[cleave] not honoured: {translation.ignored}", file=sys.stderr)
            stack = local_gateway("vllm-conformance", flags, max_wait_seconds or STARTUP_TIMEOUT_S)
            with _environment(env_dict):
                url, _service = self._stack.enter_context(stack)
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = int(parts.port or 80)
        self.uds = None

    def __enter__(self) -> RemoteOpenAIServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        return self.url_root + "/" + "/".join(parts)

    def get_client(self, **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)

    def get_async_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.AsyncOpenAI(
            base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs
        )
