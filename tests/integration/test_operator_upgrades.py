"""Ordered upgrades on the sandbox (seed 003): the admin moves nodes, the operator orders each move.

Changes are recorded from watches of the nodes and of the Module's pods and
DaemonSets, and ordered by resourceVersion (etcd's revision, one order for
every resource), so the tests assert what happened in what order, never how
long it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import labels, moduleloader, modules
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import objects, resources
from kmm.sandbox import cluster, testing

manifests = support.manifests

NAME = "up"
MERGE = "application/merge-patch+json"
KMM = Path(sys.executable).with_name("kmm")


def body(select: str, version: str, dra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The versioned Module; with ``dra`` (a ``spec.dra``), a DRA driver in
    place of the device plugin."""
    workload = (
        {"dra": {**dra, "container": {"image": f"example.com/driver:{version}"}}}
        if dra is not None
        else {"devicePlugin": {"container": {"image": f"example.com/plugin:{version}"}}}
    )
    found = support.module_body(NAME, {select: "yes"}, **workload)
    container = found["spec"]["moduleLoader"]["container"]
    container["version"] = version
    container["containerImage"] = f"example.com/default/${{MOD_NAME}}:{version}"
    for mapping in container["kernelMappings"]:
        mapping.pop("containerImage", None)
    return found


@dataclasses.dataclass(frozen=True)
class Change:
    revision: int
    what: str  # "label", "pod-gone", "pod-ready", "ds-gone"
    node: str
    key: str
    value: str | None


class Recorder:
    """Every change to the chosen nodes' labels, the Module's pods and DaemonSets."""

    def __init__(self, api: kube_client.Client, namespace: str, nodes: list[str]) -> None:
        self.api, self.namespace, self.nodes = api, namespace, set(nodes)
        self.changes: list[Change] = []
        self._labels: dict[str, dict[str, str]] = {}
        self._ready: set[str] = set()

    def ordered(self) -> list[Change]:
        return sorted(self.changes, key=lambda c: c.revision)

    async def _stream(
        self, path: str, on: Callable[[dict[str, Any]], None], listed: asyncio.Event
    ) -> None:
        listing = await self.api.request("GET", path)
        for item in listing["items"]:
            on({"type": "ADDED", "object": item, "initial": True})
        version = listing["metadata"]["resourceVersion"]
        # The watch starts at the list's version: from here no change is missed.
        listed.set()
        while True:
            with contextlib.suppress(kube_errors.Unavailable):
                async for event in self.api.watch(path, query={"resourceVersion": version}):
                    version = objects.resource_version(event["object"]) or version
                    if event["type"] != "BOOKMARK":
                        on(event)

    def _node(self, event: dict[str, Any]) -> None:
        node = event["object"]
        name = objects.name(node)
        if name not in self.nodes:
            return
        new = dict(objects.labels(node))
        old = self._labels.get(name)
        self._labels[name] = new
        if old is None or event.get("initial"):
            return
        revision = int(objects.resource_version(node) or 0)
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                self.changes.append(Change(revision, "label", name, key, new.get(key)))

    def _pod(self, event: dict[str, Any]) -> None:
        pod = event["object"]
        node = (pod.get("spec") or {}).get("nodeName") or ""
        role = objects.labels(pod).get(labels.ROLE, "")
        version = objects.labels(pod).get(labels.MODULE_VERSION)
        revision = int(objects.resource_version(pod) or 0)
        uid = (pod.get("metadata") or {}).get("uid", "")
        if event["type"] == "DELETED":
            self.changes.append(Change(revision, "pod-gone", node, role, version))
        elif uid not in self._ready and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or ()
        ):
            self._ready.add(uid)
            if not event.get("initial"):
                self.changes.append(Change(revision, "pod-ready", node, role, version))

    def _daemonset(self, event: dict[str, Any]) -> None:
        if event["type"] == "DELETED":
            ds = event["object"]
            self.changes.append(
                Change(  # node: the kernel a loader DaemonSet served
                    int(objects.resource_version(ds) or 0),
                    "ds-gone",
                    objects.labels(ds).get(labels.KERNEL_VERSION_FULL, ""),
                    objects.labels(ds).get(labels.ROLE, ""),
                    objects.labels(ds).get(labels.MODULE_VERSION),
                )
            )

    @contextlib.asynccontextmanager
    async def recording(self) -> AsyncIterator[Recorder]:
        sources: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
            (resources.NODES.path(), self._node),
            (resources.PODS.path(self.namespace), self._pod),
            (resources.DAEMONSETS.path(self.namespace), self._daemonset),
        ]
        listed = [asyncio.Event() for _ in sources]
        streams = [
            asyncio.ensure_future(self._stream(path, on, done))
            for (path, on), done in zip(sources, listed, strict=True)
        ]
        try:

            async def lists_in() -> bool:
                for stream in streams:
                    if stream.done():
                        stream.result()  # a failed list fails the test here
                return all(done.is_set() for done in listed)

            await testing.eventually(lists_in, "the recorder's lists in", interval=0.05)
            yield self
        finally:
            for stream in streams:
                stream.cancel()
            await asyncio.gather(*streams, return_exceptions=True)


