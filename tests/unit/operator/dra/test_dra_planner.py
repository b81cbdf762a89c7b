"""The DRA planner, its builders, and the reconciler's DeviceClass writes."""

from __future__ import annotations

import copy
from typing import Any

import operator_fixtures as fixtures
import pytest
from test_operator_reconciler import RecordingWriter

from kmm.api import conditions, labels, scheduling
from kmm.kube import errors
from kmm.operator import caches, objects, reconciler, status, views
from kmm.operator.dra import builders as dra_builders
from kmm.operator.dra import planner as dra_planner
from kmm.operator.loader import planner as loader_planner
from kmm.runtime import stores

K68, K61, KEL9 = fixtures.KERNELS
DRIVER = "gpu.example.com"
TARGET = labels.dra_target("ns", "m")
READY = labels.ready("ns", "m")


def _dra(**extra: Any) -> dict[str, Any]:
    return {
        "driverName": DRIVER,
        "container": {"image": "r.io/driver:1", "env": [{"name": "LOG", "value": "2"}]},
        "deviceClasses": [{"name": "gpu.example.com"}],
        **extra,
    }


def _module(loader: bool = True, version: str | None = None, **dra_extra: Any) -> Any:
    raw = fixtures.module_raw(dra=_dra(**dra_extra))
    if not loader:
        del raw["spec"]["moduleLoader"]
    elif version is not None:
        raw["spec"]["moduleLoader"]["container"]["version"] = version
    return fixtures.module(raw)


def _claim(node: str, *, reserved: bool = True, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "metadata": {"name": f"claim-{node}", "namespace": "work"},
        "status": {
            "allocation": {
                "devices": {"results": [{"driver": driver, "pool": node, "device": "d0"}]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}] if reserved else [],
        },
    }


def _plan(module: Any, nodes: list[dict], **kwargs: Any) -> dra_planner.DraPlan:
    seen = fixtures.view(
        module, nodes, **{k: v for k, v in kwargs.items() if k in ("daemonsets", "pods")}
    )
    seen = type(seen)(
        **{
            **seen.__dict__,
            "claims": kwargs.get("claims", ()),
            "device_classes": kwargs.get("classes", {}),
            "resource_api": kwargs.get("resource_api", True),
        }
    )
    return dra_planner.plan(seen, loader_planner.plan(seen))


def test_target_label_follows_schedulability_and_claims_hold_it() -> None:
    tolerated = {"key": "gpu", "value": "busy", "effect": "NoSchedule"}
    nodes = [
        fixtures.node("free", K68),
        fixtures.node("cordoned", K68, unschedulable=True),
        fixtures.node("cordoned-was-target", K68, extra={TARGET: ""}, unschedulable=True),
        fixtures.node("held", K68, extra={TARGET: ""}, unschedulable=True),
        fixtures.node("held-not-reserved", K68, extra={TARGET: ""}, unschedulable=True),
        fixtures.node("tainted-tolerated", K68, taints=[tolerated]),
        fixtures.node(
            "no-execute", K68, extra={TARGET: ""}, taints=[{"key": "x", "effect": "NoExecute"}]
        ),
        fixtures.node("left-selector", K68, pick=False, extra={TARGET: ""}),
    ]
    raw = fixtures.module_raw(
        dra=_dra(), tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    )
    found = _plan(
        fixtures.module(raw),
        nodes,
        claims=[
            _claim("held"),
            _claim("held-not-reserved", reserved=False),
            _claim("free", driver="other"),
        ],
    )
    wanted = {n: v[TARGET] for n, v in found.labels.items() if TARGET in v}
    assert wanted == {
        "free": "",
        "cordoned": None,
        "cordoned-was-target": None,
        "tainted-tolerated": "",
        "no-execute": None,
        "held-not-reserved": None,
    }
    assert found.held == {"held": ["work/claim-held"]}
    assert "left-selector" not in wanted  # not visited: keeps its label


