"""The pure parts of tests/deploy/compose_live_checks.py (the live checks themselves need a
container engine and a stack: CI runs them through compose_smoke.sh --live-checks)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from tests.deploy.live_stack import _parse_docker_time, counter_value, openai_error, samples, total


def test_counter_value_reads_prometheus_clients_own_exposition() -> None:
    registry = CollectorRegistry()
    requests = Counter("cleave_worker_requests", "RPCs", ["method", "outcome"], registry=registry)
    requests.labels("Generate", "ok").inc(3)
    requests.labels("Generate", "unavailable").inc()
    requests.labels("GetStats", "ok").inc(40)
    text = generate_latest(registry).decode()
    name = "cleave_worker_requests_total"
    assert counter_value(text, name, {"method": "Generate", "outcome": "ok"}) == 3
    assert counter_value(text, name, {"method": "Generate", "outcome": "unavailable"}) == 1
    # A labelled counter not yet incremented is absent from the text: 0, as Prometheus reads it.
    assert counter_value(text, name, {"method": "Prefill", "outcome": "ok"}) == 0
    assert counter_value(text, name, {"method": "Generate"}) == 0  # labels must match exactly


def test_openai_error_wants_the_error_objects_fields() -> None:
    error = {"error": {"message": "no healthy decode worker", "type": "service_unavailable", "code": None}}
    assert openai_error(error)
    assert not openai_error({"detail": "Internal Server Error"})
    assert not openai_error({"error": "busy"})
    assert not openai_error({"error": {"message": "", "type": "x", "code": None}})
    assert not openai_error({"error": {"message": "m", "code": 1}})
    assert not openai_error("upstream connect error")


def test_docker_times_with_nanoseconds() -> None:
    start = _parse_docker_time("2026-12-02T03:40:01.123456789Z")
    end = _parse_docker_time("2026-12-02T03:40:03.623456789Z")
    assert abs(end - start - 2.5) < 1e-6
    assert _parse_docker_time("2026-12-02T03:40:01Z") + 1 == _parse_docker_time("2026-12-02T03:40:02Z")


def test_samples_read_vllms_labelled_metrics() -> None:
    registry = CollectorRegistry()
    running = Gauge("vllm:num_requests_running", "running", ["model_name", "engine"], registry=registry)
    running.labels("smol", "0").set(3)
    success = Counter(
        "vllm:request_success", "done", ["model_name", "engine", "finished_reason"], registry=registry
    )
    success.labels("smol", "0", "length").inc(4)
    success.labels("smol", "0", "stop").inc(1)
    text = generate_latest(registry).decode()
    assert samples(text, "vllm:num_requests_running") == [({"model_name": "smol", "engine": "0"}, 3.0)]
    assert total(text, "vllm:request_success_total") == 5
    assert total(text, "vllm:request_success_total", finished_reason="length") == 4
    assert total(text, "vllm:request_success_total", finished_reason="abort") == 0