def keys(namespace: str) -> dict[str, str]:
    return {
        "user": labels.module_version(namespace, NAME),
        "loader": labels.module_loader_version(namespace, NAME),
        "plugin": labels.device_plugin_version(namespace, NAME),
        "ready": labels.ready(namespace, NAME),
        "done": labels.version_ready(namespace, NAME),
    }


async def node_labels(api: client.ApiClient, node: str) -> dict[str, str]:
    found = await client.CoreV1Api(api).read_node(node)
    return dict(found.metadata.labels or {})


async def set_version(
    api: client.ApiClient, namespace: str, node: str, version: str | None
) -> None:
    patch = {"metadata": {"labels": {keys(namespace)["user"]: version}}}
    await client.CoreV1Api(api).patch_node(node, patch)


async def wait_on(api: client.ApiClient, namespace: str, nodes: list[str], version: str) -> None:
    done = keys(namespace)["done"]

    async def there() -> bool:
        found = [(await node_labels(api, n)).get(done) for n in nodes]
        return found == [version] * len(nodes)

    await testing.eventually(there, f"{nodes} on {version}", bound=180)


async def set_module_version(
    api: client.ApiClient,
    namespace: str,
    select: str,
    version: str,
    dra: dict[str, Any] | None = None,
) -> None:
    spec = body(select, version, dra)["spec"]
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        modules.GROUP,
        modules.VERSION,
        namespace,
        modules.PLURAL,
        NAME,
        {"spec": spec},
        _content_type=MERGE,
    )


@contextlib.asynccontextmanager
async def module_on(
    api: client.ApiClient,
    namespace: str,
    nodes: list[str],
    version: str,
    dra: dict[str, Any] | None = None,
) -> AsyncIterator[str]:
    """The Module at ``version`` on ``nodes`` (an operator must run); cleaned up after."""
    select = f"kmm-test/{namespace}"
    async with support.selecting(api, nodes, select):
        try:
            await client.CustomObjectsApi(api).create_namespaced_custom_object(
                modules.GROUP,
                modules.VERSION,
                namespace,
                modules.PLURAL,
                body(select, version, dra),
            )
            for node in nodes:
                await set_version(api, namespace, node, version)
            await wait_on(api, namespace, nodes, version)
            yield select
        finally:
            for node in nodes:
                with contextlib.suppress(client.ApiException):
                    await set_version(api, namespace, node, None)


async def remove(api: client.ApiClient, namespace: str) -> None:
    await support.delete_and_wait_clean(api, namespace, NAME)


async def recorded(recorder: Recorder, **match: Any) -> None:
    """Wait until the recorder's watches have caught up with a change the test
    saw by a GET (the two reach the test by different paths)."""

    async def seen() -> bool:
        return any(all(getattr(c, k) == v for k, v in match.items()) for c in recorder.ordered())

    await testing.eventually(seen, f"the watch shows {match}")


def safe_order_steps(moved: list[Change], k: dict[str, str], role: str) -> list[int]:
    """Where each step of a v1 -> v2 move happened in ``moved`` (one node's
    changes, in order): the device workload's (``role``) version label off,
    its pod gone, the loader label off, ``.ready`` gone, the new loader
    label, then ``.ready``, the new workload pod Ready, ``.version.ready``.
    In the safe order the list is sorted."""
    steps = [
        first(moved, what="label", key=k["plugin"], value=None),
        first(moved, what="pod-gone", key=role, value="v1"),
        first(moved, what="label", key=k["loader"], value=None),
        first(moved, what="label", key=k["ready"], value=None),
        first(moved, what="label", key=k["loader"], value="v2"),
    ]
    after = moved[steps[-1] :]
    return [
        *steps,
        steps[-1] + first(after, what="label", key=k["ready"], value=""),
        steps[-1] + first(after, what="pod-ready", key=role, value="v2"),
        steps[-1] + first(after, what="label", key=k["done"], value="v2"),
    ]


