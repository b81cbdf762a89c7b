"""Device taints in an ordered upgrade of a DRA Module on a container node (issue 34, "Show").

One sandbox for the module: a container node (containerd, runc, the real
1.37 kubelet) that shows kernel module ``kmmdemo`` loaded with two devices
(``fake_modules``), kube-controller-manager with every controller (its
device-taint eviction controller among them), and the registry. The loader
image is pushed as loader:v1 and loader:v2 (its ``modprobe`` records each
call in the container's log, as in test_upgrade_in_containers), kmm's image
is the Module's DRA driver (as in test_dra_in_containers), and the workload
image runs the pods that use, or do not use, the Module's devices. The
operator runs in the test process.

What is shown, by watches ordered by resourceVersion (etcd's revision, one
order for pods, nodes, claims and DeviceTaintRules):

- opted in (``kmm.sigs.x-k8s.io/evict-device-users: "true"``), a node with a
  pod holding a claim on the Module's device and a pod using none, moved
  v1 -> v2: a NoExecute DeviceTaintRule exists before the DRA driver's
  version label goes; the device user gets the eviction controller's
  ``DisruptionTarget`` condition before its deletion begins and is deleted;
  the other pod keeps its uid and restart count; the node is never
  unschedulable; the claim is released (and its CDI spec gone: the driver
  unprepared it) before the driver's label goes and its pod is deleted; the
  v1 loader's unload comes after the driver pod is gone; v2 loads; the rule
  is deleted after the node's ``.version.ready`` shows v2; a new claim is
  then allocated on the node and its pod runs;
- not opted in: the rule is NoSchedule, the device user stays (its deletion
  is the test's own, no DisruptionTarget), the Module's
  ``status.deviceTaints`` and ``kmm upgrade --to v2`` name it as what the
  move waits on, and the move finishes once the test deletes it;
- no rule possible (marked ``compat``: on 1.35 and 1.36 the server serves
  none; on 1.37 the operator runs with ``--no-device-taints``), opted in:
  nothing tainted or evicted, the driver stays while the user's claim holds
  its device, the step and status name the user and say why, and the move
  finishes once the test deletes it.

Nothing is timed: every check is of watch events, pods, logs and the
Module's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import containersandbox
import pytest
import test_operator_support as support
import test_upgrade_in_containers as upgrades
from kubernetes_asyncio import client

from kmm.api import examples, installation, labels, modules
from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import objects, resources
from kmm.operator import deviceapis
from kmm.sandbox import addressing, cluster, testing
from kmm.sandbox.containernodes import nodes as containernodes

IMAGES = Path("build/images")
KMM_IMAGE = Path("build/kmm-image.tar")
REGISTRY = f"{addressing.GATEWAY}:{addressing.REGISTRY_PORT}"
NODE = "kmm-kubelet-0"
MODULE = examples.DRA_MODULE
SELECT = "kmm-test/taints"
LOAD = ["-v", "-d", "/opt", MODULE]
UNLOAD = ["-rv", "-d", "/opt", MODULE]
# kube-controller-manager's device-taint eviction controller (1.37,
# pkg/controller/devicetainteviction): the condition it sets before deleting.
EVICTED_BY = "DeletionByDeviceTaintManager"
# What it writes on a rule of another effect (its EvictionInProgress condition).
NOT_EVICTING = "Eviction only happens for the NoExecute effect."
RULES = resources.DEVICE_TAINT_RULES  # resource.k8s.io/v1 (1.37)
MODULES_PATH = f"/apis/{modules.GROUP}/{modules.VERSION}/namespaces/{{}}/{modules.PLURAL}"
PluginKey = Callable[[str, str], str]


@dataclasses.dataclass(frozen=True)
class Images:
    kmm: str
    workload: str


@pytest.fixture(scope="module")
def containers() -> Iterator[tuple[cluster.state.SandboxState, Images]]:
    with containersandbox.started("kt", kubelet_nodes=1, fake_modules=((MODULE, 2),)) as record:
        for version in ("v1", "v2"):
            pushed = containersandbox.push(
                record.directory, IMAGES / "loader.tar", f"loader:{version}"
            )
            assert pushed == f"{REGISTRY}/loader:{version}"
        images = Images(
            kmm=containersandbox.push(record.directory, KMM_IMAGE, "kmm/kmm:test"),
            workload=containersandbox.push(record.directory, IMAGES / "workload.tar", "workload:1"),
        )
        asyncio.run(support.install_manifests(record.kubeconfig))
        yield record, images


@pytest.fixture
async def api(
    containers: tuple[cluster.state.SandboxState, Images],
) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(containers[0].kubeconfig) as found:
        yield found


@pytest.fixture
async def core(
    containers: tuple[cluster.state.SandboxState, Images],
) -> AsyncIterator[client.CoreV1Api]:
    independent = await support.independent_client(containers[0].kubeconfig)
    async with independent:
        yield client.CoreV1Api(independent)


def module_body(
    namespace: str, name: str, version: str, kernel: str, kmm_image: str, *, evict: bool
) -> dict[str, Any]:
    """The example's DRA Module (kmm's image as the driver, driver name
    ``<name>.kmm.io``) with an ordered-upgrade loader at ``version``; opted
    in to eviction when ``evict``."""
    body = examples.dra_module(name=name, namespace=namespace, selector={SELECT: "yes"})
    body["spec"]["dra"]["container"]["image"] = kmm_image
    body["spec"]["moduleLoader"] = {
        "container": {
            "version": version,
            "modprobe": {"moduleName": MODULE},
            "kernelMappings": [
                {"literal": kernel, "containerImage": f"{REGISTRY}/loader:{version}"}
            ],
        }
    }
    if evict:
        body["metadata"]["annotations"] = {labels.EVICT_DEVICE_USERS: "true"}
    return body


def claim_template(namespace: str, driver: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-device", "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "one", "exactly": {"deviceClassName": driver}}]}
            }
        },
    }


def workload(namespace: str, name: str, image: str, *, claim: bool) -> dict[str, Any]:
    """A pod of the workload image (says what it got, then waits); with
    ``claim``, holding one device of the Module's class."""
    container: dict[str, Any] = {"name": "main", "image": image}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 5, "containers": [container]}
    if claim:
        spec["resourceClaims"] = [{"name": "device", "resourceClaimTemplateName": "one-device"}]
        container["resources"] = {"claims": [{"name": "device"}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@dataclasses.dataclass(frozen=True)
class Seen:
    """One watch event (or listed item: ``LISTED``) of one kind, by revision."""

    revision: int
    kind: str
    type: str
    obj: dict[str, Any]

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"].get("uid", ""))

    def labels(self) -> dict[str, str]:
        return objects.labels(self.obj)


def disrupted(obj: dict[str, Any]) -> dict[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition["type"] == "DisruptionTarget" and condition["status"] == "True":
            return dict(condition)
    return None


def _released(seen: Seen) -> bool:
    """The claim is reserved for no pod any more (or deleted)."""
    return seen.type == "DELETED" or not (seen.obj.get("status") or {}).get("reservedFor")


def restarts(pod: dict[str, Any]) -> int:
    [status] = (pod.get("status") or {}).get("containerStatuses") or [{"restartCount": -1}]
    return int(status["restartCount"])


class Timeline:
    """Every event of the namespace's pods and ResourceClaims, the nodes and
    the DeviceTaintRules, from one list each on (etcd's revisions order them
    all); node labels are read of ``node`` (test_vm_modules follows its VM
    node); no rules followed unless ``rules``."""

    def __init__(
        self, api: kube_client.Client, namespace: str, *, node: str = NODE, rules: bool = True
    ) -> None:
        self.api, self.namespace, self.node = api, namespace, node
        self.follow_rules = rules  # False where the server serves no DeviceTaintRules
        self.seen: list[Seen] = []

    async def _stream(self, kind: str, path: str, listed: asyncio.Event) -> None:
        listing = await self.api.request("GET", path)
        for item in listing["items"]:
            self.seen.append(Seen(int(objects.resource_version(item) or 0), kind, "LISTED", item))
        version = listing["metadata"]["resourceVersion"]
        listed.set()
        while True:
            with contextlib.suppress(kube_errors.Unavailable):
                async for event in self.api.watch(path, query={"resourceVersion": version}):
                    version = objects.resource_version(event["object"]) or version
                    if event["type"] != "BOOKMARK":
                        revision = int(objects.resource_version(event["object"]) or 0)
                        self.seen.append(Seen(revision, kind, event["type"], event["object"]))

    @contextlib.asynccontextmanager
    async def recording(self) -> AsyncIterator[Timeline]:
        sources = [
            ("Pod", resources.PODS.path(self.namespace)),
            ("ResourceClaim", resources.RESOURCE_CLAIMS.path(self.namespace)),
            ("Node", resources.NODES.path()),
        ]
        if self.follow_rules:
            sources.append(("DeviceTaintRule", RULES.path()))
        listed = [asyncio.Event() for _ in sources]
        tasks = [
            asyncio.ensure_future(self._stream(kind, path, done))
            for (kind, path), done in zip(sources, listed, strict=True)
        ]
        try:

            async def lists_in() -> bool:
                for task in tasks:
                    if task.done():
                        task.result()  # a failed list fails the test here
                return all(done.is_set() for done in listed)

            await testing.eventually(lists_in, "the timeline's lists in")
            yield self
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def events(self, kind: str, *, uid: str | None = None) -> list[Seen]:
        """The events (not the listed items) of ``kind`` (of one object), by revision."""
        return sorted(
            (
                s
                for s in self.seen
                if s.kind == kind and s.type != "LISTED" and (uid is None or s.uid == uid)
            ),
            key=lambda s: s.revision,
        )

    def first(
        self, kind: str, test: Callable[[Seen], bool], *, uid: str | None = None
    ) -> int | None:
        """The revision of the first event of ``kind`` that passes ``test``."""
        return next((s.revision for s in self.events(kind, uid=uid) if test(s)), None)

    def rules(self, namespace: str, name: str) -> list[Seen]:
        """The events of the DeviceTaintRules labelled for the Module."""
        return [
            s
            for s in self.events("DeviceTaintRule")
            if s.labels().get(labels.MODULE_NAMESPACE) == namespace
            and s.labels().get(labels.MODULE_NAME) == name
        ]

    def node_label(self, key: str, value: str | None) -> int | None:
        """The first event of the node with label ``key`` at ``value`` (None: absent)."""
        return self.first(
            "Node", lambda s: objects.name(s.obj) == self.node and s.labels().get(key) == value
        )

    def deletion(self, uid: str) -> int:
        """The revision at which the pod's deletion began (its ``deletionTimestamp``)."""
        return known(
            self.first("Pod", lambda s: bool(s.obj["metadata"].get("deletionTimestamp")), uid=uid),
            f"the deletion of pod {uid}",
        )

    def gone(self, uid: str) -> int:
        return known(self.first("Pod", lambda s: s.type == "DELETED", uid=uid), f"pod {uid} gone")

    def released(self, uid: str) -> int:
        """The revision at which the claim was no longer reserved (or deleted)."""
        return known(self.first("ResourceClaim", _released, uid=uid), f"claim {uid} released")

    def unschedulable(self) -> list[Seen]:
        """The node states seen cordoned, the listed one included."""
        return [s for s in self.seen if s.kind == "Node" and s.obj["spec"].get("unschedulable")]

    def story(self, namespace: str, name: str) -> list[str]:
        """What happened, one line per change the test looks at, by revision."""
        keys = {
            labels.module_version(namespace, name): "user version",
            labels.module_loader_version(namespace, name): "loader version",
            labels.device_plugin_version(namespace, name): "driver version",
            labels.ready(namespace, name): ".ready",
            labels.version_ready(namespace, name): ".version.ready",
        }
        lines: list[tuple[int, str]] = []
        node_was: dict[tuple[str, str], str | None] = {}  # (node, key)
        pod_was: dict[str, tuple[bool, bool]] = {}
        claim_was: dict[str, bool] = {}
        rule_was: dict[str, tuple[str, str]] = {}
        for seen in sorted(self.seen, key=lambda s: (s.revision, s.kind)):
            what = f"{seen.kind} {objects.name(seen.obj)}"
            if seen.kind == "Node":
                for key, said in keys.items():
                    value = seen.labels().get(key)
                    was = (objects.name(seen.obj), key)
                    if seen.type != "LISTED" and node_was.get(was, "?") != value:
                        shown = "(removed)" if value is None else value or "(set)"
                        lines.append((seen.revision, f"{what}: {said} {shown}"))
                    node_was[was] = value
                if seen.obj["spec"].get("unschedulable"):
                    lines.append((seen.revision, f"{what}: UNSCHEDULABLE"))
            elif seen.kind == "Pod":
                role = seen.labels().get(labels.ROLE, "workload")
                version = seen.labels().get(labels.MODULE_VERSION, "")
                what = f"{what} ({role} {version})".replace(" )", ")")
                state = (
                    bool(seen.obj["metadata"].get("deletionTimestamp")),
                    disrupted(seen.obj) is not None,
                )
                if seen.type in ("ADDED", "DELETED"):
                    lines.append((seen.revision, f"{what}: {seen.type}"))
                elif seen.type == "MODIFIED" and pod_was.get(seen.uid) != state:
                    if state[1] and not pod_was.get(seen.uid, (False, False))[1]:
                        reason = (disrupted(seen.obj) or {}).get("reason")
                        lines.append((seen.revision, f"{what}: DisruptionTarget ({reason})"))
                    if state[0] and not pod_was.get(seen.uid, (False, False))[0]:
                        lines.append((seen.revision, f"{what}: deletion begins"))
                pod_was[seen.uid] = state
            elif seen.kind == "ResourceClaim":
                reserved = bool((seen.obj.get("status") or {}).get("reservedFor"))
                if seen.type in ("ADDED", "DELETED"):
                    lines.append((seen.revision, f"{what}: {seen.type}"))
                elif seen.type == "MODIFIED" and claim_was.get(seen.uid) != reserved:
                    lines.append(
                        (seen.revision, f"{what}: {'reserved' if reserved else 'released'}")
                    )
                claim_was[seen.uid] = reserved
            elif seen.kind == "DeviceTaintRule" and seen.type != "LISTED":
                effect = seen.obj["spec"]["taint"]["effect"]
                eviction = next(
                    (
                        f"{c.get('reason')} {c.get('message') or ''}".strip()
                        for c in (seen.obj.get("status") or {}).get("conditions") or ()
                        if c.get("type") == "EvictionInProgress"
                    ),
                    "",
                )
                if seen.type != "MODIFIED" or rule_was.get(seen.uid) != (effect, eviction):
                    said = f"{effect}" + (f", EvictionInProgress {eviction}" if eviction else "")
                    lines.append((seen.revision, f"{what}: {seen.type} ({said})"))
                rule_was[seen.uid] = (effect, eviction)
        return [f"{revision} {line}" for revision, line in lines]


async def _get(api: kube_client.Client, path: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = await api.request("GET", path)
    except kube_errors.NotFound:
        return None
    return found


async def running_workload(
    api: kube_client.Client, namespace: str, name: str, *, what: str
) -> dict[str, Any]:
    """The pod once it runs and its log says it is ready."""
    found: dict[str, Any] = {}

    async def said_ready() -> bool:
        pod = await _get(api, resources.PODS.path(namespace, name))
        if ((pod or {}).get("status") or {}).get("phase") != "Running":
            return False
        found["pod"] = pod
        return "KMM-WORKLOAD ready" in await upgrades.read_log(api, namespace, name)

    await testing.eventually(said_ready, what, bound=180)
    return found["pod"]


async def wait_version(api: kube_client.Client, namespace: str, name: str, version: str) -> None:
    key = labels.version_ready(namespace, name)

    async def there() -> bool:
        found = await api.request("GET", resources.NODES.path(name=NODE))
        return bool(objects.labels(found).get(key) == version)

    await testing.eventually(there, f"{NODE} on {version}", bound=300)


async def published_pool(api: kube_client.Client, driver: str) -> str:
    """The pool of the driver's slice for the node, once it lists both devices."""
    found: dict[str, Any] = {}

    async def published() -> bool:
        listing = await api.request(
            "GET",
            resources.RESOURCE_SLICES.path(),
            query={"fieldSelector": f"spec.nodeName={NODE},spec.driver={driver}"},
        )
        devices = sorted(d["name"] for s in listing["items"] for d in s["spec"]["devices"])
        if devices != [f"{MODULE}0", f"{MODULE}1"]:
            return False
        found["pool"] = listing["items"][0]["spec"]["pool"]["name"]
        return True

    await testing.eventually(published, f"both devices in {driver}'s ResourceSlice", bound=180)
    return str(found["pool"])


def known(revision: int | None, what: str) -> int:
    """A revision the timeline must have seen."""
    assert revision is not None, f"never seen: {what}"
    return revision


def claim_name(pod: dict[str, Any]) -> str:
    return str(pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"])


@dataclasses.dataclass(frozen=True)
class AtV1:
    namespace: str
    name: str
    driver: str
    kernel: str
    pool: str
    loader: upgrades.LoaderPod
    dra: upgrades.LoaderPod


@contextlib.asynccontextmanager
async def dra_module_at_v1(
    api: kube_client.Client, images: Images, name: str, *, evict: bool
) -> AsyncIterator[AtV1]:
    """A namespace of its own, the driver's RBAC, and the DRA Module at v1
    loaded on the node with its driver Ready and publishing (an operator
    must run). Afterwards: the namespace's pods deleted, the Module deleted
    (waited for: its finalizer is the operator's), the node's labels off."""
    namespace = f"taints-{uuid.uuid4().hex[:6]}"
    await api.request("POST", resources.NAMESPACES.path(), body={"metadata": {"name": namespace}})
    kernel = await upgrades.node_kernel(api, NODE)
    body = module_body(namespace, name, "v1", kernel, images.kmm, evict=evict)
    driver = body["spec"]["dra"]["driverName"]
    module_path = MODULES_PATH.format(namespace) + f"/{name}"
    try:
        await applying.apply_documents(api, installation.dra_driver_rbac(namespace))
        await upgrades.set_node_label(api, NODE, SELECT, "yes")
        await api.request("POST", MODULES_PATH.format(namespace), body=body)
        await upgrades.set_node_label(api, NODE, labels.module_version(namespace, name), "v1")
        await wait_version(api, namespace, name, "v1")
        loader = await upgrades.loader_pod(api, namespace, NODE)
        dra = await upgrades.loader_pod(api, namespace, NODE, "dra")
        assert (loader.version, dra.version) == ("v1", "v1")
        logged = upgrades.calls(await upgrades.read_log(api, namespace, loader.name))
        assert [c.argv for c in logged] == [LOAD]
        pool = await published_pool(api, driver)
        await applying.apply_documents(api, [claim_template(namespace, driver)])
        yield AtV1(namespace, name, driver, kernel, pool, loader, dra)
    finally:
        listing = await api.request("GET", resources.PODS.path(namespace))
        for pod in listing["items"]:
            if labels.ROLE not in objects.labels(pod):
                with contextlib.suppress(kube_errors.NotFound):
                    await api.request("DELETE", resources.PODS.path(namespace, objects.name(pod)))

        async def workloads_gone() -> bool:
            found = await api.request("GET", resources.PODS.path(namespace))
            return not [p for p in found["items"] if labels.ROLE not in objects.labels(p)]

        await testing.eventually(workloads_gone, "the workloads gone", bound=120)
        with contextlib.suppress(kube_errors.NotFound):
            await api.request("DELETE", module_path)

        async def module_gone() -> bool:
            return await _get(api, module_path) is None

        await testing.eventually(module_gone, "the Module deleted", bound=300)
        await upgrades.set_node_label(api, NODE, labels.module_version(namespace, name), None)
        await upgrades.set_node_label(api, NODE, SELECT, None)
        await api.request("DELETE", resources.NAMESPACES.path(name=namespace))


async def to_v2(api: kube_client.Client, at: AtV1, images: Images, *, evict: bool) -> None:
    """The Module's spec moved to v2 (the node's user label not yet)."""
    spec = module_body(at.namespace, at.name, "v2", at.kernel, images.kmm, evict=evict)["spec"]
    await api.request(
        "PATCH",
        MODULES_PATH.format(at.namespace) + f"/{at.name}",
        body={"spec": spec},
        content_type=upgrades.MERGE,
    )


def _cdi_specs(containers: cluster.state.SandboxState) -> list[str]:
    node = containernodes.load(containers.directory / "kubelets" / "0")
    assert node is not None
    return [p.name for p in node.source("/var/run/cdi").iterdir()]


async def _events_of(api: kube_client.Client, namespace: str, name: str) -> list[tuple[str, str]]:
    found = await api.request(
        "GET",
        resources.EVENTS.path(namespace),
        query={"fieldSelector": f"involvedObject.name={name}"},
    )
    return sorted((e.get("reason", ""), e.get("message", "")) for e in found["items"])


async def test_opted_in_an_upgrade_evicts_exactly_the_device_user_and_loads_v2(
    containers: tuple[cluster.state.SandboxState, Images],
    api: kube_client.Client,
    core: client.CoreV1Api,
) -> None:
    record, images = containers
    name = "evict"
    async with (
        support.operator_in_process(record.kubeconfig) as running,
        dra_module_at_v1(api, images, name, evict=True) as at,
    ):
        ns = at.namespace
        for pod, holds in (("user", True), ("bystander", False)):
            await api.request(
                "POST",
                resources.PODS.path(ns),
                body=workload(ns, pod, images.workload, claim=holds),
            )
        user = await running_workload(api, ns, "user", what="the device user running")
        bystander = await running_workload(api, ns, "bystander", what="the other pod running")
        assert user["spec"]["nodeName"] == bystander["spec"]["nodeName"] == NODE
        claim = await api.request("GET", resources.RESOURCE_CLAIMS.path(ns, claim_name(user)))
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (at.driver, at.pool)
        assert any(claim["metadata"]["uid"] in spec for spec in _cdi_specs(record))
        await to_v2(api, at, images, evict=True)

        timeline = Timeline(api, ns)
        try:
            async with timeline.recording():
                followed = await upgrades.follow_log(core, ns, at.loader.name)
                try:
                    await upgrades.set_node_label(api, NODE, labels.module_version(ns, name), "v2")
                    await wait_version(api, ns, name, "v2")
                    old_calls = upgrades.calls(await asyncio.wait_for(followed, 300))
                finally:
                    followed.cancel()
                    await asyncio.gather(followed, return_exceptions=True)

                async def rule_gone() -> bool:
                    return any(s.type == "DELETED" for s in timeline.rules(ns, name))

                await testing.eventually(rule_gone, "the rule's deletion seen", bound=120)
                await _opted_in_order(timeline, at, user, bystander, claim, old_calls)
                assert not any(claim["metadata"]["uid"] in s for s in _cdi_specs(record))

                # The other pod was left alone: same pod, same container.
                still = await _get(api, resources.PODS.path(ns, "bystander"))
                assert still is not None
                assert still["metadata"]["uid"] == bystander["metadata"]["uid"]
                assert restarts(still) == restarts(bystander) == 0
                assert await _get(api, resources.PODS.path(ns, "user")) is None

                # v2 loaded, the driver of v2 publishing again, no rule left.
                new = await upgrades.loader_pod(api, ns, NODE)
                assert new.version == "v2"
                new_calls = upgrades.calls(await upgrades.read_log(api, ns, new.name))
                assert [c.argv for c in new_calls] == [LOAD]
                assert (await upgrades.loader_pod(api, ns, NODE, "dra")).version == "v2"
                listing = await api.request("GET", RULES.path())
                assert listing["items"] == []

                # A new claim gets the node's device again.
                await api.request(
                    "POST",
                    resources.PODS.path(ns),
                    body=workload(ns, "again", images.workload, claim=True),
                )
                again = await running_workload(api, ns, "again", what="a new device user runs")
                assert again["spec"]["nodeName"] == NODE
                claim = await api.request(
                    "GET", resources.RESOURCE_CLAIMS.path(ns, claim_name(again))
                )
                [result] = claim["status"]["allocation"]["devices"]["results"]
                assert (result["driver"], result["pool"]) == (at.driver, at.pool)
        finally:
            print(f"\neviction timeline ({ns}/{name}):", *timeline.story(ns, name), sep="\n  ")

        # The eviction controller said so on the pod.
        async def told() -> bool:
            return ("DeviceTaintManagerEviction", "Marking for deletion") in await _events_of(
                api, ns, "user"
            )

        await testing.eventually(told, "the eviction controller's event on the pod")
        module_events = await _events_of(api, ns, name)
        [rule_name] = {objects.name(s.obj) for s in timeline.rules(ns, name)}
        assert (
            "DeviceTaintRuleCreated",
            f"created DeviceTaintRule {rule_name} (NoExecute) for node {NODE}",
        ) in module_events, module_events
        assert ("DeviceTaintRuleDeleted", f"deleted DeviceTaintRule {rule_name}") in module_events
        await running.wait_idle("settled")


async def _opted_in_order(
    timeline: Timeline,
    at: AtV1,
    user: dict[str, Any],
    bystander: dict[str, Any],
    claim: dict[str, Any],
    old_calls: list[upgrades.Call],
) -> None:
    """The order of the opted-in move, by revision."""
    ns, name = at.namespace, at.name
    user_uid = user["metadata"]["uid"]

    # The watches caught up with the end of the move.
    async def caught_up() -> bool:
        return (
            timeline.first("Pod", lambda s: s.type == "DELETED", uid=at.loader.uid) is not None
            and timeline.first("Pod", lambda s: s.type == "DELETED", uid=user_uid) is not None
            and timeline.node_label(labels.version_ready(ns, name), "v2") is not None
            and timeline.first("ResourceClaim", _released, uid=claim["metadata"]["uid"]) is not None
        )

    await testing.eventually(caught_up, "the timeline caught up")
    rules = timeline.rules(ns, name)
    added = [s for s in rules if s.type == "ADDED"]
    assert len(added) == 1, rules
    [rule] = added
    # One rule for the node's whole pool, NoExecute from its creation on.
    assert rule.obj["spec"]["deviceSelector"] == {"driver": at.driver, "pool": at.pool}
    assert rule.obj["metadata"]["annotations"][labels.TAINTED_NODE] == NODE
    assert {s.obj["spec"]["taint"]["effect"] for s in rules} == {"NoExecute"}
    [rule_deleted] = [s.revision for s in rules if s.type == "DELETED"]

    # Evicted by the eviction controller: its DisruptionTarget condition
    # (seen by the watch before the pod was gone) before the deletion began.
    disrupted_at = timeline.first("Pod", lambda s: disrupted(s.obj) is not None, uid=user_uid)
    assert disrupted_at is not None, timeline.events("Pod", uid=user_uid)
    reasons = {
        (disrupted(s.obj) or {}).get("reason")
        for s in timeline.events("Pod", uid=user_uid)
        if disrupted(s.obj)
    }
    assert reasons == {EVICTED_BY}
    deleting = timeline.deletion(user_uid)
    assert rule.revision < disrupted_at < deleting <= timeline.gone(user_uid)

    # The other pod: no deletion, no condition, no other container.
    for seen in timeline.events("Pod", uid=bystander["metadata"]["uid"]):
        assert seen.type == "MODIFIED", seen.type
        assert not seen.obj["metadata"].get("deletionTimestamp")
        assert disrupted(seen.obj) is None
        assert restarts(seen.obj) == 0
    assert not timeline.unschedulable()

    # The claim released (reservation gone, or the claim deleted) before the
    # driver's version label went, which the rule came before; the driver
    # pod deleted after that. The release comes from the pod's final phase,
    # which the kubelet writes only once the driver unprepared the claim
    # (SyncTerminatingPod): the CDI spec's absence checks that.
    driver_off = known(
        timeline.node_label(labels.device_plugin_version(ns, name), None), "driver label off"
    )
    assert rule.revision < driver_off
    released = timeline.released(claim["metadata"]["uid"])
    driver_gone = timeline.gone(at.dra.uid)
    assert deleting < released < driver_off < timeline.deletion(at.dra.uid) <= driver_gone

    # The unload after the driver left: the loader label went once the driver
    # pod was gone, and the loader pod's deletion (its preStop) after that.
    loader_off = known(
        timeline.node_label(labels.module_loader_version(ns, name), None), "loader label off"
    )
    loader_leaving = timeline.deletion(at.loader.uid)
    assert driver_gone < loader_off < loader_leaving
    assert [c.argv for c in old_calls] == [LOAD, UNLOAD], old_calls

    # v2 ready, then the rule deleted.
    v2_ready = known(timeline.node_label(labels.version_ready(ns, name), "v2"), "v2 ready")
    assert loader_leaving < v2_ready < rule_deleted


async def test_not_opted_in_the_upgrade_waits_on_the_device_user_and_names_it(
    containers: tuple[cluster.state.SandboxState, Images],
    api: kube_client.Client,
) -> None:
    record, images = containers
    name = "hold"
    async with (
        support.operator_in_process(record.kubeconfig) as running,
        dra_module_at_v1(api, images, name, evict=False) as at,
    ):
        ns = at.namespace
        user_uid, claim = await _device_user(api, at, images)
        await to_v2(api, at, images, evict=False)
        plugin_key = labels.device_plugin_version(ns, name)

        timeline = Timeline(api, ns)
        try:
            async with timeline.recording():
                async with _upgrading_to_v2(record.kubeconfig, at) as upgrading:
                    # The Module's status names the pod the move waits on.
                    def waiting_on_it(taints: dict[str, Any]) -> bool:
                        [entry] = taints.get("nodes") or [{}]
                        return bool(entry.get("staying") and entry.get("rulesReady"))

                    taints = await _device_taints_once(api, at, waiting_on_it)
                    [rule] = [s.obj for s in timeline.rules(ns, name) if s.type == "ADDED"]
                    [entry] = taints["nodes"]
                    # The eviction controller's word, once it wrote one on the rule.
                    assert entry.pop("eviction", None) in (None, NOT_EVICTING), entry
                    assert taints == {
                        "apiVersion": "resource.k8s.io/v1",
                        "nodes": [
                            {
                                "node": NODE,
                                "effect": "NoSchedule",
                                "rules": [objects.name(rule)],
                                "rulesReady": True,
                                "staying": [f"{ns}/user"],
                            }
                        ],
                    }
                    assert rule["spec"]["deviceSelector"] == {"driver": at.driver, "pool": at.pool}
                    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
                    await _still_waiting(api, at, user_uid)

                    # The user deletes it: the move goes on.
                    deleted = await api.request("DELETE", resources.PODS.path(ns, "user"))
                    deleted_at = int(objects.resource_version(deleted) or 0)
                    said = await asyncio.wait_for(upgrading, 600)
                await wait_version(api, ns, name, "v2")

                async def rule_gone() -> bool:
                    return any(s.type == "DELETED" for s in timeline.rules(ns, name))

                await testing.eventually(rule_gone, "the rule's deletion seen", bound=120)

                await _caught_up(timeline, at, claim["metadata"]["uid"], user_uid)
        finally:
            print(f"\nwaiting timeline ({ns}/{name}):", *timeline.story(ns, name), sep="\n  ")

        # kmm upgrade said what the move waited on, then finished.
        words = " ".join(said.split())  # rich wraps lines at 200 columns
        assert (
            f"{NODE}: pod {ns}/user uses the Module's devices (NoSchedule: not evicted; "
            f'delete it, or annotate the Module {labels.EVICT_DEVICE_USERS}="true"); waiting '
            "for their claims to be released before removing the device-plugin version label"
        ) in words, said
        assert said.splitlines()[-2:] == [f"{NODE}: on v2", "1 node(s) on v2"], said

        # Nothing evicted: the pod's deletion is the test's, no condition.
        assert timeline.deletion(user_uid) == deleted_at, timeline.events("Pod", uid=user_uid)
        assert not [s for s in timeline.events("Pod", uid=user_uid) if disrupted(s.obj)]
        rules = timeline.rules(ns, name)
        assert {s.obj["spec"]["taint"]["effect"] for s in rules} == {"NoSchedule"}
        [rule_added] = [s.revision for s in rules if s.type == "ADDED"]
        [rule_deleted] = [s.revision for s in rules if s.type == "DELETED"]
        # The driver's label went only after the claim was released.
        released = timeline.released(claim["metadata"]["uid"])
        driver_off = known(timeline.node_label(plugin_key, None), "driver label off")
        v2_ready = known(timeline.node_label(labels.version_ready(ns, name), "v2"), "v2 ready")
        assert rule_added < deleted_at < released < driver_off < v2_ready < rule_deleted
        assert not timeline.unschedulable()
        await running.wait_idle("settled")


async def _device_user(
    api: kube_client.Client, at: AtV1, images: Images
) -> tuple[str, dict[str, Any]]:
    """Pod ``user`` running with a claim on one of the Module's devices: its
    uid and its claim."""
    ns = at.namespace
    await api.request(
        "POST", resources.PODS.path(ns), body=workload(ns, "user", images.workload, claim=True)
    )
    user = await running_workload(api, ns, "user", what="the device user running")
    claim = await api.request("GET", resources.RESOURCE_CLAIMS.path(ns, claim_name(user)))
    return str(user["metadata"]["uid"]), claim


@contextlib.asynccontextmanager
async def _upgrading_to_v2(kubeconfig: Path, at: AtV1) -> AsyncIterator[asyncio.Future[str]]:
    """``kmm upgrade --to v2`` of the node, running; cancelled if left unawaited."""
    upgrading = asyncio.ensure_future(
        asyncio.to_thread(
            upgrades.kmm_upgrade, kubeconfig, f"{at.namespace}/{at.name}", NODE, "--to", "v2"
        )
    )
    try:
        yield upgrading
    finally:
        upgrading.cancel()
        await asyncio.gather(upgrading, return_exceptions=True)


async def _device_taints_once(
    api: kube_client.Client, at: AtV1, ready: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The Module's ``status.deviceTaints`` once ``ready`` says so of it."""
    path = MODULES_PATH.format(at.namespace) + f"/{at.name}"
    seen: dict[str, Any] = {}

    async def there() -> bool:
        module = await _get(api, path) or {}
        seen["taints"] = (module.get("status") or {}).get("deviceTaints") or {}
        return ready(seen["taints"])

    try:
        await testing.eventually(there, "the status names the pod")
    except AssertionError as err:
        raise AssertionError(f"{err}: {seen}") from err
    return dict(seen["taints"])


async def _still_waiting(api: kube_client.Client, at: AtV1, user_uid: str) -> None:
    """While the move waits on the device user: the pod, the v1 driver and
    the driver's version label are where they were."""
    now = await _get(api, resources.PODS.path(at.namespace, "user"))
    assert now is not None
    assert now["metadata"]["uid"] == user_uid
    assert not now["metadata"].get("deletionTimestamp")
    assert disrupted(now) is None
    driver = await _get(api, resources.PODS.path(at.namespace, at.dra.name))
    assert driver is not None
    assert not driver["metadata"].get("deletionTimestamp")
    node = await api.request("GET", resources.NODES.path(name=NODE))
    assert objects.labels(node).get(labels.device_plugin_version(at.namespace, at.name)) == "v1"


async def _caught_up(timeline: Timeline, at: AtV1, claim_uid: str, user_uid: str) -> None:
    """The timeline has seen the claim released, v2 ready and the user gone."""

    async def seen() -> bool:
        return (
            timeline.first("ResourceClaim", _released, uid=claim_uid) is not None
            and timeline.node_label(labels.version_ready(at.namespace, at.name), "v2") is not None
            and timeline.first("Pod", lambda s: s.type == "DELETED", uid=user_uid) is not None
        )

    await testing.eventually(seen, "the timeline caught up")


async def _serves_rules(api: kube_client.Client) -> bool:
    """Whether the API server serves resource.k8s.io/v1 devicetaintrules
    (1.37; 1.35 and 1.36 at their defaults do not)."""
    listing = await api.request("GET", f"/apis/{RULES.group}/{RULES.version}")
    return any(r["name"] == RULES.plural for r in listing["resources"])


@pytest.mark.compat
async def test_without_device_taints_the_move_waits_on_the_device_user_and_evicts_nothing(
    containers: tuple[cluster.state.SandboxState, Images],
    api: kube_client.Client,
) -> None:
    """Where no DeviceTaintRule can be written: on a server that serves none
    (1.35 and 1.36 at their defaults, in ``make test-compat``), or, where the
    server does (1.37), an operator run with ``--no-device-taints``. The
    Module opted in to eviction, and still nothing is tainted or evicted;
    the driver stays while the user's claim holds its device, the step and
    ``status.deviceTaints`` name the user and say why, and the move finishes
    once the user is deleted."""
    record, images = containers
    name = "untainted"
    served = await _serves_rules(api)
    said_why = deviceapis.TURNED_OFF if served else deviceapis.NOT_SERVED
    async with (
        support.operator_in_process(record.kubeconfig, device_taints=not served) as running,
        dra_module_at_v1(api, images, name, evict=True) as at,
    ):
        ns = at.namespace
        user_uid, claim = await _device_user(api, at, images)
        await to_v2(api, at, images, evict=True)
        plugin_key = labels.device_plugin_version(ns, name)

        timeline = Timeline(api, ns, rules=served)
        try:
            async with timeline.recording():
                async with _upgrading_to_v2(record.kubeconfig, at) as upgrading:
                    taints = await _device_taints_once(api, at, lambda t: bool(t.get("nodes")))
                    assert taints == {
                        "message": said_why,
                        "nodes": [{"node": NODE, "staying": [f"{ns}/user"]}],
                    }
                    await _still_waiting(api, at, user_uid)

                    deleted = await api.request("DELETE", resources.PODS.path(ns, "user"))
                    deleted_at = int(objects.resource_version(deleted) or 0)
                    said = await asyncio.wait_for(upgrading, 600)
                await wait_version(api, ns, name, "v2")

                await _caught_up(timeline, at, claim["metadata"]["uid"], user_uid)
        finally:
            print(f"\nuntainted timeline ({ns}/{name}):", *timeline.story(ns, name), sep="\n  ")

        words = " ".join(said.split())  # rich wraps lines at 200 columns
        assert (
            f"{NODE}: pod {ns}/user uses the Module's devices (no device taints: not evicted; "
            "delete it to go on); waiting for their claims to be released before removing "
            "the device-plugin version label"
        ) in words, said
        assert said.splitlines()[-2:] == [f"{NODE}: on v2", "1 node(s) on v2"], said
        # Nothing evicted: the pod's deletion is the test's, no condition.
        assert timeline.deletion(user_uid) == deleted_at, timeline.events("Pod", uid=user_uid)
        assert not [s for s in timeline.events("Pod", uid=user_uid) if disrupted(s.obj)]
        # The driver's label went only after the claim was released.
        released = timeline.released(claim["metadata"]["uid"])
        driver_off = known(timeline.node_label(plugin_key, None), "driver label off")
        v2_ready = known(timeline.node_label(labels.version_ready(ns, name), "v2"), "v2 ready")
        assert deleted_at < released < driver_off < v2_ready
        assert not timeline.unschedulable()
        if served:  # turned off: no rule was ever written
            assert timeline.rules(ns, name) == []
            assert (await api.request("GET", RULES.path()))["items"] == []
        await running.wait_idle("settled")
