"""The proxy between fake vLLM prefill/decode servers, all on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.tools.vllm_disagg_proxy.fakes import MODEL, FakeVllm, serve, serve_fake, unused_url
from tools.vllm_disagg_proxy.app import ProxyConfig, create_app
from tools.vllm_disagg_proxy.flow import PREFILL_KV_TRANSFER_PARAMS
from tools.vllm_disagg_proxy.main import parse_args


@contextlib.contextmanager
def proxy(prefill: list[str], decode: list[str]) -> Iterator[str]:
    with serve(create_app(ProxyConfig(tuple(prefill), tuple(decode), timeout_s=30))) as url:
        yield url


@contextlib.contextmanager
def stack(
    prefill: FakeVllm | None = None, decode: FakeVllm | None = None
) -> Iterator[tuple[FakeVllm, FakeVllm, str]]:
    p = prefill or FakeVllm("p")
    d = decode or FakeVllm("d")
    with serve_fake(p), serve_fake(d), proxy([p.url], [d.url]) as url:
        yield p, d, url


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **extra}


def test_decode_receives_the_prefills_kv_transfer_params() -> None:
    with stack() as (p, d, url):
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 7, "temperature": 0, "ignore_eos": True}
        response = httpx.post(f"{url}/v1/completions", json=body, headers={"Authorization": "Bearer k"})
        assert response.status_code == 200, response.text
        # The prefill: one token, no stream, asked to keep the KV for a remote decode.
        assert len(p.bodies) == 1
        sent = p.bodies[0]
        assert sent["max_tokens"] == 1 and sent["stream"] is False
        assert sent["kv_transfer_params"] == PREFILL_KV_TRANSFER_PARAMS
        assert {k: sent[k] for k in ("model", "prompt", "temperature", "ignore_eos")} == {
            k: body[k] for k in ("model", "prompt", "temperature", "ignore_eos")
        }
        # The decode: the client's request unchanged plus exactly what the prefill returned.
        assert d.bodies == [{**body, "kv_transfer_params": p.kv_params(0)}]
        assert response.json()["choices"][0]["text"] == "".join(d.pieces(body))
        # Both sides see the same request id and the client's credentials.
        assert p.headers[0]["x-request-id"] == d.headers[0]["x-request-id"]
        assert p.headers[0]["authorization"] == d.headers[0]["authorization"] == "Bearer k"
        metrics = httpx.get(f"{url}/metrics").text
        assert "vllm_disagg_proxy_prefill_seconds_count 1.0" in metrics


def test_chat_stream_is_relayed_byte_for_byte() -> None:
    with stack(decode=FakeVllm("d", chunk_delay_s=0.01)) as (p, d, url):
        body = chat_body(
            stream=True, stream_options={"include_usage": True}, min_tokens=5, max_completion_tokens=5
        )
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            relayed = response.read()
        params = p.kv_params(0)
        with httpx.stream(
            "POST", f"{d.url}/v1/chat/completions", json={**body, "kv_transfer_params": params}
        ) as direct:
            expected = direct.read()
        assert relayed == expected
        assert relayed.endswith(b"data: [DONE]\n\n") and relayed.count(b"data: ") == 6
        sent = p.bodies[0]
        assert sent["max_tokens"] == 1 and sent["max_completion_tokens"] == 1 and sent["stream"] is False
        # Stream options and min_tokens cannot hold for a one-token, non-streamed prefill.
        assert "stream_options" not in sent and "min_tokens" not in sent
        assert d.bodies[0] == {**body, "kv_transfer_params": params}


def test_prefill_error_is_an_openai_error_and_decode_is_not_called() -> None:
    with stack(prefill=FakeVllm("p", http_status=400)) as (_p, d, url):
        response = httpx.post(f"{url}/v1/chat/completions", json=chat_body())
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["message"] == "prefill server: p refused"
        assert error["type"] == "BadRequestError" and error["code"] == 400
        assert d.bodies == []


def test_decode_error_is_an_openai_error() -> None:
    with stack(decode=FakeVllm("d", http_status=503, error_body=b"<html>overloaded</html>")) as (p, _d, url):
        response = httpx.post(f"{url}/v1/chat/completions", json=chat_body(stream=True))
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["type"] == "server_error" and error["code"] == 503
        assert error["message"] == "decode server answered HTTP 503: <html>overloaded</html>"
        assert len(p.bodies) == 1


def test_unreachable_servers_are_bad_gateway_errors() -> None:
    with serve_fake(FakeVllm("d")) as d, proxy([unused_url()], [d.url]) as url:
        response = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert response.status_code == 502
        assert response.json()["error"]["message"].startswith("prefill server http://127.0.0.1:")
        assert d.bodies == []
    with serve_fake(FakeVllm("p")) as p, proxy([p.url], [unused_url()]) as url:
        response = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert response.status_code == 502
        assert "decode server" in response.json()["error"]["message"]


def test_prefill_without_kv_connector_is_reported() -> None:
    with stack(prefill=FakeVllm("p", omit_kv_params=True)) as (_p, d, url):
        response = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert response.status_code == 502
        assert "returned no kv_transfer_params" in response.json()["error"]["message"]
        assert d.bodies == []


def test_decode_failing_mid_stream_ends_the_stream_with_an_error_event() -> None:
    with stack(decode=FakeVllm("d", fail_after_chunks=2)) as (_p, _d, url):
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}
        ) as r:
            assert r.status_code == 200
            events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
        assert [json.loads(e)["choices"][0]["text"] for e in events[:2]] == [" d0", " d1"]
        assert "failed mid-stream" in json.loads(events[2])["error"]["message"]
        assert events[3:] == ["[DONE]"]


def test_requests_go_round_robin_over_prefill_and_decode_servers() -> None:
    fakes = [FakeVllm(name) for name in ("p1", "p2", "d1", "d2")]
    with contextlib.ExitStack() as servers:
        for fake in fakes:
            servers.enter_context(serve_fake(fake))
        p1, p2, d1, d2 = fakes
        with proxy([p1.url, p2.url], [d1.url, d2.url]) as url:
            for _ in range(4):
                assert (
                    httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "x"}).status_code
                    == 200
                )
    assert [len(f.bodies) for f in fakes] == [2, 2, 2, 2]
    # Each decode got the params of the prefill that served the same request.
    assert d1.bodies[0]["kv_transfer_params"] == p1.kv_params(0)
    assert d2.bodies[0]["kv_transfer_params"] == p2.kv_params(0)


def test_health_needs_every_server_and_models_come_from_a_decode() -> None:
    with stack() as (p, d, url):
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == MODEL
        with proxy([p.url, unused_url()], [d.url]) as partial:
            answer = httpx.get(f"{partial}/health")
            assert answer.status_code == 503
            assert sorted(answer.json()["servers"].values()) == [False, True, True]


def test_bad_request_bodies_are_refused_without_calling_servers() -> None:
    with stack() as (p, _d, url):
        response = httpx.post(
            f"{url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
        assert httpx.post(f"{url}/v1/completions", json=[1, 2]).status_code == 400
        assert p.bodies == []


def test_command_line() -> None:
    config, args = parse_args(
        [
            "--port",
            "8100",
            "--prefill",
            "http://a:1,http://b:2",
            "--prefill",
            "http://c:3",
            "--decode",
            "http://d:4/v1",
        ]
    )
    assert config.prefill_urls == ("http://a:1", "http://b:2", "http://c:3")
    assert config.decode_urls == ("http://d:4/v1",) and args.port == 8100
    with pytest.raises(SystemExit):
        parse_args(["--prefill", "a:1", "--decode", "http://d:4"])
