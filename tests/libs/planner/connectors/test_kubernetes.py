"""The Kubernetes connector against a fake API server (fake_kube.py) over HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from libs.config.roles import Role
from libs.planner.connectors.kubernetes import DELETION_COST, KubeApi, KubernetesConnector
from libs.planner.state import Counts
from tests.libs.planner.connectors.fake_kube import FakeCluster, serving

pytestmark = pytest.mark.anyio

ROLES = (Role.PREFILL, Role.DECODE)
DEPLOYMENTS = {Role.PREFILL: "prefill", Role.DECODE: "decode", Role.BOTH: "pd"}


def cluster() -> FakeCluster:
    fake = FakeCluster(token="sekrit")
    fake.add_deployment("prefill", 1)
    fake.add_deployment("decode", 2)
    return fake


def connector(url: str, tmp_path: Path) -> KubernetesConnector:
    token = tmp_path / "token"
    token.write_text("sekrit\n")
    return KubernetesConnector(KubeApi(url, token_file=token), "cleave", DEPLOYMENTS, ROLES)


async def test_state_reads_the_deployments_and_their_pods(tmp_path: Path) -> None:
    fake = cluster()
    with serving(fake) as url:
        planner = connector(url, tmp_path)
        state = await planner.state()
        assert state.desired == Counts(1, 2)
        assert state.starting == {Role.PREFILL: 0, Role.DECODE: 0}
        await planner.scale_to(Counts(3, 2))
        state = await planner.state()
        assert state.desired == Counts(3, 2) and state.starting[Role.PREFILL] == 2
        fake.make_ready("prefill")
        assert (await planner.state()).starting[Role.PREFILL] == 0
        await planner.close()
    # Scaling is a merge patch of the scale subresource; unchanged roles are not touched.
    patches = [(path, body) for method, path, body in fake.requests if method == "PATCH"]
    assert patches == [
        ("/apis/apps/v1/namespaces/cleave/deployments/prefill/scale", {"spec": {"replicas": 3}})
    ]


async def test_scaling_down_removes_the_least_loaded_pod_first(tmp_path: Path) -> None:
    fake = FakeCluster(token="sekrit")
    fake.add_deployment("prefill", 1)
    fake.add_deployment("decode", 3)
    busy, idle, middle = sorted(fake.pods_of("decode"), key=lambda p: p["metadata"]["name"])
    load = {
        busy["status"]["podIP"] + ":50060": 9.0,
        idle["status"]["podIP"] + ":50060": 0.0,
        middle["status"]["podIP"] + ":50060": 3.0,
    }
    with serving(fake) as url:
        planner = connector(url, tmp_path)
        await planner.scale_to(Counts(1, 2), load)
        # The idle pod was marked and is the one terminating (by default the newest would go).
        assert fake.pods[idle["metadata"]["name"]]["metadata"]["annotations"] == {DELETION_COST: "-1000"}
        terminating = [
            p["metadata"]["name"] for p in fake.pods_of("decode") if p["metadata"].get("deletionTimestamp")
        ]
        assert terminating == [idle["metadata"]["name"]]
        state = await planner.state()
        assert state.desired == Counts(1, 2) and state.retiring[Role.DECODE] == 1
        fake.finish_terminating()
        assert (await planner.state()).retiring[Role.DECODE] == 0
        await planner.close()


async def test_a_wrong_token_is_an_error_not_a_decision(tmp_path: Path) -> None:
    fake = cluster()
    with serving(fake) as url:
        wrong = tmp_path / "wrong"
        wrong.write_text("nope")
        planner = KubernetesConnector(KubeApi(url, token_file=wrong), "cleave", DEPLOYMENTS, ROLES)
        with pytest.raises(httpx.HTTPStatusError, match="401"):
            await planner.state()
        await planner.close()
    assert all(method != "PATCH" for method, _, _ in fake.requests)
