"""The gateway's own endpoints about itself: /health (liveness), /ready, /version, /v1/models.

None of them calls another service: the workers' state is the pool's (its polls and health
watches), the tokenizer's its health watch (libs/gateway/fleet/health_watch.py). A probe
then costs the gateway a few microseconds however loaded the other services are."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from libs.config.roles import Role
from libs.gateway.fleet.facts import ModelFacts
from libs.gateway.fleet.pool import Endpoint


def models(facts: ModelFacts, adapters: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The model, then its LoRA adapters (libs/gateway/api/adapters.py), as vLLM lists them."""
    return {
        "object": "list",
        "data": [
            {
                "id": facts.model,
                "object": "model",
                "created": 0,
                "owned_by": "cleave",
                # vLLM's root is the model as `vllm serve` was given it; the gateway knows the
                # name it serves (the same unless --served-model-name renames it).
                "root": facts.model,
                "parent": None,
                "max_model_len": facts.max_model_len,
            },
            *adapters,
        ],
    }


def version(endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    """vLLM's /version: the engine's vLLM version, as the workers report it ("vllm 0.x.y cpu");
    clients written for vLLM's server use it to tell which parameters they may send."""
    for endpoint in endpoints:
        engine = endpoint.info.engine_version.split() if endpoint.info is not None else []
        if len(engine) >= 2 and engine[0] == "vllm":
            return {"version": engine[1]}
    return {"version": "unknown"}


def not_ready_reason(endpoints: Sequence[Endpoint], tokenizer: dict[str, Any]) -> str | None:
    """Why a request cannot be served now, or None. The serving room's own choice: with a healthy
    decode worker it prefills on a prefill worker; with none, a colocated worker does both."""
    if not tokenizer["reachable"]:
        return f"the tokenizer service does not answer ({tokenizer.get('error', 'unknown')})"
    healthy = {e.role for e in endpoints if e.healthy}
    if Role.DECODE in healthy:
        return None if Role.PREFILL in healthy else "no healthy prefill worker for the decode workers"
    return None if Role.BOTH in healthy else "no healthy decode or colocated worker"


def health(
    endpoints: Sequence[Endpoint], tokenizer: dict[str, Any], *, addresses: bool = True
) -> tuple[dict[str, Any], int]:
    """The /health body (liveness: 200 while the gateway answers): every service's state,
    with status "ok" when a request can be served now, else "degraded" (see /ready).

    Each worker by role, health and load; its address only with `addresses` (a caller the API
    keys let in): addresses map the private network behind the gateway, and vLLM's /health
    tells nothing at all."""
    workers = [
        {
            **({"address": e.address} if addresses else {}),
            "role": str(e.role),
            "healthy": e.healthy,
            "serving": e.serving,
            "running": e.stats.num_running,
            "kv_cache_usage": round(e.stats.kv_cache_usage, 4),
        }
        for e in endpoints
    ]
    status = "degraded" if not_ready_reason(endpoints, tokenizer) else "ok"
    return {"status": status, "tokenizer": tokenizer, "workers": workers}, 200


def ready(
    endpoints: Sequence[Endpoint], tokenizer: dict[str, Any], facts: ModelFacts | None = None
) -> tuple[dict[str, Any], int]:
    """The /ready body: 200 when the tokenizer answers and every role a request needs has a
    healthy worker, else 503 with the reason; with what one engine step takes once the
    workers said (for clients and autoscalers that size batches to it)."""
    reason = not_ready_reason(endpoints, tokenizer)
    capacity = {}
    if facts is not None and facts.max_num_batched_tokens is not None:
        capacity["max_num_batched_tokens"] = facts.max_num_batched_tokens
    if reason is None:
        return {"ready": True, **capacity}, 200
    return {"ready": False, "reason": reason, **capacity}, 503
