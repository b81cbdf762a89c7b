"""Shared helpers for the operator's integration tests (no tests here).

- ``install_manifests``: the CRDs and admission policy from ``deploy/``,
  applied with ``kmm apply``'s own code, waited for until both bite;
- ``operator_in_process``: the wired operator (no leader election unless
  given one) on a ``kube.client.Client`` of its own, whose counter tells
  exactly the writes the operator makes, optionally reaching the API server
  through a ``partitioning.Partition``; ``InProcess.metrics`` renders what
  its ``/metrics`` would serve, ``metric`` reads one family of it;
- ``selecting``: labels nodes for one test and restores them afterwards
  (the session sandbox is shared).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from prometheus_client.parser import text_string_to_metric_families

from kmm.api import labels, modules, preflight
from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import counting, kubeconfigs
from kmm.operator import metrics, wiring
from kmm.runtime import manager
from kmm.sandbox import cluster, partitioning, testing

Obj = dict[str, Any]


async def independent_client(kubeconfig: Path) -> client.ApiClient:
    """A kubernetes-asyncio client (not kmm's) for the sandbox of ``kubeconfig``."""
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


async def refusal(api: client.ApiClient, namespace: str, obj: Obj) -> str | None:
    """The apiserver's message refusing a dry-run create of ``obj``, or None."""
    body = copy.deepcopy(obj)
    body["metadata"]["namespace"] = namespace
    try:
        await client.CustomObjectsApi(api).create_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, body, dry_run="All"
        )
    except client.ApiException as err:
        if err.status == 404:
            return None
        message: str = json.loads(err.body)["message"]
        return message
    return None


@pytest.fixture(scope="session")
def manifests(sandbox: testing.RunningSandbox) -> None:
    """The CRDs and admission policy from deploy/ in the session sandbox."""
    asyncio.run(install_manifests(sandbox.kubeconfig))


async def install_manifests(kubeconfig: Path) -> None:
    independent = await independent_client(kubeconfig)
    async with cluster.api_client(kubeconfig) as api, independent:
        docs = []
        for folder in ("crd", "admission"):
            for path in sorted((DEPLOY / folder).glob("*.yaml")):
                docs.extend(applying.load_documents(path.read_text()))
        await applying.apply_documents(api, docs)
        probe = module_body("n" * labels.MAX_NAME_AND_NAMESPACE, {"probe": "x"})
        for _ in range(240):
            if await refusal(independent, "default", probe) is not None and await _serves(
                independent, preflight.GROUP, preflight.VERSION, preflight.PLURAL
            ):
                return
            await asyncio.sleep(0.5)
    raise AssertionError("the CRDs or the admission policy from deploy/ never took effect")


async def _serves(api: client.ApiClient, group: str, version: str, plural: str) -> bool:
    """Whether a cluster-scoped custom resource is served yet: 404 until its
    CRD is Established, then 429 ("storage is (re)initializing") for a moment."""
    try:
        await client.CustomObjectsApi(api).list_cluster_custom_object(group, version, plural)
    except client.ApiException as err:
        if err.status in (404, 429):
            return False
        raise
    return True


async def create_module(api: client.ApiClient, namespace: str, body: Obj) -> None:
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, body
    )


def module_body(name: str, selector: dict[str, str], **spec: Any) -> Obj:
    """A Module over three kernels: one literal, two regexp mappings (one using
    the container's default image), images with variables."""
    loader = {
        "container": {
            "modprobe": {"moduleName": "kmm_test", "parameters": ["debug=1"]},
            "containerImage": "example.com/default/${MOD_NAME}:${KERNEL_X}.${KERNEL_Y}",
            "kernelMappings": [
                {
                    "literal": "6.8.0-45-generic",
                    "containerImage": "example.com/literal/kmm-test:${KERNEL_XYZ}",
                },
                {
                    "regexp": r"^6\.1\.\d+-\d+-amd64$",
                    "containerImage": "example.com/regexp/${MOD_NAME}:${KERNEL_FULL_VERSION}",
                },
                {"regexp": r"^5\.14\..*\.el9\.x86_64$"},
            ],
        }
    }
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": name},
        "spec": {
            "selector": selector,
            "tolerations": [{"key": "kmm-test", "operator": "Exists", "effect": "NoSchedule"}],
            "imageRepoSecret": {"name": "kmm-test-pull"},
            "moduleLoader": loader,
            **spec,
        },
    }


@dataclasses.dataclass
class InProcess:
    op: wiring.Operator
    counter: counting.RequestCounter
    task: asyncio.Future[None]

    async def synced(self) -> bool:
        return self.op.manager.ready()

    def metrics(self) -> str:
        """What this operator's ``/metrics`` would serve now (``running.run``'s registry)."""
        registry = metrics.OperatorMetrics(
            self.counter, leading=self.op.leading, cached=self.op.cached, relists=self.op.relists
        )
        return registry.render().decode()

    async def lost_the_lease(self) -> None:
        """Wait for the replica to end as a lost lease ends it (LeadershipLost)."""
        with pytest.raises(manager.LeadershipLost):
            await self.task

    async def wait_idle(self, what: str) -> None:
        """Wait until the caches synced, nothing is queued or running, and
        either one more reconcile ran or none came for a quiet while (an
        update that changes nothing the operator reads reaches no handler,
        so a settled operator may never reconcile again)."""
        start = self.op.counting.done
        loop = asyncio.get_running_loop()
        idle_since: float | None = None

        async def idle() -> bool:
            nonlocal idle_since
            if not (self.op.manager.ready() and self.op.idle()):
                idle_since = None
                return False
            if idle_since is None:
                idle_since = loop.time()
            return self.op.counting.done > start or loop.time() - idle_since >= 3.0

        await testing.eventually(idle, what)
        # Two loop turns: a handler may enqueue from an event read just now.
        await asyncio.sleep(0.5)
        if not self.op.idle():
            await self.wait_idle(what)


