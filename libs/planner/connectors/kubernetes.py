"""The Kubernetes connector: each role is a Deployment (deploy/k8s/workers/*), scaled through
its `scale` subresource; the API is called over HTTPS with the pod's service-account token.

- State: a Deployment's `spec.replicas` is what is asked for; `status.readyReplicas` of them
  serve; the difference is starting. Pods of the role with a deletionTimestamp are retiring.
- Up: PATCH `spec.replicas`.
- Down, draining: the pods to remove are chosen (fewest requests in flight, from the gateways'
  metrics) and annotated `controller.kubernetes.io/pod-deletion-cost` (ReplicaSets delete the
  lowest cost first), then `spec.replicas` is lowered. The pod leaves its headless Service's
  endpoints as it starts terminating, so every gateway retires it at its next DNS lookup
  (`--worker-dns-refresh-s`) and routes nothing new to it; the worker Deployments' preStop
  hook (deploy/k8s/overlays/1p1d-planner) holds SIGTERM back until then; the worker then
  drains within its --shutdown-grace-s (finishes what it can, hands the rest off: text streams
  continue on another decode worker; docs/planner.md).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx
import structlog

from libs.config.roles import Role
from libs.planner.connectors.base import FleetState
from libs.planner.state import Counts

log = structlog.get_logger(__name__)

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
REMOVE_FIRST_COST = "-1000"


class KubeApi:
    """The few Kubernetes API calls the planner makes, on one HTTP client."""

    def __init__(
        self,
        base_url: str,
        *,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        verify: ssl.SSLContext | bool = True
        if ca_file is not None and ca_file.exists():
            verify = ssl.create_default_context(cafile=str(ca_file))
        self._token_file = token_file if token_file is not None and token_file.exists() else None
        self._client = httpx.AsyncClient(
            base_url=base_url, verify=verify, timeout=timeout_s, transport=transport
        )

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._token_file is not None:
            # Read each time: projected service-account tokens are rotated on disk.
            headers["Authorization"] = "Bearer " + self._token_file.read_text().strip()
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def get(self, path: str, **params: str) -> dict[str, Any]:
        response = await self._client.get(path, params=params or None, headers=self._headers())
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self._client.patch(
            path, json=body, headers=self._headers("application/merge-patch+json")
        )
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    async def close(self) -> None:
        await self._client.aclose()


class KubernetesConnector:
    def __init__(
        self, api: KubeApi, namespace: str, deployments: dict[Role, str], roles: tuple[Role, ...]
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._deployments = {role: deployments[role] for role in roles}

    def _deployment_path(self, name: str) -> str:
        return f"/apis/apps/v1/namespaces/{self._namespace}/deployments/{name}"

    async def _pods(self, deployment: dict[str, Any]) -> list[dict[str, Any]]:
        labels = deployment["spec"]["selector"]["matchLabels"]
        selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        found = await self._api.get(f"/api/v1/namespaces/{self._namespace}/pods", labelSelector=selector)
        pods: list[dict[str, Any]] = found.get("items", [])
        return pods

    async def state(self) -> FleetState:
        desired: dict[Role, int] = {}
        starting: dict[Role, int] = {}
        retiring: dict[Role, int] = {}
        for role, name in self._deployments.items():
            deployment = await self._api.get(self._deployment_path(name))
            wanted = int(deployment["spec"].get("replicas", 1))
            ready = int(deployment.get("status", {}).get("readyReplicas", 0) or 0)
            pods = await self._pods(deployment)
            desired[role] = wanted
            starting[role] = max(wanted - ready, 0)
            retiring[role] = sum(1 for pod in pods if pod["metadata"].get("deletionTimestamp"))
        return FleetState(Counts.of(desired), starting, retiring)

    async def scale_to(self, target: Counts, load: dict[str, float] | None = None) -> None:
        for role, name in self._deployments.items():
            deployment = await self._api.get(self._deployment_path(name))
            have = int(deployment["spec"].get("replicas", 1))
            wanted = target.get(role)
            if wanted == have:
                continue
            if wanted < have:
                await self._mark_for_removal(deployment, have - wanted, load or {})
            await self._api.merge_patch(
                f"{self._deployment_path(name)}/scale", {"spec": {"replicas": wanted}}
            )
            log.info(
                "planner: scaled", deployment=name, role=role.value, replicas_from=have, replicas_to=wanted
            )

    async def _mark_for_removal(self, deployment: dict[str, Any], count: int, load: dict[str, float]) -> None:
        """The `count` least loaded live pods get the lowest deletion cost, so the ReplicaSet
        removes them (not pods in the middle of long requests)."""
        pods = [p for p in await self._pods(deployment) if not p["metadata"].get("deletionTimestamp")]

        def pod_load(pod: dict[str, Any]) -> tuple[int, float, str]:
            ip = pod.get("status", {}).get("podIP", "")
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in pod.get("status", {}).get("conditions", [])
            )
            in_flight = sum(v for address, v in load.items() if ip and address.rpartition(":")[0] == ip)
            return (1 if ready else 0, in_flight, pod["metadata"]["name"])

        for pod in sorted(pods, key=pod_load)[:count]:
            name = pod["metadata"]["name"]
            await self._api.merge_patch(
                f"/api/v1/namespaces/{self._namespace}/pods/{name}",
                {"metadata": {"annotations": {DELETION_COST: REMOVE_FIRST_COST}}},
            )
            log.info("planner: pod chosen for removal", pod=name)

    async def close(self) -> None:
        await self._api.close()
