"""An ordered upgrade (seed 003) on container nodes, with real pod termination.

One sandbox for the module: two containerd nodes, the registry on. The loader
image (``make test-images``, build/images/loader.tar) is pushed twice, as
loader:v1 and loader:v2: the same files, its ``modprobe`` recording each call
as a ``KMM-MODPROBE {...}`` line in the container's log. The Module maps each
node's real kernel (``nodeInfo.kernelVersion``) to loader:<version>, and has
a device plugin that only waits (the workload image, pushed as plugin:v1 and
plugin:v2). The operator runs in the test process, on the host (as
test_operator_upgrades' does).

What is shown, read as a user reads it (``pods/log`` through the API server,
whose lines the kubelet took from the container):

- both nodes load v1: one load call in each loader pod's log;
- moving ONE node to v2: its v1 device-plugin pod goes before the loader
  label does; the old loader pod's ``preStop`` unload is in its log (the log
  is followed while the pod terminates; the lines reach it before the
  container exits), and its main process ends on SIGTERM (exit 0); the v2
  pod is created only after the v1 pod is gone (the operator's guarantee:
  ``.ready`` stays while the old pod is there and the v2 loader label waits
  on it), ordered by the watches' resourceVersions, and the log's own
  timestamps put the unload before the load; the other node's pods are
  untouched (same uids, same restartCount, still one load call and no
  unload, no pod event there);
- then the second node moves (by ``kmm upgrade``), and the same holds the
  other way round;
- deleting the Module: the device-plugin pods go before any loader pod is
  deleted, each loader pod unloads, and each node keeps ``.ready`` until its
  loader pod is gone.

Nothing is timed: every count is of log lines, pods and watch events.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import containersandbox
import pytest
import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import kernels, labels, modules
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import objects, resources
from kmm.sandbox import addressing, cluster, testing

# In `make test-compat`: kmm on each supported Kubernetes release.
pytestmark = pytest.mark.compat

IMAGES = Path("build/images")
REGISTRY = f"{addressing.GATEWAY}:{addressing.REGISTRY_PORT}"
NODES = [f"kmm-kubelet-{i}" for i in range(2)]
NAME = "upgrade"
MODULE = "kmm_test"
SELECT = "kmm-test/upgrade"
LOAD = ["-v", "-d", "/opt", MODULE]
UNLOAD = ["-rv", "-d", "/opt", MODULE]
MERGE = "application/merge-patch+json"
PLUGIN = "device-plugin"


@pytest.fixture(scope="module")
def containers() -> Iterator[cluster.state.SandboxState]:
    with containersandbox.started("ku", kubelet_nodes=2) as record:
        for archive, name in (("loader.tar", "loader"), ("workload.tar", "plugin")):
            for version in ("v1", "v2"):
                reference = f"{name}:{version}"
                pushed = containersandbox.push(record.directory, IMAGES / archive, reference)
                assert pushed == f"{REGISTRY}/{reference}"
        asyncio.run(support.install_manifests(record.kubeconfig))
        yield record


def module_body(namespace: str, version: str, kernel: str) -> dict[str, Any]:
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "selector": {SELECT: "yes"},
            "moduleLoader": {
                "container": {
                    "version": version,
                    "modprobe": {"moduleName": MODULE},
                    "kernelMappings": [
                        {"literal": kernel, "containerImage": f"{REGISTRY}/loader:{version}"}
                    ],
                }
            },
            # A device plugin that only waits (the workload image's busybox):
            # the move takes its pod off the node before the loader's.
            "devicePlugin": {
                "container": {
                    "image": f"{REGISTRY}/plugin:{version}",
                    "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait"],
                }
            },
        },
    }


@dataclasses.dataclass(frozen=True)
class Call:
    """One recorded ``modprobe`` call: the log's timestamp and its argv."""

    at: datetime.datetime
    argv: list[str]


def calls(log: str) -> list[Call]:
    """The ``KMM-MODPROBE`` lines of a log read with ``timestamps=true``."""
    found = []
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        if text.startswith("KMM-MODPROBE "):
            record = json.loads(text.removeprefix("KMM-MODPROBE "))
            found.append(Call(_timestamp(stamp), record["argv"]))
    return found


def _timestamp(text: str) -> datetime.datetime:
    # RFC 3339 with nanoseconds: Python keeps microseconds (enough to order
    # lines that the same node's containerd stamped).
    head, _, rest = text.rstrip("Z").partition(".")
    digits = (rest + "000000")[:6]
    return datetime.datetime.fromisoformat(f"{head}.{digits}+00:00")