def first(changes: list[Change], **match: Any) -> int:
    for index, change in enumerate(changes):
        if all(getattr(change, k) == v for k, v in match.items()):
            return index
    raise AssertionError(f"no change {match} in {changes}")


async def test_nodes_move_one_at_a_time_each_in_the_safe_order(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    chosen = sandbox.node_names[:3]
    k = keys(namespace)
    async with (
        support.operator_in_process(sandbox.kubeconfig) as running,
        cluster.api_client(sandbox.kubeconfig) as kmm_api,
        module_on(api_client, namespace, chosen, "v1") as select,
    ):
        kernel_of = {
            n: (await node_labels(api_client, n))[labels.KERNEL_VERSION_FULL] for n in chosen
        }
        await set_module_version(api_client, namespace, select, "v2")
        async with Recorder(kmm_api, namespace, chosen).recording() as recorder:
            # Straight from v1 to v2: the user does not wait for the unload.
            await set_version(api_client, namespace, chosen[0], "v2")
            await wait_on(api_client, namespace, chosen[:1], "v2")
            await recorded(recorder, node=chosen[0], key=k["done"], value="v2")
            moved = [c for c in recorder.ordered() if c.node == chosen[0]]
            steps = safe_order_steps(moved, k, "device-plugin")
            assert steps == sorted(steps), moved
            plugin_on = first(moved, what="label", key=k["plugin"], value="v2")
            assert steps[4] < plugin_on < steps[-1]
            # The others kept v1 loaded throughout.
            others = [c for c in recorder.ordered() if c.node in chosen[1:]]
            assert not [c for c in others if c.key == k["ready"]], others

            for node in chosen[1:]:
                await set_version(api_client, namespace, node, "v2")
                await wait_on(api_client, namespace, [node], "v2")

            async def old_gone() -> bool:
                listing = await client.AppsV1Api(api_client).list_namespaced_daemon_set(namespace)
                return not [
                    d for d in listing.items if d.metadata.labels.get(labels.MODULE_VERSION) == "v1"
                ]

            await testing.eventually(old_gone, "the v1 DaemonSets deleted")
            await running.wait_idle("settled")
            changes = recorder.ordered()
        # None was deleted while a node still ran it.
        for index, change in enumerate(changes):
            if change.what != "ds-gone" or change.value != "v1":
                continue
            before = changes[:index]
            if change.key == "module-loader":
                served = [n for n in chosen if kernel_of[n] == change.node]
                assert served, change
            else:
                served = chosen
            gate = k["loader"] if change.key == "module-loader" else k["plugin"]
            for node in served:
                assert any(c.node == node and c.key == gate and c.value is None for c in before), (
                    change,
                    node,
                )
        events = await client.CoreV1Api(api_client).list_namespaced_event(
            "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={chosen[0]}"
        )
        said = [(e.reason, e.message) for e in events.items if f"{namespace}/{NAME}" in e.message]
        assert ("ModuleUnloaded", f"module {namespace}/{NAME} version v1 unloaded") in said
        assert ("ModuleLoaded", f"module {namespace}/{NAME} version v2 loaded") in said
        module = await support.get_module(api_client, namespace, NAME)
        versions = module["status"]["moduleLoader"]["versions"]
        assert versions == [{"version": "v2", "desiredNumber": 3, "availableNumber": 3}]
        await remove(api_client, namespace)


async def test_removing_the_version_label_unloads_until_it_comes_back(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    node = sandbox.node_names[0]
    k = keys(namespace)
    async with (
        support.operator_in_process(sandbox.kubeconfig) as running,
        module_on(api_client, namespace, [node], "v1"),
    ):
        await set_version(api_client, namespace, node, None)

        async def unloaded() -> bool:
            found = await node_labels(api_client, node)
            return not {k["ready"], k["loader"], k["plugin"], k["done"]} & set(found)

        await testing.eventually(unloaded, "unloaded")
        await running.wait_idle("settled")
        assert await unloaded()
        running.op.resync()
        await running.wait_idle("resync")
        assert await unloaded()
        await set_version(api_client, namespace, node, "v1")
        await wait_on(api_client, namespace, [node], "v1")
        await remove(api_client, namespace)


UNLOADING = "kmm-test/unloading"


async def hold(api: kube_client.Client, namespace: str, pod: str, finalizers: Any) -> None:
    await api.request(
        "PATCH",
        resources.PODS.path(namespace, pod),
        body={"metadata": {"finalizers": finalizers}},
        content_type=kube_client.MERGE_PATCH,
    )


async def test_the_next_loader_waits_for_the_old_loader_pod_to_go(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    kmm_api: kube_client.Client,
    namespace: str,
) -> None:
    """The old loader pod unloads the module in ``preStop``: while it is still
    there (held by a finalizer, as a kubelet holds it while the hook runs)
    the node keeps ``.ready`` and the v2 loader label waits; once the pod is
    gone the node moves on."""
    node = sandbox.node_names[0]
    k = keys(namespace)
    core = client.CoreV1Api(api_client)
    async with (
        support.operator_in_process(sandbox.kubeconfig) as running,
        module_on(api_client, namespace, [node], "v1") as select,
    ):
        [old] = [
            pod.metadata.name
            for pod in (
                await core.list_namespaced_pod(
                    namespace, label_selector=f"{labels.ROLE}=module-loader"
                )
            ).items
            if pod.spec.node_name == node
        ]
        await hold(kmm_api, namespace, old, [UNLOADING])
        try:
            await set_module_version(api_client, namespace, select, "v2")
            await set_version(api_client, namespace, node, "v2")

            async def unloading() -> bool:
                pod = await core.read_namespaced_pod(old, namespace)
                loader = (await node_labels(api_client, node)).get(k["loader"])
                return pod.metadata.deletion_timestamp is not None and loader != "v1"

            await testing.eventually(unloading, "loader label v1 gone, the old pod terminating")
            # Proof the operator had its chance: a later change to the node
            # reached its cache and every reconcile it caused has run.
            await core.patch_node(node, {"metadata": {"labels": {"kmm-test/poke": "1"}}})

            async def cached_poke() -> bool:
                found = running.op.nodes.store.get(node) or {}
                return found.get("metadata", {}).get("labels", {}).get("kmm-test/poke") == "1"

            await testing.eventually(cached_poke, "the poke in the operator's node cache")
            await running.wait_idle("settled after the poke")
            found = await node_labels(api_client, node)
            assert k["ready"] in found, "unloaded while the old loader pod is still there"
            assert k["loader"] not in found, "the v2 loader beside the old one's unload"
        finally:
            await hold(kmm_api, namespace, old, None)
            await core.patch_node(node, {"metadata": {"labels": {"kmm-test/poke": None}}})
        await wait_on(api_client, namespace, [node], "v2")
        await remove(api_client, namespace)


@contextlib.asynccontextmanager
async def operator_process(
    kubeconfig: Path, log: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    argv = [str(KMM), "operator", f"--kubeconfig={kubeconfig}", "--no-leader-election",
            "--metrics-port=0", "--health-port=0", "--bind-address=127.0.0.1"]  # fmt: skip
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)


async def test_operator_killed_mid_move_finishes_it_with_no_duplicate(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    node = sandbox.node_names[1]
    k = keys(namespace)
    log = tmp_path / "operator.log"
    core = client.CoreV1Api(api_client)
    async with (
        operator_process(sandbox.kubeconfig, log) as first_run,
        module_on(api_client, namespace, [node], "v1") as select,
    ):
        # The move is held at "device-plugin pod still on the node" (a
        # finalizer), so the kill lands in its middle for certain.
        [held] = await plugin_pods(api_client, namespace, node)
        await core.patch_namespaced_pod(held, namespace, HOLD)
        try:
            await set_module_version(api_client, namespace, select, "v2")
            await set_version(api_client, namespace, node, "v2")

            async def moving() -> bool:
                return k["plugin"] not in await node_labels(api_client, node)

            await testing.eventually(moving, "the move started")
            os.kill(first_run.pid, signal.SIGKILL)
            await asyncio.wait_for(first_run.wait(), 30)
            assert (await node_labels(api_client, node))[k["loader"]] == "v1"
        finally:
            await core.patch_namespaced_pod(held, namespace, RELEASE)
        async with operator_process(sandbox.kubeconfig, log):
            await wait_on(api_client, namespace, [node], "v2")
            listing = await client.AppsV1Api(api_client).list_namespaced_daemon_set(namespace)
            kinds = [
                (
                    d.metadata.labels[labels.ROLE],
                    d.metadata.labels.get(labels.KERNEL_VERSION_FULL),
                    d.metadata.labels[labels.MODULE_VERSION],
                )
                for d in listing.items
            ]
            assert len(kinds) == len(set(kinds)), kinds
            await remove(api_client, namespace)


HOLD = {"metadata": {"finalizers": ["kmm-test/hold"]}}
RELEASE = {"metadata": {"finalizers": None}}


async def plugin_pods(api: client.ApiClient, namespace: str, node: str) -> list[str]:
    pods = await client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{labels.ROLE}=device-plugin"
    )
    return [p.metadata.name for p in pods.items if p.spec.node_name == node]


def kmm_upgrade(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KMM), "upgrade", f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


async def test_kmm_upgrade_moves_nodes_and_names_the_step_it_is_stuck_on(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    chosen = sandbox.node_names[:3]
    async with (
        support.operator_in_process(sandbox.kubeconfig),
        module_on(api_client, namespace, chosen, "v1") as select,
    ):
        await set_module_version(api_client, namespace, select, "v2")
        target = f"{namespace}/{NAME}"
        done = await asyncio.to_thread(
            kmm_upgrade, sandbox.kubeconfig, target, *chosen, "--to", "v2", "--timeout", "180"
        )
        assert done.returncode == 0, done.stderr
        for node in chosen:
            assert f"{node}: removing the device-plugin version label v1" in done.stdout
            assert f"{node}: adding the module-loader version label v2" in done.stdout
            assert f"{node}: on v2" in done.stdout
        assert "3 node(s) on v2" in done.stdout

        # A device-plugin pod that cannot leave its node (a finalizer held here).
        await set_module_version(api_client, namespace, select, "v3")
        core = client.CoreV1Api(api_client)
        [held] = await plugin_pods(api_client, namespace, chosen[0])
        await core.patch_namespaced_pod(held, namespace, HOLD)
        try:
            stuck = await asyncio.to_thread(
                kmm_upgrade, sandbox.kubeconfig, target, chosen[0], "--to", "v3", "--timeout", "20"
            )
            assert stuck.returncode == 1
            error = " ".join(stuck.stderr.split())
            assert f"{chosen[0]} did not reach v3 within 20 s" in error, error
            assert (
                f"device-plugin pod {held} still on the node; "
                "waiting before removing the module-loader version label"
            ) in error
        finally:
            await core.patch_namespaced_pod(held, namespace, RELEASE)
        await wait_on(api_client, namespace, chosen[:1], "v3")
        status = await asyncio.to_thread(
            subprocess.run,
            [str(KMM), "status", f"--kubeconfig={sandbox.kubeconfig}", target],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        cells = [
            [c.strip() for c in line.strip("│ ").split("│")] for line in status.stdout.splitlines()
        ]
        rows = {row[0]: " ".join(row) for row in cells if row and row[0] in chosen}
        assert "v3 loaded" in rows[chosen[0]]
        assert "v2 loaded" in rows[chosen[1]]
        await remove(api_client, namespace)


async def test_admission_refuses_a_version_that_comes_or_goes(
    api_client: client.ApiClient, manifests: None, namespace: str
) -> None:
    objects_api = client.CustomObjectsApi(api_client)
    plain = support.module_body("plain", {"x": "y"})
    await objects_api.create_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, plain
    )
    versioned = body("x", "v1")
    versioned["metadata"]["name"] = "versioned"
    await objects_api.create_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, versioned
    )
    for name, container in (
        ("plain", {"version": "v1"}),
        ("versioned", {"version": None}),
    ):
        before = await objects_api.get_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
        )
        patch = {"spec": {"moduleLoader": {"container": container}}}
        with pytest.raises(client.ApiException) as refused:
            await objects_api.patch_namespaced_custom_object(
                modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name, patch,
                _content_type=MERGE,
            )  # fmt: skip
        message = json.loads(refused.value.body)["message"]
        assert "spec.moduleLoader.container.version" in message
        assert moduleloader.VERSION_TRANSITION_MESSAGE in message
        after = await objects_api.get_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
        )
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
