"""A fake Kubernetes API server for the planner's connector: Deployments with their `scale`
subresource and their pods, over real HTTP (starlette on uvicorn, in a thread).

It plays the ReplicaSet controller too, as far as the planner relies on it: scaling up adds
pods (not ready until `make_ready`), scaling down deletes the pods with the lowest
`controller.kubernetes.io/pod-deletion-cost` first (then the newest), marking them
terminating (deletionTimestamp) until `finish_terminating`. Every request is logged, and a
bearer token is required when one is set.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

COST = "controller.kubernetes.io/pod-deletion-cost"


@dataclass
class FakeCluster:
    namespace: str = "cleave"
    token: str | None = None
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    _serial: int = 0

    def add_deployment(self, name: str, replicas: int, *, ready: bool = True) -> None:
        self.deployments[name] = {
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app.kubernetes.io/name": name}}},
            "status": {},
        }
        self._scale(name, replicas)
        if ready:
            self.make_ready(name)

    def pods_of(self, name: str) -> list[dict[str, Any]]:
        return [p for p in self.pods.values() if p["metadata"]["labels"]["app.kubernetes.io/name"] == name]

    def make_ready(self, name: str) -> None:
        for pod in self.pods_of(name):
            if not pod["metadata"].get("deletionTimestamp"):
                pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        self._status(name)

    def finish_terminating(self) -> None:
        for key in [k for k, p in self.pods.items() if p["metadata"].get("deletionTimestamp")]:
            del self.pods[key]

    def _status(self, name: str) -> None:
        live = [p for p in self.pods_of(name) if not p["metadata"].get("deletionTimestamp")]
        ready = sum(
            any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
            for p in live
        )
        self.deployments[name]["status"] = {"replicas": len(live), "readyReplicas": ready}

    def _scale(self, name: str, replicas: int) -> None:
        self.deployments[name]["spec"]["replicas"] = replicas
        live = [p for p in self.pods_of(name) if not p["metadata"].get("deletionTimestamp")]
        for _ in range(replicas - len(live)):
            self._serial += 1
            pod_name = f"{name}-{self._serial}"
            self.pods[pod_name] = {
                "metadata": {
                    "name": pod_name,
                    "labels": {"app.kubernetes.io/name": name},
                    "annotations": {},
                    "creationTimestamp": self._serial,
                },
                "status": {"podIP": f"10.0.0.{self._serial}", "conditions": []},
            }
        if len(live) > replicas:
            # ReplicaSet: lowest deletion cost first, then not ready, then the newest.
            def order(pod: dict[str, Any]) -> tuple[int, int, int]:
                cost = int(pod["metadata"]["annotations"].get(COST, "0"))
                ready = any(c["type"] == "Ready" for c in pod["status"].get("conditions", []))
                return (cost, 1 if ready else 0, -pod["metadata"]["creationTimestamp"])

            for pod in sorted(live, key=order)[: len(live) - replicas]:
                pod["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"
        self._status(name)

    # -- HTTP ------------------------------------------------------------------------------
    def app(self) -> Starlette:
        async def deployment(request: Request) -> JSONResponse:
            if (refused := self._refuse(request)) is not None:
                return refused
            name = request.path_params["name"]
            if name not in self.deployments:
                return JSONResponse({"kind": "Status", "code": 404}, status_code=404)
            self.requests.append((request.method, request.url.path, None))
            return JSONResponse(self.deployments[name])

        async def scale(request: Request) -> JSONResponse:
            if (refused := self._refuse(request)) is not None:
                return refused
            name = request.path_params["name"]
            if request.method == "PATCH":
                if request.headers.get("content-type") != "application/merge-patch+json":
                    return JSONResponse({"code": 415}, status_code=415)
                body = await request.json()
                self.requests.append(("PATCH", request.url.path, body))
                self._scale(name, int(body["spec"]["replicas"]))
            replicas = self.deployments[name]["spec"]["replicas"]
            return JSONResponse({"kind": "Scale", "spec": {"replicas": replicas}})

        async def pods(request: Request) -> JSONResponse:
            if (refused := self._refuse(request)) is not None:
                return refused
            selector = dict(
                part.split("=") for part in request.query_params.get("labelSelector", "").split(",") if part
            )
            items = [
                p
                for p in self.pods.values()
                if all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())
            ]
            self.requests.append(("GET", request.url.path, selector))
            return JSONResponse({"kind": "PodList", "items": items})

        async def pod(request: Request) -> JSONResponse:
            if (refused := self._refuse(request)) is not None:
                return refused
            body = await request.json()
            self.requests.append(("PATCH", request.url.path, body))
            target = self.pods[request.path_params["name"]]
            target["metadata"]["annotations"].update(body["metadata"]["annotations"])
            return JSONResponse(target)

        base = "/apis/apps/v1/namespaces/{ns}/deployments/{name}"
        return Starlette(
            routes=[
                Route(base, deployment, methods=["GET"]),
                Route(base + "/scale", scale, methods=["GET", "PATCH"]),
                Route("/api/v1/namespaces/{ns}/pods", pods, methods=["GET"]),
                Route("/api/v1/namespaces/{ns}/pods/{name}", pod, methods=["PATCH"]),
            ]
        )

    def _refuse(self, request: Request) -> JSONResponse | None:
        if request.path_params.get("ns") != self.namespace:
            return JSONResponse({"code": 404}, status_code=404)
        if self.token is not None and request.headers.get("authorization") != f"Bearer {self.token}":
            return JSONResponse({"kind": "Status", "code": 401}, status_code=401)
        return None


@contextlib.contextmanager
def serving(cluster: FakeCluster) -> Iterator[str]:
    """The fake API server's base URL while the block runs."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(cluster.app(), log_config=None, access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the fake API server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