def test_without_spec_dra_everything_of_it_goes() -> None:
    module = fixtures.module(fixtures.module_raw())
    with_dra = _module()
    ds = dra_builders.daemonset(with_dra)
    ours = dra_builders.device_class(with_dra, with_dra.spec.dra.device_classes[0])
    nodes = [fixtures.node("n0", K68, extra={TARGET: "", labels.dra_ready("ns", "m"): ""})]
    found = _plan(module, nodes, daemonsets=[ds], classes={"gpu.example.com": ours})
    assert found.delete == [ds["metadata"]["name"]]
    assert found.classes_delete == ["gpu.example.com"]
    assert found.labels["n0"] == {TARGET: None, labels.dra_ready("ns", "m"): None}
    assert not found.enabled


def test_device_classes_created_updated_and_never_taken_over() -> None:
    module = _module(
        deviceClasses=[
            {"name": "gpu.example.com"},
            {"name": "taken.example.com"},
            {"name": "changed.example.com", "selectors": [{"cel": {"expression": "true"}}]},
        ]
    )
    stale = dra_builders.device_class(module, module.spec.dra.device_classes[2])
    stale = copy.deepcopy(stale)
    stale["metadata"]["annotations"][labels.SPEC_HASH] = "old"
    foreign = {"metadata": {"name": "taken.example.com", "labels": {"team": "x"}}}
    stamped = {**labels.module_labels("ns", "m", "dra"), labels.MODULE_UID: "uid-1"}
    gone = {"metadata": {"name": "old.example.com", "labels": stamped}}
    found = _plan(
        module,
        [fixtures.node("n0", K68)],
        classes={c["metadata"]["name"]: c for c in (stale, foreign, gone)},
    )
    sent = {c["metadata"]["name"]: c for c in found.classes_apply}
    assert set(sent) == {"gpu.example.com", "changed.example.com"}
    # A class listed without selectors selects the Module's driver.
    assert sent["gpu.example.com"]["spec"]["selectors"] == [
        {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
    ]
    assert sent["gpu.example.com"]["metadata"]["labels"] == stamped
    assert found.classes_delete == ["old.example.com"]
    assert "not kmm" in found.conflicts["taken.example.com"]


def test_a_device_class_is_the_modules_by_its_uid_not_its_name_labels() -> None:
    """Labels naming the Module are not enough: a class with another uid (an
    earlier Module of that name, or anyone's labelling) is never updated nor
    deleted; one without any uid label (kmm before uids) is updated when
    listed (which stamps it) and never deleted."""
    module = _module(
        deviceClasses=[{"name": "earlier.example.com"}, {"name": "legacy.example.com"}]
    )
    named = labels.module_labels("ns", "m", "dra")
    earlier = {
        "metadata": {"name": "earlier.example.com", "labels": {**named, labels.MODULE_UID: "uid-0"}}
    }
    legacy = {"metadata": {"name": "legacy.example.com", "labels": dict(named)}}
    other = {
        "metadata": {"name": "other.example.com", "labels": {**named, labels.MODULE_UID: "uid-0"}}
    }
    unlisted = {"metadata": {"name": "unlisted.example.com", "labels": dict(named)}}
    found = _plan(
        module,
        [fixtures.node("n0", K68)],
        classes={c["metadata"]["name"]: c for c in (earlier, legacy, other, unlisted)},
    )
    assert [c["metadata"]["name"] for c in found.classes_apply] == ["legacy.example.com"]
    assert found.classes_apply[0]["metadata"]["labels"][labels.MODULE_UID] == "uid-1"
    assert found.classes_delete == []
    assert found.conflicts == {
        "earlier.example.com": "DeviceClass earlier.example.com exists and belongs to another "
        "Module ns/m (uid uid-0), not this one; delete it if that Module is gone"
    }


def test_no_class_writes_without_the_resource_api() -> None:
    found = _plan(_module(), [fixtures.node("n0", K68)], resource_api=False)
    assert found.classes_apply == []
    assert found.apply  # the DaemonSet still goes


def test_daemonset_carries_what_driver_images_expect() -> None:
    module = _module(volumes=[{"name": "dri", "hostPath": {"path": "/dev/dri"}}])
    ds = dra_builders.daemonset(module)
    pod = ds["spec"]["template"]["spec"]
    container = pod["containers"][0]
    names = [e["name"] for e in container["env"]]
    assert names == [
        "NODE_NAME",
        "POD_UID",
        "DRIVER_NAME",
        "CDI_ROOT",
        "KUBELET_REGISTRAR_DIRECTORY_PATH",
        "KUBELET_PLUGINS_DIRECTORY_PATH",
        "HEALTHCHECK_PORT",
        "KMM_MODULE_NAME",
        "LOG",  # the user's, after ours
    ]
    assert container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert container["env"][1]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert container["env"][2]["value"] == DRIVER
    # The module the driver watches: the loader's moduleName, as modprobe names it.
    assert container["env"][7] == {"name": "KMM_MODULE_NAME", "value": "kmod_x"}
    assert container["securityContext"] == {"privileged": True, "runAsUser": 0}
    assert container["livenessProbe"]["grpc"] == {"port": 51515, "service": "liveness"}
    # Readiness asks the server as a whole (gRPC's empty service name).
    assert container["readinessProbe"]["grpc"] == {"port": 51515}
    host = {v["hostPath"]["path"]: v["hostPath"].get("type") for v in pod["volumes"]}
    assert host == {
        "/var/lib/kubelet/plugins": "DirectoryOrCreate",
        "/var/lib/kubelet/plugins_registry": "Directory",
        "/var/run/cdi": "DirectoryOrCreate",
        "/dev/dri": None,
    }
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {READY: "", TARGET: ""}


def test_selector_without_a_loader_and_with_a_version() -> None:
    without = dra_builders.daemonset(_module(loader=False))
    # No moduleLoader, no module name kmm knows: the driver watches no module.
    env = without["spec"]["template"]["spec"]["containers"][0]["env"]
    assert "KMM_MODULE_NAME" not in [e["name"] for e in env]
    # The target label gates a loader-less driver too: it is what cordon removes.
    assert without["spec"]["template"]["spec"]["nodeSelector"] == {"pick": "yes", TARGET: ""}
    # The same name either way: adding or removing moduleLoader updates one DaemonSet.
    assert without["metadata"]["name"] == dra_builders.daemonset(_module())["metadata"]["name"]
    versioned = dra_builders.daemonset(_module(version="v2"))
    assert versioned["spec"]["template"]["spec"]["nodeSelector"] == {
        READY: "",
        TARGET: "",
        labels.device_plugin_version("ns", "m"): "v2",
    }
    assert versioned["metadata"]["labels"][labels.MODULE_VERSION] == "v2"


def test_an_unversioned_daemonset_goes_when_a_versioned_loader_arrives() -> None:
    old = dra_builders.daemonset(_module(loader=False))
    old["status"] = {"desiredNumberScheduled": 2}
    older_version = dra_builders.daemonset(_module(version="v1"))
    older_version["status"] = {"desiredNumberScheduled": 1}
    found = _plan(
        _module(version="v2"), [fixtures.node("n0", K68)], daemonsets=[old, older_version]
    )
    assert found.delete == [old["metadata"]["name"]]
    assert older_version in found.current  # a node still runs v1


def test_node_selector_matching() -> None:
    node = fixtures.node("n0", K68, extra={"zone": "a", "gpus": "4"})

    def term(*expressions: dict, f: tuple[dict, ...] = ()) -> dict:
        return {
            "nodeSelectorTerms": [{"matchExpressions": list(expressions), "matchFields": list(f)}]
        }

    assert scheduling.matches_node_selector(
        node, term({"key": "zone", "operator": "In", "values": ["a"]})
    )
    assert not scheduling.matches_node_selector(
        node, term({"key": "zone", "operator": "NotIn", "values": ["a"]})
    )
    assert scheduling.matches_node_selector(
        node, term({"key": "gpus", "operator": "Gt", "values": ["3"]})
    )
    assert not scheduling.matches_node_selector(node, term({"key": "x", "operator": "Exists"}))
    assert not scheduling.matches_node_selector(node, {"nodeSelectorTerms": [{}]})
    assert scheduling.matches_node_selector(
        node, term(f=({"key": "metadata.name", "operator": "In", "values": ["n0"]},))
    )


class DraWriter(RecordingWriter):
    """The recording writer with DeviceClasses; ``refuse`` makes the API server say 422."""

    def __init__(self, cached: views.Caches) -> None:
        super().__init__(cached)
        self.refuse: set[str] = set()
        self.forbid: set[str] = set()  # 403 instead (an admission policy)

    async def create_device_class(self, desired: dict) -> bool:
        name = desired["metadata"]["name"]
        self.calls.append(("create-class", name))
        if name in self.refuse:
            raise errors.Invalid(422, f'DeviceClass.resource.k8s.io "{name}" is invalid: bad CEL')
        if name in self.forbid:
            raise errors.Forbidden(
                403, f'deviceclasses "{name}" is forbidden: denied by policy', reason="Forbidden"
            )
        created = copy.deepcopy(desired)
        created["metadata"]["uid"] = f"uid-class-{name}"
        self.cached.device_classes.put(created)
        return True

    async def apply_device_class(self, desired: dict, observed: dict) -> bool:
        self.calls.append(("apply-class", desired["metadata"]["name"]))
        applied = copy.deepcopy(desired)
        applied["metadata"]["uid"] = observed["metadata"]["uid"]
        self.cached.device_classes.put(applied)
        return True

    async def delete_device_class(self, name: str, observed: dict) -> bool:
        assert observed["metadata"]["uid"], "a delete is guarded by the observed uid"
        self.calls.append(("delete-class", name))
        self.cached.device_classes.delete(name)
        return True


@pytest.fixture
def dra_world() -> tuple[reconciler.ModuleReconciler, DraWriter, views.Caches]:
    cached = views.Caches(
        modules=stores.Store(indexers={caches.SELECTOR_INDEX: caches.module_selector_index}),
        daemonsets=stores.Store(indexers={caches.MODULE_INDEX: caches.object_module_index}),
        pods=stores.Store(indexers={caches.MODULE_INDEX: caches.object_module_index}),
        nodes=stores.Store(indexers={caches.MODULE_INDEX: caches.node_module_index}),
    )
    for node in (fixtures.node("n0", K68), fixtures.node("n1", K61)):
        cached.nodes.put(node)
    writer = DraWriter(cached)
    rec = reconciler.ModuleReconciler(cached, writer, now=lambda: "2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    return rec, writer, cached


def _condition(cached: views.Caches, type_: str) -> dict[str, Any]:
    module = cached.modules.get("ns/m")
    assert module is not None
    return next(c for c in module["status"]["conditions"] if c["type"] == type_)


async def _converge(rec: reconciler.ModuleReconciler, cached: views.Caches) -> None:
    await rec.reconcile("ns/m")
    for ds in cached.daemonsets.objects():
        role = ds["metadata"]["labels"][labels.ROLE]
        if role == "module-loader":
            node = "n0" if ds["metadata"]["labels"][labels.KERNEL_VERSION_FULL] == K68 else "n1"
            cached.pods.put(fixtures.pod(ds, node))
    await rec.reconcile("ns/m")
    for ds in cached.daemonsets.objects():
        if ds["metadata"]["labels"][labels.ROLE] == "dra":
            for node in ("n0", "n1"):
                cached.pods.put(fixtures.pod(ds, node))
    await rec.reconcile("ns/m")


async def test_dra_module_converges_then_writes_nothing_and_cleans_up(dra_world: Any) -> None:
    rec, writer, cached = dra_world
    cached.modules.put(fixtures.module_raw(dra=_dra()))
    await _converge(rec, cached)
    assert ("create-class", "gpu.example.com") in writer.calls
    ready = _condition(cached, conditions.READY)
    assert ready["status"] == "True", ready
    assert "2/2 DRA drivers ready" in ready["message"]
    module = cached.modules.get("ns/m")
    assert module["status"]["dra"]["nodesMatchingSelectorNumber"] == 2
    for name in ("n0", "n1"):
        node_labels = cached.nodes.get(name)["metadata"]["labels"]
        assert {TARGET, READY, labels.dra_ready("ns", "m")} <= set(node_labels)

    writer.calls.clear()
    await rec.reconcile("ns/m")
    assert writer.calls == []

    module["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    # The DRA driver's pods go first, then the loader's (they unload on
    # their way out); only then the DeviceClass and the labels.
    for role in ("dra", "module-loader"):
        await rec.reconcile("ns/m")
        assert ("delete-class", "gpu.example.com") not in writer.calls
        assert any(READY in n["metadata"]["labels"] for n in cached.nodes.objects())
        for pod in cached.pods.objects():
            if pod["metadata"]["labels"][labels.ROLE] == role:
                cached.pods.delete(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
    await rec.reconcile("ns/m")
    assert ("delete-class", "gpu.example.com") in writer.calls
    assert cached.device_classes.objects() == []
    assert not any(TARGET in n["metadata"]["labels"] for n in cached.nodes.objects())


async def test_only_classes_stamped_with_the_modules_uid_are_deleted(dra_world: Any) -> None:
    """Of the classes labelled ``ns/m``, the live Module deletes only its own
    (its uid) it no longer lists; gone from the cache without its finalizer,
    its key's stamped classes go, and an unstamped one (kmm before uids, or
    anyone's) is never deleted."""
    rec, writer, cached = dra_world
    cached.modules.put(fixtures.module_raw(dra=_dra()))
    await _converge(rec, cached)
    named = labels.module_labels("ns", "m", "dra")
    for name, uid in (("earlier", "uid-0"), ("legacy", None), ("unlisted", "uid-1")):
        stamp = {labels.MODULE_UID: uid} if uid else {}
        cached.device_classes.put({"metadata": {"name": f"{name}.example.com", "uid": f"u-{name}", "labels": {**named, **stamp}}})  # fmt: skip
    writer.calls.clear()
    await rec.reconcile("ns/m")
    assert [c for c in writer.calls if c[0] == "delete-class"] == [
        ("delete-class", "unlisted.example.com")
    ]
    cached.modules.delete("ns/m")
    writer.calls.clear()
    await rec.reconcile("ns/m")
    assert sorted(c[1] for c in writer.calls if c[0] == "delete-class") == [
        "earlier.example.com",
        "gpu.example.com",
    ]
    assert [c["metadata"]["name"] for c in cached.device_classes.objects()] == [
        "legacy.example.com"
    ]


async def test_a_refused_device_class_is_reported_once_and_not_resent(dra_world: Any) -> None:
    rec, writer, cached = dra_world
    writer.refuse.add("gpu.example.com")
    cached.modules.put(fixtures.module_raw(dra=_dra()))
    await rec.reconcile("ns/m")
    degraded = _condition(cached, conditions.DEGRADED)
    assert degraded["reason"] == conditions.REASON_DEVICE_CLASS_REFUSED
    assert degraded["message"].startswith("spec.dra.deviceClasses[0]: the API server refused")
    assert "bad CEL" in degraded["message"]
    assert _condition(cached, conditions.READY)["status"] == "False"
    writer.calls.clear()
    await rec.reconcile("ns/m")
    assert ("create-class", "gpu.example.com") not in writer.calls
    # Fixed by the user: sent again.
    writer.refuse.clear()
    raw = copy.deepcopy(cached.modules.get("ns/m"))
    raw["spec"]["dra"]["deviceClasses"][0]["selectors"] = [{"cel": {"expression": "true"}}]
    cached.modules.put(raw)
    await rec.reconcile("ns/m")
    assert ("create-class", "gpu.example.com") in writer.calls
    assert _condition(cached, conditions.DEGRADED)["status"] == "False"


async def test_a_forbidden_device_class_is_shown_retried_and_the_rest_goes(
    dra_world: Any,
) -> None:
    """A 403 (an admission policy, a quota) may pass without the Module
    changing: shown, told once, and sent again on the key's backoff; the
    driver's DaemonSet and labels go meanwhile."""
    rec, writer, cached = dra_world
    writer.forbid.add("gpu.example.com")
    cached.modules.put(fixtures.module_raw(dra=_dra()))
    for _ in range(3):
        result = await rec.reconcile("ns/m")
        assert result.requeue
    assert writer.calls.count(("create-class", "gpu.example.com")) == 3
    degraded = _condition(cached, conditions.DEGRADED)
    assert degraded["reason"] == conditions.REASON_DEVICE_CLASS_REFUSED
    assert degraded["message"] == (
        "spec.dra.deviceClasses[0]: the API server refused DeviceClass gpu.example.com: "
        '403 Forbidden: deviceclasses "gpu.example.com" is forbidden: denied by policy'
    )
    told = [c[1] for c in writer.calls if c[0] == "event" and c[1][0] == "DeviceClassRefused"]
    assert told == [("DeviceClassRefused", degraded["message"])]
    assert any(
        labels.KERNEL_VERSION_FULL in n["metadata"]["labels"] for n in cached.nodes.objects()
    )
    writer.forbid.clear()
    assert not (await rec.reconcile("ns/m")).requeue
    assert cached.device_classes.get("gpu.example.com") is not None


async def test_without_the_resource_api_a_dra_module_is_degraded(dra_world: Any) -> None:
    rec, writer, cached = dra_world
    rec.caches = cached = views.Caches(**{**cached.__dict__, "resource_api": False})
    cached.modules.put(fixtures.module_raw(dra=_dra()))
    await rec.reconcile("ns/m")
    degraded = _condition(cached, conditions.DEGRADED)
    assert degraded["status"] == "True"
    assert degraded["reason"] == conditions.REASON_RESOURCE_API_UNAVAILABLE
    assert not any(kind.endswith("-class") for kind in writer.kinds())


def test_status_problems_make_ready_false() -> None:
    seen = status.Observed(
        selected=1, loader=None, plugin=None, targeted=1, ready=1, plugin_wanted=0,
        plugin_ready=0, mapping_errors={},
        problems=[status.Problem(conditions.REASON_DEVICE_CLASS_CONFLICT, "taken")],
    )  # fmt: skip
    new = status.compute({"metadata": {"generation": 1}}, seen, now="2026-01-01T00:00:00Z")
    found = {c.type: (c.status, c.reason) for c in new.conditions or ()}
    assert found[conditions.READY] == ("False", conditions.REASON_DEVICE_CLASS_CONFLICT)
    assert found[conditions.DEGRADED] == ("True", conditions.REASON_DEVICE_CLASS_CONFLICT)


def test_claim_and_class_events_find_their_modules() -> None:
    modules_store = stores.Store(
        indexers={
            caches.DRIVER_INDEX: caches.module_driver_index,
            caches.CLASS_INDEX: caches.module_class_index,
        }
    )
    modules_store.put(fixtures.module_raw(dra=_dra()))
    assert caches.modules_of_claim(_claim("n0"), modules_store) == ["ns/m"]
    assert caches.modules_of_claim(_claim("n0", driver="other"), modules_store) == []
    foreign = {"metadata": {"name": "gpu.example.com"}}
    assert caches.modules_of_device_class(foreign, modules_store) == ["ns/m"]
    assert objects.observed_hash(foreign) is None
