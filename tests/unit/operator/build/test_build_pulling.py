"""Pull pods (``pulling``): their shape, which node is asked, and what the
kubelet's words say of the image (a table of pod statuses)."""

from __future__ import annotations

from typing import Any

import operator_fixtures as fixtures
import pytest
import test_build_planner as cases

from kmm.api import labels
from kmm.operator import caches
from kmm.operator.build import existence, pulling

Obj = dict[str, Any]
IMAGE = "r.io/m:k1"


def _waiting(reason: str, message: str = "") -> Obj:
    return {
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "pull", "state": {"waiting": {"reason": reason, "message": message}}}
            ],
        },
    }


def _state(state: Obj, phase: str = "Running") -> Obj:
    return {
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase, "containerStatuses": [{"name": "pull", "state": state}]},
    }


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        ({"status": {"phase": "Pending"}}, None),
        (_waiting("ContainerCreating"), None),
        ({"spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}}, existence.State.EXISTS),
        (_state({"running": {}}), existence.State.EXISTS),
        (_state({"terminated": {"exitCode": 128, "reason": "StartError"}}, "Failed"), existence.State.EXISTS),
        (_waiting("CreateContainerConfigError", "image has non-numeric user"), existence.State.EXISTS),
        (_waiting("ErrImagePull", 'rpc error: code = NotFound desc = failed to pull and unpack image "r.io/m:k1": failed to resolve reference "r.io/m:k1": r.io/m:k1: not found'), existence.State.MISSING),
        (_waiting("ImagePullBackOff", 'Back-off pulling image "r.io/m:k1": ErrImagePull: pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed'), existence.State.MISSING),
        (_waiting("ErrImagePull", "failed to authorize: failed to fetch oauth token: unexpected status: 401 Unauthorized"), existence.State.AUTH_FAILED),
        (_waiting("ErrImagePull", "failed to do request: Head \"https://r.io/v2/m/manifests/k1\": dial tcp: i/o timeout"), existence.State.ERROR),
        (_waiting("InvalidImageName"), existence.State.ERROR),
        ({"spec": {}, "status": {"phase": "Failed", "reason": "Evicted"}}, existence.State.ERROR),
    ],
    ids=[
        "pending", "pulling", "succeeded", "running", "no-shell-past-the-pull",
        "refused-after-the-pull", "not-found", "scope-refused-as-docker-hub-answers",
        "unauthorized", "no-answer", "invalid-name", "failed-before-its-container",
    ],
)  # fmt: skip
def test_a_verdict_from_what_the_kubelet_wrote(pod: Obj, expected: existence.State | None) -> None:
    found = pulling.verdict(pod, IMAGE)
    assert (found.state if found is not None else None) == expected
    if found is not None:
        assert found.node  # a node's verdict, never taken for a registry's
        assert found.labels is None
        assert not found.digest


def test_a_pull_pod_asks_without_privileges_and_with_the_modules_credentials() -> None:
    module = fixtures.module(cases._raw(sign=False))
    pod = pulling.pull_pod(module, image=IMAGE, kernel=cases.K1, node="n1")
    assert pod["metadata"]["name"] == pulling.pod_name("m", IMAGE)
    assert len(pulling.pod_name("m" * 63, IMAGE)) <= 63
    assert pod["metadata"]["labels"][labels.ROLE] == labels.PULL_ROLE
    assert pod["metadata"]["ownerReferences"][0]["controller"] is True
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["imagePullSecrets"] == [{"name": "repo"}]
    (container,) = spec["containers"]
    assert container["imagePullPolicy"] == "Always"
    security = container["securityContext"]
    assert (security["runAsNonRoot"], security["allowPrivilegeEscalation"]) == (True, False)
    assert security["capabilities"] == {"drop": ["ALL"]}


def test_a_pull_pod_tolerates_what_the_module_tolerates() -> None:
    """As KMM's pull pods do: a node the Module's workloads may run on, tainted
    or not, can be asked (and the node chosen by choose_node is such a one)."""
    raw = cases._raw(sign=False)
    toleration = {"key": "accel", "operator": "Equal", "value": "x", "effect": "NoSchedule"}
    raw["spec"]["tolerations"] = [toleration]
    pod = pulling.pull_pod(fixtures.module(raw), image=IMAGE, kernel=cases.K1, node="n1")
    assert pod["spec"]["tolerations"] == [toleration]
    tainted = fixtures.node("tainted", cases.K1, taints=[{**toleration, "value": "x"}])
    assert (
        pulling.choose_node(fixtures.view(fixtures.module(raw), [tainted]), cases.K1) == "tainted"
    )
    untolerating = pulling.pull_pod(
        fixtures.module(cases._raw(sign=False)), image=IMAGE, kernel=cases.K1, node="n1"
    )
    assert "tolerations" not in untolerating["spec"]


def _kwok(name: str, kernel: str) -> Obj:
    node = fixtures.node(name, kernel)
    node["metadata"]["annotations"] = {caches.KWOK_ANNOTATION: "fake"}
    return caches.project_node(node)  # as the cache keeps it


def test_the_node_asked_runs_containers_and_prefers_the_kernel() -> None:
    module = fixtures.module(cases._raw(sign=False))
    cordoned = fixtures.node("a-cordoned", cases.K1, unschedulable=True)
    tainted = fixtures.node("b-tainted", cases.K1, taints=[{"key": "x", "effect": "NoSchedule"}])
    other = fixtures.node("c-other-kernel", cases.K2)
    same = fixtures.node("d-same-kernel", cases.K1)
    nodes = [_kwok("0-kwok", cases.K1), cordoned, tainted, other, same]
    assert pulling.choose_node(fixtures.view(module, nodes), cases.K1) == "d-same-kernel"
    assert pulling.choose_node(fixtures.view(module, nodes[:-1]), cases.K1) == "c-other-kernel"
    assert pulling.choose_node(fixtures.view(module, nodes[:-2]), cases.K1) is None


def test_the_node_cache_keeps_only_whether_kwok_manages_a_node() -> None:
    node = fixtures.node("n", cases.K1)
    node["metadata"]["annotations"] = {caches.KWOK_ANNOTATION: "fake", "big": "x" * 1000}
    kept = caches.project_node(node)
    assert "annotations" not in kept["metadata"]
    assert caches.fake_node(kept)
    assert not caches.fake_node(caches.project_node(fixtures.node("real", cases.K1)))
