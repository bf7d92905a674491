"""The NetworkPolicies of every rendered overlay allow exactly the flows docs/deploy.md lists
("Network policies"): every flow of the table, between the pods the overlay has, and nothing
else: not between Cleave's pods, not to them from elsewhere, not from them to elsewhere.
Evaluated as the API defines policies (tests/deploy/network_policy.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.deploy.k8s_render import OVERLAYS, objects
from tests.deploy.network_policy import Pod, Policies

DOC = Path(__file__).parent.parent.parent / "docs" / "deploy.md"
BEGIN, END = "<!-- network-flows:begin -->", "<!-- network-flows:end -->"
# What the table's "from" and "to" may name besides Cleave's pods.
ANY = Pod("any", {}, namespace="elsewhere", namespace_labels={"kubernetes.io/metadata.name": "elsewhere"})
MONITORING = Pod(
    "monitoring", {"app": "prometheus"}, "monitoring", {"kubernetes.io/metadata.name": "monitoring"}
)
KUBE_DNS = Pod(
    "kube-dns", {"k8s-app": "kube-dns"}, "kube-system", {"kubernetes.io/metadata.name": "kube-system"}
)
# Every port a policy or the table names, and one ephemeral port (UCX's connections).
PORTS = [
    (p, "TCP")
    for p in (53, 443, 6379, 6443, 8000, 9400, 9500, 40000, 50051, 50052, 50053, 50060, 50070, 50090)
]
PORTS += [(53, "UDP")]

Flow = tuple[str, str, int, str]


def documented_rows() -> list[tuple[list[str], list[str], list[tuple[int, str]]]]:
    text = DOC.read_text()
    table = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    rows = []
    for line in table.strip().splitlines()[2:]:  # past the header and its rule
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        sources, destinations, ports = (re.split(r",\s*", cells[i].replace("`", "")) for i in range(3))
        rows.append((sources, destinations, [_port(p) for p in ports]))
    return rows


def _port(text: str) -> tuple[int, str]:
    if text == "all TCP":
        return (0, "TCP")  # every TCP port
    number, _, protocol = text.partition("/")
    return int(number), (protocol or "tcp").upper()


def cleave_pods(overlay: str) -> dict[str, Pod]:
    pods = {}
    for (kind, name), obj in objects(overlay).items():
        if kind == "Deployment":
            pods[name] = Pod(name, obj["spec"]["template"]["metadata"]["labels"])
    return pods


def expected(overlay: str) -> set[Flow]:
    pods = cleave_pods(overlay)
    # "any": a pod that is not one of Cleave's (Cleave's own pods call only what they list).
    outside = [ANY.name, MONITORING.name]

    def names(cell: list[str], *, sources: bool) -> list[str]:
        found: list[str] = []
        for name in cell:
            if name == "any":
                found += outside if sources else [ANY.name, KUBE_DNS.name]
            elif name == "every Cleave pod":
                found += list(pods)
            elif name in pods or name in (MONITORING.name, KUBE_DNS.name):
                found.append(name)
        return found

    flows: set[Flow] = set()
    for sources, destinations, ports in documented_rows():
        for source in names(sources, sources=True):
            for destination in names(destinations, sources=False):
                for port, protocol in ports:
                    matching = [p for p in PORTS if p[1] == protocol and port in (0, p[0])]
                    flows |= {
                        (source, destination, p, protocol) for p, _ in matching if source != destination
                    }
    return flows


def allowed(overlay: str) -> set[Flow]:
    pods = cleave_pods(overlay)
    policies = Policies(obj for (kind, _), obj in objects(overlay).items() if kind == "NetworkPolicy")
    sources = [*pods.values(), ANY, MONITORING]
    destinations = [*pods.values(), ANY, KUBE_DNS]
    return {
        (s.name, d.name, port, protocol)
        for s in sources
        for d in destinations
        if s.name != d.name and (s.name in pods or d.name in pods)
        for port, protocol in PORTS
        if policies.allows(s, d, port, protocol)
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_policies_allow_exactly_the_documented_flows(overlay: str) -> None:
    want, have = expected(overlay), allowed(overlay)
    assert not want - have, f"documented but blocked: {sorted(want - have)}"
    assert not have - want, f"allowed but not documented: {sorted(have - want)}"


def test_every_cleave_pod_is_isolated_both_ways() -> None:
    policies = Policies(obj for (kind, _), obj in objects("1p1d").items() if kind == "NetworkPolicy")
    stranger = Pod("stranger", {"app.kubernetes.io/part-of": "cleave"})  # a new pod nobody opened
    assert not any(policies.allows(ANY, stranger, p, proto) for p, proto in PORTS if p != 50090)
    assert not any(policies.allows(stranger, ANY, p, proto) for p, proto in PORTS)


def test_the_evaluator_follows_the_api() -> None:
    # No policy selects a pod: it is open. A policy without rules isolates it.
    open_pod, other = Pod("a", {"x": "1"}), Pod("b", {"x": "2"})
    assert Policies([]).allows(open_pod, other, 80)
    deny = {"spec": {"podSelector": {"matchLabels": {"x": "2"}}, "policyTypes": ["Ingress"]}}
    assert not Policies([deny]).allows(open_pod, other, 80)
    allow = {
        "spec": {
            "podSelector": {"matchLabels": {"x": "2"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"x": "1"}}}], "ports": [{"port": 80}]}],
        }
    }
    assert Policies([deny, allow]).allows(open_pod, other, 80)
    assert not Policies([deny, allow]).allows(open_pod, other, 81)
    assert not Policies([deny, allow]).allows(ANY, other, 80)  # a podSelector alone: same namespace
    # An ipBlock for every address reaches any pod, here or elsewhere, on its ports only.
    egress = {
        "spec": {
            "podSelector": {"matchLabels": {"x": "1"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443}]}],
        }
    }
    assert Policies([egress]).allows(open_pod, ANY, 443) and Policies([egress]).allows(open_pod, other, 443)
    assert not Policies([egress]).allows(open_pod, ANY, 80)
