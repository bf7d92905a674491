"""The gateway's own endpoints: /v1/models, /ready and /health (liveness)."""

from __future__ import annotations

from typing import Any

import pytest

from cleave.worker.v1 import worker_pb2
from libs.config.roles import Role
from libs.gateway.api import health as health_api
from libs.gateway.fleet.facts import ModelFacts
from libs.gateway.fleet.pool import Endpoint


def test_models_lists_the_served_model_with_its_context_then_its_adapters() -> None:
    base = {
        "id": "smol",
        "object": "model",
        "created": 0,
        "owned_by": "cleave",
        "root": "smol",
        "parent": None,
    }
    assert health_api.models(ModelFacts("smol", 2048))["data"] == [{**base, "max_model_len": 2048}]
    adapter = {"id": "sql", "parent": "smol"}
    assert health_api.models(ModelFacts("smol", 2048), [adapter])["data"] == [
        {**base, "max_model_len": 2048},
        adapter,
    ]


def endpoint(role: str, healthy: bool) -> Endpoint:
    unused: Any = None
    stats = worker_pb2.WorkerStats(num_running=3, kv_cache_usage=0.123456)
    return Endpoint(f"{role}:1", Role(role), channel=unused, stub=unused, healthy=healthy, stats=stats)


UP = {"reachable": True}


@pytest.mark.parametrize(
    ("endpoints", "tokenizer", "reason"),
    [
        ([endpoint("prefill", True), endpoint("decode", True)], UP, None),
        ([endpoint("both", True)], UP, None),
        ([endpoint("prefill", True), endpoint("decode", False), endpoint("both", True)], UP, None),
        # The pipeline prefills on a prefill worker whenever a decode worker is healthy.
        ([endpoint("decode", True), endpoint("both", True)], UP, "no healthy prefill worker"),
        ([endpoint("prefill", True), endpoint("decode", False)], UP, "no healthy decode or colocated worker"),
        ([], UP, "no healthy decode or colocated worker"),
        ([endpoint("both", True)], {"reachable": False, "error": "UNAVAILABLE"}, "tokenizer"),
    ],
)
def test_ready_only_while_every_role_a_request_needs_is_served(
    endpoints: list[Endpoint], tokenizer: dict[str, Any], reason: str | None
) -> None:
    body, code = health_api.ready(endpoints, tokenizer)
    health, health_code = health_api.health(endpoints, tokenizer)
    assert health_code == 200  # liveness: the gateway itself answers
    if reason is None:
        assert (code, body, health["status"]) == (200, {"ready": True}, "ok")
    else:
        assert (code, body["ready"], health["status"]) == (503, False, "degraded")
        assert reason in body["reason"]
    assert len(health["workers"]) == len(endpoints) and health["tokenizer"] == tokenizer


def test_health_describes_each_worker() -> None:
    body, _ = health_api.health([endpoint("decode", False)], UP)
    assert body["workers"] == [
        {
            "address": "decode:1",
            "role": "decode",
            "healthy": False,
            "serving": True,
            "running": 3,
            "kv_cache_usage": 0.1235,
        }
    ]


def test_health_without_addresses_keeps_each_workers_role_health_and_load() -> None:
    body, status = health_api.health([endpoint("decode", False)], UP, addresses=False)
    assert status == 200
    assert body["workers"] == [
        {"role": "decode", "healthy": False, "serving": True, "running": 3, "kv_cache_usage": 0.1235}
    ]


def test_a_worker_that_says_not_serving_is_not_healthy_and_not_ready() -> None:
    draining = endpoint("both", True)
    assert draining.set_serving(False) and not draining.set_serving(False)
    body, _ = health_api.health([draining], UP)
    assert body["workers"][0]["healthy"] is False and body["workers"][0]["serving"] is False
    assert health_api.ready([draining], UP)[1] == 503
    assert draining.set_serving(True) and health_api.ready([draining], UP)[1] == 200


def test_ready_reports_what_one_engine_step_takes_once_the_workers_said() -> None:
    known = ModelFacts("smol", 2048, max_num_batched_tokens=512)
    body, code = health_api.ready([endpoint("both", True)], UP, known)
    assert (code, body) == (200, {"ready": True, "max_num_batched_tokens": 512})
    body, code = health_api.ready([], UP, known)
    assert code == 503 and body["max_num_batched_tokens"] == 512
    assert health_api.ready([endpoint("both", True)], UP, ModelFacts("smol", 2048))[0] == {"ready": True}
