"""deploy/grafana and deploy/k8s/observability read metrics that exist: every metric a
dashboard panel, the KEDA trigger or the PodMonitor names is exported by vLLM's stat logger
(the locked vLLM's source), the gateway's vLLM-named metrics, or Cleave's own (declared in
libs/), and the KEDA object scales the decode Deployment on waiting requests."""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import yaml
from vllm.v1.metrics import loggers

from tests.deploy.k8s_render import containers, objects

DEPLOY = Path(__file__).parent.parent.parent / "deploy"
LIBS = Path(__file__).parent.parent.parent / "libs"
METRIC = re.compile(r"\b((?:vllm:|cleave_)[a-z0-9_:]+)")
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def exported() -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(inspect.getsource(loggers))):
        if isinstance(node, ast.Call):
            names |= {
                str(k.value.value)
                for k in node.keywords
                if k.arg == "name" and isinstance(k.value, ast.Constant)
            }
    for source in LIBS.rglob("*.py"):
        names |= set(re.findall(r'"((?:vllm:|cleave_)[a-z0-9_:]+)"', source.read_text()))
    # prometheus_client declares a counter with or without `_total`; a query reads it with.
    return {base_name(name) for name in names}


def base_name(metric: str) -> str:
    for suffix in SUFFIXES:
        if metric.endswith(suffix):
            return metric[: -len(suffix)]
    return metric


def used(expressions: list[str]) -> set[str]:
    return {base_name(m) for expression in expressions for m in METRIC.findall(expression)}


def test_every_dashboard_query_reads_an_exported_metric() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "cleave-dashboard.json").read_text())
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    names = used(expressions)
    assert {
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds",
    } <= names
    missing = names - exported()
    assert not missing, f"the dashboard reads metrics nothing exports: {sorted(missing)}"


def test_keda_scales_decode_on_waiting_requests_that_are_exported() -> None:
    scaled = yaml.safe_load((DEPLOY / "k8s" / "observability" / "keda-decode.yaml").read_text())
    assert scaled["kind"] == "ScaledObject" and scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"] == "decode"
    assert ("Deployment", "decode") in objects("1p1d")
    [trigger] = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert used([query]) == {"vllm:num_requests_waiting", "cleave_gateway_queued_requests"}
    assert not used([query]) - exported()
    assert float(trigger["metadata"]["threshold"]) > 0
    assert scaled["spec"]["minReplicaCount"] >= 1  # never to zero: a cold start loads a model


def test_the_pod_monitor_scrapes_ports_the_pods_have() -> None:
    monitor = yaml.safe_load((DEPLOY / "k8s" / "observability" / "podmonitor.yaml").read_text())
    ports = {endpoint["port"] for endpoint in monitor["spec"]["podMetricsEndpoints"]}
    named = {
        name: {p["name"] for p in containers(obj)[0].get("ports", [])}
        for (kind, name), obj in objects("1p1d").items()
        if kind == "Deployment"
    }
    for scraped in ("gateway", "prefill", "decode", "kvstore"):
        assert named[scraped] & ports, f"{scraped} has none of the scraped ports {ports}"
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/part-of": "cleave"}
