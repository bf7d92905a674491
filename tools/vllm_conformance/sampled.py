"""The temperature-1 requests of vLLM's tests, seeded, against Cleave and against vLLM itself.

    ./bazel run //tools/vllm_conformance:sampled -- [--mode pd] [--seeds 12] [--max-tokens 512]

A few of vLLM's tests send a request with no seed and no temperature (SmolLM2's generation
config sets none, so it samples at 1) and assert something of the sample: that it reaches EOS
(`finish_reason == "stop"`), that a schema-constrained answer is `{"result": 2}`, or that
a constrained JSON closes before `max_tokens`. Whether
one run passes is chance on either server. This tool measures it instead of arguing it: the
same requests with seeds 0..N-1 (a seed makes vLLM's sampler deterministic) go to a Cleave
local stack and to vLLM's own OpenAI server serving the same model, one server at a time. It
prints, per request, how many seeds gave token-identical outputs on the two servers and how
many met the test's criterion on each. `--max-tokens` bounds each sample (the tests set none,
so a sample that misses EOS runs to the end of the context); "stop" within the bound is a
lower bound on the test's pass rate. Last, each server's decode rate on the batched chat
endpoint with two conversations, against test_batched_chat_completions' 60 s timeout.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from libs.config.groups import DEFAULT_CACHE_DIR
from libs.models.resolve import resolve_model
from tools.local_gateway import local_gateway
from tools.vllm_conformance.vllm_control import vllm_server

SERVED = "sampled"
MAX_MODEL_LEN = "4080"  # test_chat_echo's and test_root_path's servers
SAYING = "Here is a common saying about apple. An apple a day, keeps"
SCHEMA = {"type": "object", "properties": {"result": {"type": "integer"}}}


def _reaches_eos(body: dict[str, Any]) -> bool:
    return bool(body["choices"][0]["finish_reason"] == "stop")


def _is_result_2(body: dict[str, Any]) -> bool:
    with contextlib.suppress(json.JSONDecodeError):
        return bool(json.loads(body["choices"][0]["message"]["content"]) == {"result": 2})
    return False


CONTINUE = "continue_final_message (test_chat_echo, test_root_path): finish stop"
# tests/entrypoints/conftest.py's sample_json_schema, which test_structured_outputs_json_chat
# puts into its prompt (as Python's repr of the dict) and constrains the answer to.
EMPLOYEE_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 3},
        "work_history": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "company": {"type": "string"},
                    "duration": {"type": "number"},
                    "position": {"type": "string"},
                },
                "required": ["company", "position"],
            },
        },
    },
    "required": ["name", "age", "skills", "work_history"],
}


def _json_closes(body: dict[str, Any]) -> bool:
    with contextlib.suppress(json.JSONDecodeError):
        json.loads(body["choices"][0]["message"]["content"])
        return bool(body["choices"][0]["finish_reason"] == "stop")
    return False


# name -> (the test's request body, the test's criterion)
REQUESTS: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], bool]]] = {
    CONTINUE: (
        {
            "messages": [
                {"role": "user", "content": "tell me a common saying"},
                {"role": "assistant", "content": SAYING},
            ],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
        _reaches_eos,
    ),
    'test_response_format_json_schema: answer {"result": 2}': (
        {
            "messages": [{"role": "user", "content": 'what is 1+1? The format is "result": 2'}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "foo_test", "schema": SCHEMA}},
        },
        _is_result_2,
    ),
    "test_structured_outputs_json_chat's first answer: the JSON closes": (
        {
            "messages": [
                {"role": "system", "content": "you are a helpful assistant"},
                {
                    "role": "user",
                    "content": "Give an example JSON for an employee profile that fits this schema: "
                    f"{EMPLOYEE_SCHEMA}",
                },
            ],
            "structured_outputs": {"json": EMPLOYEE_SCHEMA},
        },
        _json_closes,
    ),
    "test_batched_chat_completions' first conversation: finish stop": (
        {"messages": [{"role": "user", "content": "Reply with exactly the word: alpha"}]},
        _reaches_eos,
    ),
}
# test_batched_chat_completions sets no max_tokens and a 60 s client timeout: a sample that
# misses EOS has to decode to the end of its server's context (2,048) within that minute.
BATCH_TIMEOUT_S, BATCH_CONTEXT = 60, 2048
BATCH = [[{"role": "user", "content": f"Reply with exactly the word: {word}"}] for word in ("alpha", "beta")]


def _sample(url: str, body: dict[str, Any], seed: int, *, max_tokens: int) -> dict[str, Any]:
    request = {**body, "model": SERVED, "seed": seed, "max_tokens": max_tokens, "return_token_ids": True}
    reply = httpx.post(f"{url}/v1/chat/completions", json=request, timeout=1800)
    reply.raise_for_status()
    return dict(reply.json())


def _run(url: str, seeds: int, max_tokens: int) -> dict[str, list[dict[str, Any]]]:
    """Every request with every seed, the seeds of one request concurrently."""
    results = {}
    with ThreadPoolExecutor(max_workers=seeds) as pool:
        for name, (body, _criterion) in REQUESTS.items():
            results[name] = list(
                pool.map(functools.partial(_sample, url, body, max_tokens=max_tokens), range(seeds))
            )
    return results


def _fresh_unseeded(url: str) -> list[dict[str, Any]]:
    """test_chat_echo's module as it runs: its first two generations on a fresh server are the
    continue request (echo on, then off), unseeded and with no max_tokens, one after the
    other. With no seed a sample is fixed by its place in the engine's random stream, so these
    show whether both servers draw the same samples at the same places."""
    body, _criterion = REQUESTS[CONTINUE]
    samples = []
    for echo in (True, False):
        request = {**body, "model": SERVED, "echo": echo, "return_token_ids": True}
        reply = httpx.post(f"{url}/v1/chat/completions", json=request, timeout=1800)
        reply.raise_for_status()
        samples.append(dict(reply.json()))
    return samples


def _batch_decode_rate(url: str, max_tokens: int) -> float:
    """Completion tokens per second per conversation of the batched endpoint, both
    conversations decoding to `max_tokens` (EOS ignored)."""
    body = {"model": SERVED, "messages": BATCH, "max_tokens": max_tokens, "ignore_eos": True, "seed": 0}
    started = time.monotonic()
    reply = httpx.post(f"{url}/v1/chat/completions/batch", json=body, timeout=1800)
    reply.raise_for_status()
    return float(reply.json()["usage"]["completion_tokens"] / len(BATCH) / (time.monotonic() - started))


@contextlib.contextmanager
def _cleave(model: str, mode: str, dtype: str) -> Iterator[str]:
    flags = [
        "--dtype",
        dtype,
        "--model",
        model,
        "--mode",
        mode,
        "--served-model-name",
        SERVED,
        "--max-model-len",
        MAX_MODEL_LEN,
    ]
    with local_gateway("sampled", flags, 900) as (url, _service):
        yield url


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", default="pd", help="the Cleave stack's topology")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument(
        "--dtype",
        default="float16",
        help="both servers' dtype (test_chat_echo's and test_root_path's: float16)",
    )
    args = parser.parse_args(argv)
    model = str(resolve_model(args.model, DEFAULT_CACHE_DIR / "models", progress=False).path)
    servers = {
        f"cleave {args.mode}": lambda: _cleave(model, args.mode, args.dtype),
        "vllm": lambda: vllm_server(
            model,
            SERVED,
            # test_chat_echo's own serve arguments
            ["--max-model-len", MAX_MODEL_LEN, "--dtype", args.dtype, "--enforce-eager"],
            {},
            Path(tempfile.mkdtemp(prefix="sampled-")),
            900,
        ),
    }
    outputs, fresh = {}, {}
    for label, server in servers.items():
        with server() as url:
            print(f"sampled: {label} at {url}", flush=True)
            fresh[label] = _fresh_unseeded(url)
            outputs[label] = _run(url, args.seeds, args.max_tokens)
            rate = _batch_decode_rate(url, args.max_tokens)
            print(f"sampled: {label}: the batched endpoint decodes {rate:.1f} tokens/s per conversation "
                  f"(2 conversations): {BATCH_CONTEXT} tokens take {BATCH_CONTEXT / rate:.0f} s, "
                  f"the test's timeout is {BATCH_TIMEOUT_S} s", flush=True)  # fmt: skip
    for index, pair in enumerate(zip(*fresh.values(), strict=True)):
        same = pair[0]["choices"][0]["token_ids"] == pair[1]["choices"][0]["token_ids"]
        print(f"fresh server, unseeded generation {index + 1} (test_chat_echo's case {index}): "
              f"token-identical {same}", flush=True)  # fmt: skip
        for label, body in zip(fresh, pair, strict=True):
            choice = body["choices"][0]
            print(f"  {label}: finish {choice['finish_reason']}, {len(choice['token_ids'])} tokens "
                  f"{choice['token_ids'][:16]}", flush=True)  # fmt: skip
    cleave, vllm = outputs.values()
    for name, (_body, criterion) in REQUESTS.items():
        pairs = list(zip(cleave[name], vllm[name], strict=True))
        same_prompt = sum(a.get("prompt_token_ids") == b.get("prompt_token_ids") for a, b in pairs)
        same = sum(a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"] for a, b in pairs)
        passed = {label: sum(criterion(body) for body in runs[name]) for label, runs in outputs.items()}
        rates = ", ".join(f"{label} {count}/{args.seeds}" for label, count in passed.items())
        print(f"{name}: prompts identical {same_prompt}/{args.seeds}, outputs token-identical "
              f"{same}/{args.seeds}; criterion met: {rates}", flush=True)  # fmt: skip
        for a, b in pairs[:2]:
            for label, body in (("cleave", a), ("vllm", b)):
                choice = body["choices"][0]
                print(f"  {label}: prompt {body.get('prompt_token_ids')} output {choice['token_ids'][:24]}"
                      f" {choice['message']['content'][:80]!r}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