@dataclasses.dataclass(frozen=True)
class PodEvent:
    revision: int
    type: str
    name: str
    uid: str
    node: str
    version: str | None
    role: str


@dataclasses.dataclass(frozen=True)
class ReadyEvent:
    revision: int
    node: str
    ready: bool


class Recorder:
    """Every ADDED and DELETED event of the namespace's loader and
    device-plugin pods and the first one showing each deleted (its
    ``deletionTimestamp``), and every change of the Module's ``.ready`` and
    loader version labels on a node, by revision (etcd's, one order for
    all)."""

    def __init__(self, api: kube_client.Client, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.events: list[PodEvent] = []
        # A deleted pod's container, as the kubelet last reported it (by pod uid).
        self.ended: dict[str, dict[str, Any]] = {}
        self.ready: list[ReadyEvent] = []
        self._ready_now: dict[str, bool] = {}
        # By pod uid: the revision its deletion began.
        self.terminating: dict[str, int] = {}
        # (revision, node, value) of each change of the loader version label.
        self.loader_label: list[tuple[int, str, str | None]] = []
        self._loader_now: dict[str, str | None] = {}

    async def _stream(
        self, path: str, query: dict[str, str], on: Any, listed: asyncio.Event
    ) -> None:
        listing = await self.api.request("GET", path, query=query)
        for item in listing["items"]:
            on("LISTED", item)
        version = listing["metadata"]["resourceVersion"]
        listed.set()
        while True:
            with contextlib.suppress(kube_errors.Unavailable):
                async for event in self.api.watch(
                    path, query={**query, "resourceVersion": version}
                ):
                    version = objects.resource_version(event["object"]) or version
                    if event["type"] != "BOOKMARK":
                        on(event["type"], event["object"])

    def _pod(self, type_: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if pod["metadata"].get("deletionTimestamp") and uid not in self.terminating:
            self.terminating[uid] = int(objects.resource_version(pod) or 0)
        if type_ not in ("LISTED", "ADDED", "DELETED"):
            return
        if type_ == "DELETED":
            [status] = (pod.get("status") or {}).get("containerStatuses") or [{}]
            self.ended[pod["metadata"]["uid"]] = (status.get("state") or {}).get("terminated") or {}
        self.events.append(
            PodEvent(
                int(objects.resource_version(pod) or 0),
                type_,
                objects.name(pod),
                pod["metadata"]["uid"],
                (pod.get("spec") or {}).get("nodeName") or "",
                objects.labels(pod).get(labels.MODULE_VERSION),
                objects.labels(pod).get(labels.ROLE, ""),
            )
        )

    def _node(self, type_: str, node: dict[str, Any]) -> None:
        name = objects.name(node)
        ready = labels.ready(self.namespace, NAME) in objects.labels(node)
        if type_ != "LISTED" and self._ready_now.get(name) != ready:
            self.ready.append(ReadyEvent(int(objects.resource_version(node) or 0), name, ready))
        self._ready_now[name] = ready
        loader = objects.labels(node).get(labels.module_loader_version(self.namespace, NAME))
        if type_ != "LISTED" and self._loader_now.get(name) != loader:
            self.loader_label.append((int(objects.resource_version(node) or 0), name, loader))
        self._loader_now[name] = loader

    def revision(self, type_: str, uid: str) -> int:
        [found] = [e.revision for e in self.events if e.type == type_ and e.uid == uid]
        return found

    @contextlib.asynccontextmanager
    async def recording(self) -> AsyncIterator[Recorder]:
        sources = [
            (
                resources.PODS.path(self.namespace),
                {"labelSelector": f"{labels.ROLE} in (module-loader,device-plugin)"},
                self._pod,
            ),
            (resources.NODES.path(), {}, self._node),
        ]
        listed = [asyncio.Event() for _ in sources]
        tasks = [
            asyncio.ensure_future(self._stream(path, query, on, done))
            for (path, query, on), done in zip(sources, listed, strict=True)
        ]
        try:

            async def lists_in() -> bool:
                for task in tasks:
                    if task.done():
                        task.result()  # a failed list fails the test here
                return all(done.is_set() for done in listed)

            await testing.eventually(lists_in, "the recorder's lists in")
            yield self
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@dataclasses.dataclass(frozen=True)
class LoaderPod:
    name: str
    uid: str
    restarts: int
    version: str | None


async def loader_pod(
    api: kube_client.Client, namespace: str, node: str, role: str = "module-loader"
) -> LoaderPod:
    """The one Ready pod of ``role`` on ``node`` (waited for)."""
    found: list[LoaderPod] = []

    async def one_ready() -> bool:
        listing = await api.request(
            "GET", resources.PODS.path(namespace), query={"labelSelector": f"{labels.ROLE}={role}"}
        )
        pods = [p for p in listing["items"] if p["spec"].get("nodeName") == node]
        if len(pods) != 1 or not any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (pods[0].get("status") or {}).get("conditions") or ()
        ):
            return False
        [status] = pods[0]["status"]["containerStatuses"]
        found[:] = [
            LoaderPod(
                objects.name(pods[0]),
                pods[0]["metadata"]["uid"],
                status["restartCount"],
                objects.labels(pods[0]).get(labels.MODULE_VERSION),
            )
        ]
        return True

    await testing.eventually(one_ready, f"one Ready {role} pod on {node}", bound=180)
    return found[0]


async def read_log(api: kube_client.Client, namespace: str, pod: str) -> str:
    path = resources.PODS.path(namespace, pod) + "/log"
    return str(await api.request("GET", path, query={"timestamps": "true"}) or "")


async def follow_log(core: client.CoreV1Api, namespace: str, pod: str) -> asyncio.Future[str]:
    """The pod's log, followed until the container exits (the stream ends
    then). Returned once the stream is open, so nothing done afterwards can
    come before it."""
    response = await core.read_namespaced_pod_log(
        pod, namespace, follow=True, timestamps=True, _preload_content=False
    )

    async def read() -> str:
        try:
            return (await response.read()).decode()
        finally:
            response.release()

    return asyncio.ensure_future(read())


async def set_node_label(api: kube_client.Client, node: str, key: str, value: str | None) -> None:
    await api.request(
        "PATCH",
        resources.NODES.path(name=node),
        body={"metadata": {"labels": {key: value}}},
        content_type=kube_client.MERGE_PATCH,
    )


async def wait_on(api: kube_client.Client, namespace: str, node: str, version: str) -> None:
    key = labels.version_ready(namespace, NAME)

    async def there() -> bool:
        found = await api.request("GET", resources.NODES.path(name=node))
        return bool(objects.labels(found).get(key) == version)

    await testing.eventually(there, f"{node} on {version}", bound=300)


async def node_kernel(api: kube_client.Client, node: str) -> str:
    found = await api.request("GET", resources.NODES.path(name=node))
    return kernels.node_kernel(found["status"]["nodeInfo"]["kernelVersion"])


@pytest.fixture
async def api(containers: cluster.state.SandboxState) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(containers.kubeconfig) as found:
        yield found


@pytest.fixture
async def core(containers: cluster.state.SandboxState) -> AsyncIterator[client.CoreV1Api]:
    independent = await support.independent_client(containers.kubeconfig)
    async with independent:
        yield client.CoreV1Api(independent)


async def move(
    api: kube_client.Client,
    core: client.CoreV1Api,
    recorder: Recorder,
    namespace: str,
    node: str,
    other: str,
    *,
    kubeconfig: Path | None = None,
) -> str:
    """Move ``node`` from v1 to v2 (with ``kubeconfig``, by ``kmm upgrade``; its
    output returned); check the order there and that ``other`` was left alone."""
    old = await loader_pod(api, namespace, node)
    assert old.version == "v1"
    old_plugin = await loader_pod(api, namespace, node, PLUGIN)
    kept = await loader_pod(api, namespace, other)
    kept_plugin = await loader_pod(api, namespace, other, PLUGIN)
    kept_log = calls(await read_log(api, namespace, kept.name))
    since = len(recorder.events)
    # Followed from before the move: the preStop's lines reach the log
    # before the container exits, and the stream ends when it exits.
    followed = await follow_log(core, namespace, old.name)
    try:
        said = ""
        if kubeconfig is None:
            await set_node_label(api, node, labels.module_version(namespace, NAME), "v2")
        else:
            said = await asyncio.to_thread(
                kmm_upgrade, kubeconfig, f"{namespace}/{NAME}", node, "--to", "v2"
            )
        await wait_on(api, namespace, node, "v2")
        old_calls = calls(await asyncio.wait_for(followed, 300))
    finally:
        followed.cancel()
        await asyncio.gather(followed, return_exceptions=True)
    new = await loader_pod(api, namespace, node)
    assert new.version == "v2"
    assert new.uid != old.uid
    new_calls = calls(await read_log(api, namespace, new.name))

    # The old pod loaded once and unloaded once, in that order; the new pod
    # loaded once.
    assert [c.argv for c in old_calls] == [LOAD, UNLOAD], old_calls
    assert [c.argv for c in new_calls] == [LOAD], new_calls
    # Unload before load: the v2 pod was created only after the v1 pod was
    # gone (one etcd revision order for both events), and the log's own
    # timestamps (the node's containerd stamped both) agree.
    assert recorder.revision("DELETED", old.uid) < recorder.revision("ADDED", new.uid)
    assert old_calls[1].at < new_calls[0].at
    # The main process ended on the kubelet's SIGTERM after preStop, not on
    # SIGKILL (137) at the end of the grace period.
    ended = recorder.ended[old.uid]
    assert (ended.get("exitCode"), ended.get("reason")) == (0, "Completed"), ended
    # Seed 003's order before that: the device plugin's v1 pod was gone
    # before the loader label went (so before the loader pod was deleted
    # and its preStop ran), and the v2 one came after the v2 loader pod.
    new_plugin = await loader_pod(api, namespace, node, PLUGIN)
    assert new_plugin.version == "v2"
    [off] = [r for r, n, v in recorder.loader_label if n == node and v is None]
    assert recorder.revision("DELETED", old_plugin.uid) < off < recorder.terminating[old.uid]
    assert recorder.revision("ADDED", new.uid) < recorder.revision("ADDED", new_plugin.uid)

    # The other node's loader pod was left alone.
    still = await loader_pod(api, namespace, other)
    assert still == kept
    assert await loader_pod(api, namespace, other, PLUGIN) == kept_plugin
    assert calls(await read_log(api, namespace, still.name)) == kept_log
    assert [c.argv for c in kept_log] == [LOAD]
    assert not [e for e in recorder.events[since:] if e.node == other], recorder.events
    return said


def kmm_upgrade(kubeconfig: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", "from kmm.cli import main; main()", "upgrade",
         f"--kubeconfig={kubeconfig}", *args, "--timeout", "300"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


MODULES_PATH = f"/apis/{modules.GROUP}/{modules.VERSION}/namespaces/{{}}/{modules.PLURAL}"


@contextlib.asynccontextmanager
async def loaded_v1(api: kube_client.Client) -> AsyncIterator[tuple[str, str]]:
    """A namespace of its own and the Module in it at v1, loaded on both
    nodes (an operator must run); its namespace and kernel yielded. The
    nodes' labels are taken off afterwards."""
    namespace = f"upgrade-{uuid.uuid4().hex[:6]}"
    await api.request("POST", resources.NAMESPACES.path(), body={"metadata": {"name": namespace}})
    kernel = await node_kernel(api, NODES[0])
    assert await node_kernel(api, NODES[1]) == kernel
    try:
        for node in NODES:
            await set_node_label(api, node, SELECT, "yes")
        await api.request(
            "POST", MODULES_PATH.format(namespace), body=module_body(namespace, "v1", kernel)
        )
        for node in NODES:
            await set_node_label(api, node, labels.module_version(namespace, NAME), "v1")
        for node in NODES:
            await wait_on(api, namespace, node, "v1")
        for node in NODES:
            pod = await loader_pod(api, namespace, node)
            assert pod.version == "v1"
            assert [c.argv for c in calls(await read_log(api, namespace, pod.name))] == [LOAD]
        yield namespace, kernel
    finally:
        for node in NODES:
            await set_node_label(api, node, labels.module_version(namespace, NAME), None)
            await set_node_label(api, node, SELECT, None)
        await api.request("DELETE", resources.NAMESPACES.path(name=namespace))


async def test_an_ordered_upgrade_unloads_v1_before_loading_v2_one_node_at_a_time(
    containers: cluster.state.SandboxState,
    api: kube_client.Client,
    core: client.CoreV1Api,
) -> None:
    async with (
        support.operator_in_process(containers.kubeconfig) as running,
        loaded_v1(api) as (namespace, kernel),
    ):
        await api.request(
            "PATCH",
            MODULES_PATH.format(namespace) + f"/{NAME}",
            body={"spec": module_body(namespace, "v2", kernel)["spec"]},
            content_type=MERGE,
        )
        async with Recorder(api, namespace).recording() as recorder:
            await move(api, core, recorder, namespace, NODES[0], NODES[1])
            said = await move(
                api, core, recorder, namespace, NODES[1], NODES[0], kubeconfig=containers.kubeconfig
            )
        assert f"{NODES[1]}: adding the module-loader version label v2" in said
        assert said.splitlines()[-2:] == [f"{NODES[1]}: on v2", "1 node(s) on v2"]
        await running.wait_idle("settled")
        module = await api.request("GET", MODULES_PATH.format(namespace) + f"/{NAME}")
        versions = module["status"]["moduleLoader"]["versions"]
        assert versions == [{"version": "v2", "desiredNumber": 2, "availableNumber": 2}]
        for node in NODES:
            events = await api.request(
                "GET",
                resources.EVENTS.path("default"),
                query={"fieldSelector": f"involvedObject.kind=Node,involvedObject.name={node}"},
            )
            # Each said once (the list's order is not the events' order).
            told = sorted(
                (e["reason"], e.get("message", ""))
                for e in events["items"]
                if f"{namespace}/{NAME}" in e.get("message", "")
            )
            what = f"module {namespace}/{NAME}"
            assert told == [
                ("ModuleLoaded", f"{what} version v1 loaded"),
                ("ModuleLoaded", f"{what} version v2 loaded"),
                ("ModuleUnloaded", f"{what} version v1 unloaded"),
            ], told
        await delete_module(api, core, namespace)


async def delete_module(api: kube_client.Client, core: client.CoreV1Api, namespace: str) -> None:
    """Delete the Module; each loader pod's log shows its unload, and the
    node's ``.ready`` went only after that pod was gone (the operator's
    finalizer waits on it: the module stays loaded until the pod is gone)."""
    pods = {node: await loader_pod(api, namespace, node) for node in NODES}
    plugins = {node: await loader_pod(api, namespace, node, PLUGIN) for node in NODES}
    async with Recorder(api, namespace).recording() as recorder:
        followed: dict[str, asyncio.Future[str]] = {}
        try:
            for node, pod in pods.items():
                followed[node] = await follow_log(core, namespace, pod.name)
            await api.request("DELETE", MODULES_PATH.format(namespace) + f"/{NAME}")

            async def gone() -> bool:
                try:
                    await api.request("GET", MODULES_PATH.format(namespace) + f"/{NAME}")
                except kube_errors.NotFound:
                    return True
                return False

            await testing.eventually(gone, "the Module gone", bound=300)
            logs = {node: await asyncio.wait_for(task, 300) for node, task in followed.items()}
        finally:
            for task in followed.values():
                task.cancel()
            await asyncio.gather(*followed.values(), return_exceptions=True)
        for node, pod in pods.items():
            assert [c.argv for c in calls(logs[node])] == [LOAD, UNLOAD], logs[node]

            async def seen(node: str = node, uid: str = pod.uid) -> bool:
                return any(e.uid == uid and e.type == "DELETED" for e in recorder.events) and any(
                    e.node == node and not e.ready for e in recorder.ready
                )

            await testing.eventually(seen, f"the watches caught up on {node}")
            [unready] = [e.revision for e in recorder.ready if e.node == node and not e.ready]
            assert recorder.revision("DELETED", pod.uid) < unready, (
                recorder.events,
                recorder.ready,
            )
        # The device plugin's pods went before any loader pod was deleted.
        for plugin in plugins.values():
            await testing.eventually(
                functools.partial(_seen_deleted, recorder, plugin.uid), "plugin pod deletion seen"
            )
        last_plugin = max(recorder.revision("DELETED", p.uid) for p in plugins.values())
        assert last_plugin < min(recorder.terminating[p.uid] for p in pods.values())
    listing = await api.request("GET", resources.DAEMONSETS.path(namespace))
    assert listing["items"] == []


async def _seen_deleted(recorder: Recorder, uid: str) -> bool:
    return any(e.uid == uid and e.type == "DELETED" for e in recorder.events)


async def test_deleting_the_module_keeps_ready_until_each_loader_pod_unloaded_and_went(
    containers: cluster.state.SandboxState,
    api: kube_client.Client,
    core: client.CoreV1Api,
) -> None:
    async with (
        support.operator_in_process(containers.kubeconfig),
        loaded_v1(api) as (namespace, _kernel),
    ):
        await delete_module(api, core, namespace)
