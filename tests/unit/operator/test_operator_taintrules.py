"""DeviceTaintRules sent: on the wire, through a Module's reconciles, its deletion and after it is gone."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import kubeclients
import operator_fixtures as fixtures
import pytest
from scripted import Server
from test_operator_reconciler import RecordingWriter

from kmm.api import conditions, labels
from kmm.kube import errors
from kmm.operator import caches, deviceapis, devicecaches, reconciler, taintrules, views, writing
from kmm.operator.dra import builders as dra_builders
from kmm.runtime import stores

K68 = fixtures.KERNELS[0]
DRIVER = "gpu.example.com"
PLUGIN = labels.device_plugin_version("ns", "m")


@pytest.fixture
async def writer() -> AsyncIterator[tuple[writing.Writer, Server]]:
    async with Server() as server, kubeclients.for_server(server.url, max_attempts=1) as api:
        yield writing.Writer(api), server


async def test_rules_go_to_the_served_version_and_deletes_carry_the_observed_uid(
    writer: tuple[writing.Writer, Server],
) -> None:
    write, server = writer
    resource = deviceapis.rules_resource("v1beta2")
    desired = {"metadata": {"name": "r"}, "spec": {}}
    conflict = {"kind": "Status", "code": 409, "reason": "AlreadyExists", "message": "taken"}
    ok = {"metadata": {"resourceVersion": "7"}}
    server.script((201, ok), (409, conflict), (200, ok), (200, {"kind": "Status"}))
    assert await write.create_taint_rule(resource, desired)
    taken = {"metadata": {"name": "taken"}, "spec": {}}
    assert not await write.create_taint_rule(resource, taken)  # never taken over
    observed = {"metadata": {"name": "r", "uid": "u-r", "resourceVersion": "7"}}
    assert await write.apply_taint_rule(resource, desired, observed)
    assert await write.delete_taint_rule(resource, observed)
    create, _, apply, delete = server.seen
    base = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
    assert (create.method, create.path) == ("POST", base)
    assert (apply.method, apply.path) == ("PATCH", f"{base}/r")
    assert apply.headers["Content-Type"] == "application/apply-patch+yaml"
    assert (delete.method, delete.path) == ("DELETE", f"{base}/r")
    assert json.loads(delete.body)["preconditions"] == {"uid": "u-r"}
    with pytest.raises(ValueError, match="unobserved"):
        await write.delete_taint_rule(resource, {"metadata": {"name": "never-seen"}})
    assert len(server.seen) == 4


class TaintWriter(RecordingWriter):
    """The recording writer with rules; ``forbid`` makes the API server say 403."""

    def __init__(self, cached: views.Caches) -> None:
        super().__init__(cached)
        self.forbid = False
        self.versions: set[str] = set()

    async def create_taint_rule(self, resource: Any, desired: dict) -> bool:
        name = desired["metadata"]["name"]
        self.calls.append(("create-rule", name))
        self.versions.add(resource.version)
        if self.forbid:
            raise errors.Forbidden(
                403, f'devicetaintrules "{name}" is forbidden', reason="Forbidden"
            )
        created = copy.deepcopy(desired)
        created["metadata"]["uid"] = f"uid-rule-{name}"
        self.cached.taint_rules.put(created)
        return True

    async def apply_taint_rule(self, resource: Any, desired: dict, observed: dict) -> bool:
        self.calls.append(("apply-rule", desired["metadata"]["name"]))
        applied = copy.deepcopy(desired)
        applied["metadata"]["uid"] = observed["metadata"]["uid"]
        self.cached.taint_rules.put(applied)
        return True

    async def delete_taint_rule(self, resource: Any, observed: dict) -> bool:
        assert observed["metadata"]["uid"], "a delete is guarded by the observed uid"
        self.calls.append(("delete-rule", observed["metadata"]["name"]))
        self.cached.taint_rules.delete(observed["metadata"]["name"])
        return True


def _module(*, evict: bool = False) -> dict[str, Any]:
    raw = fixtures.module_raw(dra={"driverName": DRIVER, "container": {"image": "r.io/d:1"}})
    raw["spec"]["moduleLoader"]["container"]["version"] = "v2"
    if evict:
        raw["metadata"]["annotations"] = {labels.EVICT_DEVICE_USERS: "true"}
    return raw


@pytest.fixture
def world() -> tuple[reconciler.ModuleReconciler, TaintWriter, views.Caches]:
    """A DRA Module at v2; node n0 at v1 (loaded, driver Ready) chosen for v2,
    its driver's slice published."""
    cached = views.Caches(
        modules=stores.Store(
            indexers={
                caches.SELECTOR_INDEX: caches.module_selector_index,
                caches.DRIVER_INDEX: caches.module_driver_index,
            }
        ),
        daemonsets=stores.Store(indexers={caches.MODULE_INDEX: caches.object_module_index}),
        pods=stores.Store(indexers={caches.MODULE_INDEX: caches.object_module_index}),
        nodes=stores.Store(indexers={caches.MODULE_INDEX: caches.node_module_index}),
        taint_api="v1",
    )
    raw = _module()
    cached.modules.put(raw)
    extra = {
        labels.module_version("ns", "m"): "v2",
        labels.module_loader_version("ns", "m"): "v1",
        PLUGIN: "v1",
        labels.ready("ns", "m"): "",
        labels.version_ready("ns", "m"): "v1",
        labels.dra_target("ns", "m"): "",
    }
    cached.nodes.put(fixtures.node("n0", K68, extra=extra))
    ds = dra_builders.daemonset(fixtures.module(raw))
    ds["metadata"]["uid"] = "uid-ds"
    ds["metadata"]["namespace"] = "ns"
    pod = fixtures.pod(ds, "n0")
    pod["metadata"]["ownerReferences"][0]["uid"] = "uid-ds"
    cached.pods.put(pod)
    cached.slices.put(
        devicecaches.project_slice(
            {
                "metadata": {"name": "n0-gpu", "uid": "s", "resourceVersion": "1"},
                "spec": {"driver": DRIVER, "pool": {"name": "n0"}, "nodeName": "n0",
                         "devices": [{"name": "d0", "attributes": {"x": {"int": 1}}}]},
            }
        )
    )  # fmt: skip
    writer = TaintWriter(cached)
    rec = reconciler.ModuleReconciler(cached, writer, now=lambda: "2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    return rec, writer, cached


def _plugin_label(cached: views.Caches) -> str | None:
    node = cached.nodes.get("n0")
    assert node is not None
    found: str | None = node["metadata"]["labels"].get(PLUGIN)
    return found


def _status(cached: views.Caches) -> dict[str, Any]:
    module = cached.modules.get("ns/m")
    assert module is not None
    found: dict[str, Any] = module["status"]
    return found


async def test_the_rule_comes_before_the_driver_leaves(world: Any) -> None:
    rec, writer, cached = world
    await rec.reconcile("ns/m")
    [(_kind, name)] = [c for c in writer.calls if c[0] == "create-rule"]
    assert writer.versions == {"v1"}
    assert _plugin_label(cached) == "v1"  # judged before the rule was seen
    assert _status(cached)["deviceTaints"]["apiVersion"] == "resource.k8s.io/v1"
    assert _status(cached)["deviceTaints"]["nodes"] == [
        {"node": "n0", "effect": "NoSchedule", "rules": [name], "rulesReady": False}
    ]
    events = [c[1] for c in writer.calls if c[0] == "event"]
    assert ("DeviceTaintRuleCreated", f"created DeviceTaintRule {name} (NoSchedule) for node n0") in events  # fmt: skip
    writer.calls.clear()
    await rec.reconcile("ns/m")
    assert _plugin_label(cached) is None
    assert not [c for c in writer.calls if c[0].endswith("-rule")]


async def test_a_refused_rule_holds_the_driver_and_degrades_the_module(world: Any) -> None:
    rec, writer, cached = world
    writer.forbid = True
    result = await rec.reconcile("ns/m")
    assert result.requeue
    await rec.reconcile("ns/m")
    assert _plugin_label(cached) == "v1"
    degraded = next(c for c in _status(cached)["conditions"] if c["type"] == conditions.DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", taintrules.REASON_REFUSED)
    assert "the API server refused DeviceTaintRule" in degraded["message"]


async def test_the_finalizer_and_a_gone_modules_reconcile_remove_its_rules(world: Any) -> None:
    rec, writer, cached = world
    await rec.reconcile("ns/m")
    assert len(cached.taint_rules) == 1
    module = cached.modules.get("ns/m")
    module["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    await rec.reconcile("ns/m")  # the DRA DaemonSet goes first; its pod is left
    assert len(cached.taint_rules) == 1
    cached.pods.delete(next(iter(cached.pods.list_keys())))
    await rec.reconcile("ns/m")
    assert len(cached.taint_rules) == 0
    assert ("finalizers", []) in writer.calls

    # A rule left by a Module gone from the cache (its finalizer removed by
    # hand), as the rule informer's first list at operator start shows it.
    left = {
        "metadata": {
            "name": "left",
            "uid": "u-left",
            "labels": {**labels.module_labels("ns", "gone", "dra"), labels.MODULE_UID: "u0"},
        }
    }
    unstamped = copy.deepcopy(left)
    unstamped["metadata"]["name"] = "unstamped"
    del unstamped["metadata"]["labels"][labels.MODULE_UID]
    cached.taint_rules.put(left)
    cached.taint_rules.put(unstamped)
    assert caches.object_module_index(left) == ("ns/gone",)
    writer.calls.clear()
    await rec.reconcile("ns/gone")
    assert writer.calls == [("delete-rule", "left")]


async def test_without_the_api_the_upgrade_goes_on_and_the_status_says_why(world: Any) -> None:
    rec, writer, cached = world
    rec.caches = cached = views.Caches(**{**cached.__dict__, "taint_api": None})
    await rec.reconcile("ns/m")
    assert not [c for c in writer.calls if c[0].endswith("-rule")]
    assert _plugin_label(cached) is None
    assert _status(cached)["deviceTaints"] == {"message": deviceapis.NOT_SERVED}
    degraded = next(c for c in _status(cached)["conditions"] if c["type"] == conditions.DEGRADED)
    assert degraded["status"] == "False"


async def test_another_modules_driver_of_the_same_name_on_the_node_taints_nothing(
    world: Any,
) -> None:
    """Read from the caches (``views.read``): a second Module naming the same
    driver runs a DRA pod on n0, counted as its own (its DaemonSet, its uid)."""
    rec, writer, cached = world
    other = fixtures.module_raw(
        name="m2", dra={"driverName": DRIVER, "container": {"image": "r.io/d:1"}}
    )
    other["metadata"]["uid"] = "uid-2"
    cached.modules.put(other)
    ds = dra_builders.daemonset(fixtures.module(other))
    ds["metadata"]["uid"] = "uid-ds-2"
    ds["metadata"]["ownerReferences"] = [{"uid": "uid-2", "controller": True}]
    cached.daemonsets.put(ds)
    cached.pods.put(fixtures.pod(ds, "n0"))
    await rec.reconcile("ns/m")
    assert not [c for c in writer.calls if c[0].endswith("-rule")]
    [node] = _status(cached)["deviceTaints"]["nodes"]
    assert node["message"].startswith("devices not tainted: Module ns/m2 also runs a DRA driver")
    assert _plugin_label(cached) is None  # the upgrade goes on as without taints