@contextlib.asynccontextmanager
async def operator_in_process(
    kubeconfig: Path,
    *,
    impersonate: str | None = None,
    election: wiring.Election | None = None,
    through: partitioning.Partition | None = None,
    counter: counting.RequestCounter | None = None,
    prepare: Callable[[wiring.Operator], None] | None = None,
    **settings: Any,
) -> AsyncIterator[InProcess]:
    """``settings`` go to ``wiring.Operator`` (resync_period, handler_errors ...);
    ``counter`` replaces the client's (a test's instrumented one), ``prepare``
    sees the operator before it runs. A replica that ended on a lost lease
    (``InProcess.lost_the_lease``) is not awaited again."""
    access = dataclasses.replace(kubeconfigs.load(kubeconfig), impersonate=impersonate)
    if through is not None:
        access = through.access(access)
    async with kube_client.Client(access) as api:
        if counter is not None:
            api.counter = counter
        op = wiring.Operator(api, workers=2, election=election, **settings)
        if prepare is not None:
            prepare(op)
        stop = asyncio.Event()
        task = asyncio.ensure_future(op.run(stop))
        try:
            yield InProcess(op, api.counter, task)
        finally:
            stop.set()
            if not (task.done() and isinstance(task.exception(), manager.LeadershipLost)):
                await task


def metric(text: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of one metric (``kmm_api_writes_total`` ...) by their labels."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[frozenset(sample.labels.items())] = sample.value
    return found


@contextlib.asynccontextmanager
async def own_namespace(api: client.ApiClient, prefix: str = "test") -> AsyncIterator[str]:
    """A namespace of the block's own, deleted afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(api)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            await core.delete_namespace(name)


@contextlib.asynccontextmanager
async def selecting(
    api: client.ApiClient, nodes: Sequence[str], key: str, value: str = "yes"
) -> AsyncIterator[None]:
    """Label ``nodes`` with ``key=value`` for the block; remove it afterwards."""
    core = client.CoreV1Api(api)
    try:
        for node in nodes:
            await core.patch_node(node, {"metadata": {"labels": {key: value}}})
        yield
    finally:
        for node in nodes:
            with contextlib.suppress(client.ApiException):
                await core.patch_node(node, {"metadata": {"labels": {key: None}}})


async def node_labels(api: client.ApiClient) -> dict[str, dict[str, str]]:
    listing = await client.CoreV1Api(api).list_node()
    return {n.metadata.name: dict(n.metadata.labels or {}) for n in listing.items}


async def loader_daemonsets(api: client.ApiClient, namespace: str) -> list[Any]:
    listing = await client.AppsV1Api(api).list_namespaced_daemon_set(
        namespace, label_selector=f"{labels.ROLE}=module-loader"
    )
    return sorted(listing.items, key=lambda d: d.metadata.labels[labels.KERNEL_VERSION_FULL])


async def get_module(api: client.ApiClient, namespace: str, name: str) -> Obj | None:
    try:
        found: Obj = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
        )
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise
    return found


def condition(module: Obj | None, type_: str) -> Obj | None:
    for entry in ((module or {}).get("status") or {}).get("conditions") or ():
        if entry["type"] == type_:
            found: Obj = entry
            return found
    return None


async def delete_and_wait_clean(api: client.ApiClient, namespace: str, name: str) -> None:
    """Delete a Module while the operator runs; wait until its finalizer ran and
    its DaemonSets and node labels are gone (later tests count a clean cluster)."""
    await client.CustomObjectsApi(api).delete_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
    )
    key = labels.ready(namespace, name)

    async def clean() -> bool:
        if await get_module(api, namespace, name) is not None:
            return False
        if await loader_daemonsets(api, namespace):
            return False
        return not any(key in lbl for lbl in (await node_labels(api)).values())

    await testing.eventually(clean, "module, its DaemonSets and its labels gone")


async def converged(
    api: client.ApiClient, namespace: str, name: str, expected_ready: set[str]
) -> bool:
    """Ready, every loader pod available, and the ``.ready`` label on exactly
    ``expected_ready``."""
    module = await get_module(api, namespace, name)
    ready = condition(module, "Ready")
    if ready is None or ready["status"] != "True":
        return False
    loader = (module or {}).get("status", {}).get("moduleLoader") or {}
    if loader.get("availableNumber") != len(expected_ready):
        return False
    if loader.get("desiredNumber") != len(expected_ready):
        return False
    key = labels.ready(namespace, name)
    have = {n for n, lbl in (await node_labels(api)).items() if key in lbl}
    return have == expected_ready
