"""Which connections a set of Kubernetes NetworkPolicies allows, evaluated as the API defines
it (networking.k8s.io/v1), for the subset deploy/k8s uses: pod and namespace selectors with
matchLabels and matchExpressions (In), numbered ports or none (every port of the protocol),
and ipBlock peers for every IPv4 address (0.0.0.0/0, no `except`), which match any pod: the
API leaves whether an ipBlock matches pod addresses to the network plugin, so the evaluator
takes the wider reading.

A connection from pod A to pod B on a port is allowed when A's egress allows it (A is selected
by no policy of type Egress, or some egress rule of a policy selecting A matches B and the
port) and B's ingress allows it (the same, the other way round). Pods of another namespace
are selected by no policy here (the policies are namespaced to Cleave's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    name: str  # what the flow table calls it
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace: str = "cleave"
    namespace_labels: Mapping[str, str] = field(default_factory=dict)


def _matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A label selector; {} (or an absent one where the API means "all") matches everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        operator, values = expression["operator"], expression.get("values", [])
        if operator == "In" and labels.get(expression["key"]) not in values:
            return False
        if operator != "In":
            raise NotImplementedError(f"selector operator {operator}")
    return True


def _peer_matches(peer: Mapping[str, Any], pod: Pod, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        if block.get("cidr") != "0.0.0.0/0" or block.get("except"):
            raise NotImplementedError(f"ipBlock {block}")
        return True
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], pod.namespace_labels):
            return False
    elif pod.namespace != policy_namespace:
        return False  # a podSelector alone means pods of the policy's own namespace
    return "podSelector" not in peer or _matches(peer["podSelector"], pod.labels)


def _port_matches(rule: Mapping[str, Any], port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    if not ports:
        return True
    for entry in ports:
        if entry.get("protocol", "TCP") != protocol:
            continue
        if "port" not in entry:
            return True
        if not isinstance(entry["port"], int):
            raise NotImplementedError("named ports")
        if entry["port"] <= port <= entry.get("endPort", entry["port"]):
            return True
    return False


class Policies:
    def __init__(self, policies: Iterable[Mapping[str, Any]], namespace: str = "cleave") -> None:
        self._policies = list(policies)
        self._namespace = namespace

    def _selecting(self, pod: Pod, kind: str) -> list[Mapping[str, Any]]:
        if pod.namespace != self._namespace:
            return []
        return [
            p
            for p in self._policies
            if kind in p["spec"].get("policyTypes", ["Ingress"])
            and _matches(p["spec"]["podSelector"], pod.labels)
        ]

    def _side_allows(self, pod: Pod, other: Pod, kind: str, port: int, protocol: str) -> bool:
        selecting = self._selecting(pod, kind)
        if not selecting:
            return True  # not isolated in this direction
        key, peers_key = ("ingress", "from") if kind == "Ingress" else ("egress", "to")
        for policy in selecting:
            for rule in policy["spec"].get(key) or []:
                peers = rule.get(peers_key)
                peer_ok = not peers or any(_peer_matches(p, other, self._namespace) for p in peers)
                if peer_ok and _port_matches(rule, port, protocol):
                    return True
        return False

    def allows(self, source: Pod, destination: Pod, port: int, protocol: str = "TCP") -> bool:
        return self._side_allows(source, destination, "Egress", port, protocol) and self._side_allows(
            destination, source, "Ingress", port, protocol
        )
