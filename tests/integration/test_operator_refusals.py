"""One refusal stays local, on the session sandbox's real API server: Pod
Security, a ResourceQuota, a namespace being deleted and a failing webhook
refuse what the operator sends, and each refusal shows on what it concerns
while the rest goes ahead. And upstream KMM's own DRA Module converges.

The operator runs in this process as its deployed ServiceAccount
(``deploy/rbac``), so whatever it does to find a refusal needs no more
access than it is granted. Registry checks reach a loopback double that
has every image (``--registry-endpoint``), or none.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import test_operator_support as support
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from kmm.api import conditions, kernels, labels, preflight
from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
from kmm.oci import mediatypes
from kmm.operator import failures, writing
from kmm.operator.build import podnames
from kmm.sandbox import cluster, testing

manifests = support.manifests

SERVICE_ACCOUNT = "system:serviceaccount:kmm-system:kmm-operator"
UPSTREAM_DRA = Path(__file__).parent / "upstream" / "module-kmm-ci-dra.yaml"
# Upstream's image host, and the node its selector names.
UPSTREAM_HOST = "host.minikube.internal:5000"
UPSTREAM_NODE_LABEL = ("kubernetes.io/hostname", "minikube")
REGISTRY_HOST = "registry.refusals.test:5000"
_DIGEST = "sha256:" + "c" * 64
_PREFLIGHTS = resources.Resource(
    preflight.GROUP, preflight.VERSION, preflight.PLURAL, namespaced=False
)


@pytest.fixture(scope="module")
def deployed_rbac(sandbox: testing.RunningSandbox) -> None:
    """The operator's namespace, ServiceAccount and RBAC from deploy/."""

    async def apply() -> None:
        docs = []
        for path in ("operator/namespace.yaml", "rbac/operator.yaml"):
            docs.extend(applying.load_documents((support.DEPLOY / path).read_text()))
        async with cluster.api_client(sandbox.kubeconfig) as admin:
            await applying.apply_documents(admin, docs)

    asyncio.run(apply())


class Registry:
    """A registry on loopback that has every image (``present``) or none."""

    def __init__(self) -> None:
        self.present = True
        self.asked = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/v2/{name:.+}/manifests/{reference}", self.manifest)
        return app

    async def manifest(self, request: web.Request) -> web.Response:
        self.asked += 1
        if not self.present:
            return web.Response(status=404)
        return web.Response(
            headers={"Content-Type": mediatypes.OCI_MANIFEST, "Docker-Content-Digest": _DIGEST}
        )


@pytest.fixture
async def registry() -> AsyncIterator[tuple[Registry, str]]:
    found = Registry()
    server = TestServer(found.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield found, f"127.0.0.1:{server.port}"
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def _namespace(
    api: client.ApiClient, prefix: str, namespace_labels: dict[str, str] | None = None
) -> AsyncIterator[str]:
    async with support.own_namespace(api, prefix) as name:
        if namespace_labels:
            await client.CoreV1Api(api).patch_namespace(
                name, {"metadata": {"labels": namespace_labels}}
            )
        yield name


async def _degraded(api: client.ApiClient, namespace: str, name: str, reason: str) -> str:
    """The Degraded message once the Module is Degraded with ``reason``."""
    found: dict[str, str] = {}

    async def shown() -> bool:
        degraded = support.condition(await support.get_module(api, namespace, name), "Degraded")
        if degraded is None or (degraded["status"], degraded["reason"]) != ("True", reason):
            return False
        found["message"] = degraded["message"]
        return True

    await testing.eventually(shown, f"Degraded {reason}")
    return found["message"]


async def _warnings(api: client.ApiClient, namespace: str, reason: str) -> list[str]:
    listing = await client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"reason={reason}"
    )
    return [e.message for e in listing.items if e.type == "Warning"]


def _loader(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with one kernel mapping for every kernel, images without variables."""
    body["spec"]["moduleLoader"]["container"]["kernelMappings"] = [
        {"regexp": "^.+$", "containerImage": "example.com/kmm-test:${KERNEL_FULL_VERSION}"}
    ]
    return body


# -- the API server's refusals, as the operator's writer meets them -----------


async def test_the_api_servers_refusals_of_a_pod_are_refusals_not_outages(
    sandbox: testing.RunningSandbox, api_client: client.ApiClient, kmm_api: kube_client.Client
) -> None:
    """What a quota, Pod Security and a namespace being deleted answer a
    pod create (``writing.Writer``, for real and in a dry run): refusals of
    that object (``failures.refused``), with the server's words."""
    writer = writing.Writer(kmm_api)
    core = client.CoreV1Api(api_client)
    async with (
        _namespace(api_client, "quota") as quota,
        _namespace(
            api_client, "restricted", {"pod-security.kubernetes.io/enforce": "restricted"}
        ) as restricted,
        _namespace(api_client, "terminating") as terminating,
    ):
        await core.create_namespaced_resource_quota(
            quota, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
        )
        # A ConfigMap with a finalizer of its own holds the namespace in Terminating.
        await core.create_namespaced_config_map(
            terminating,
            {"metadata": {"name": "held", "finalizers": ["kmm.test/hold"]}, "data": {}},
        )
        await core.delete_namespace(terminating)
        try:
            for namespace, words in (
                (quota, "exceeded quota"),
                (restricted, 'violates PodSecurity "restricted:latest"'),
                (terminating, "because it is being terminated"),
            ):
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "refused", "namespace": namespace},
                    "spec": {
                        "containers": [
                            {
                                "name": "c",
                                "image": "example.com/x:1",
                                "securityContext": {"privileged": True},
                            }
                        ]
                    },
                }
                await _refused_by_the_server(core, pod, words)
                for send in (writer.create_pod, writer.dry_run_pod):
                    with pytest.raises(kube_errors.Forbidden) as refused:
                        await send(pod)
                    assert failures.refused(refused.value)
                    assert not failures.transient(refused.value)
                    assert words in failures.refusal(refused.value)
        finally:
            await core.patch_namespaced_config_map(
                "held", terminating, {"metadata": {"finalizers": None}}
            )


async def _refused_by_the_server(core: client.CoreV1Api, pod: dict[str, Any], words: str) -> None:
    """Until the server's admission refuses ``pod`` with ``words`` (a dry run).

    A quota admits everything until the quota controller has written its
    status, and a namespace's deletion reaches admission through the
    server's informers: under load either can lag the write that asked for
    it. What the writer is tested on is the refusal, not that lag."""
    seen: dict[str, str] = {}

    async def refusing() -> bool:
        try:
            await core.create_namespaced_pod(pod["metadata"]["namespace"], pod, dry_run="All")
        except client.ApiException as error:
            seen["answer"] = f"{error.status} {error.body}"
            return error.status == 403 and words in json.loads(error.body)["message"]
        seen["answer"] = "admitted"
        return False

    try:
        await testing.eventually(refusing, f"the server refusing with {words!r}")
    except AssertionError as error:
        raise AssertionError(f"{error}; its last answer: {seen.get('answer')}") from None


# -- the Module reconcile ---------------------------------------------------------


@pytest.mark.parametrize("level", ["baseline", "restricted"])
async def test_a_namespace_enforcing_pod_security_degrades_the_module_naming_it(
    sandbox: testing.RunningSandbox,
    manifests: None,
    deployed_rbac: None,
    api_client: client.ApiClient,
    level: str,
) -> None:
    """The loader DaemonSet is accepted; its privileged pods are not. The
    Module said Progressing forever; now it says why."""
    enforce = {"pod-security.kubernetes.io/enforce": level}
    select = "kmm-test/pss"
    name = "refused"
    async with (
        _namespace(api_client, "pss", enforce) as namespace,
        support.selecting(api_client, sandbox.node_names[:1], select),
        support.operator_in_process(sandbox.kubeconfig, impersonate=SERVICE_ACCOUNT) as running,
    ):
        await support.create_module(
            api_client, namespace, _loader(support.module_body(name, {select: "yes"}))
        )
        message = await _degraded(api_client, namespace, name, conditions.REASON_POD_REFUSED)
        (daemonset,) = await support.loader_daemonsets(api_client, namespace)
        assert message.startswith(
            f"the pods of DaemonSet {daemonset.metadata.name} are refused: 403 Forbidden: "
        )
        assert f'violates PodSecurity "{level}:latest"' in message
        ready = support.condition(await support.get_module(api_client, namespace, name), "Ready")
        assert ready is not None
        assert (ready["status"], ready["reason"]) == ("False", conditions.REASON_POD_REFUSED)
        assert await _warnings(api_client, namespace, "PodRefused") == [message]
        # Told once: a settled refusal costs no write.
        await running.wait_idle("the refusal shown")
        writes = running.counter.total_writes
        running.op.resync()
        await running.wait_idle("a resync of the refused Module")
        assert running.counter.total_writes == writes
        await support.delete_and_wait_clean(api_client, namespace, name)


def _two_kernels(sandbox: testing.RunningSandbox) -> list[str]:
    """Two session nodes of different kernels (one loader DaemonSet each)."""
    first, second = sandbox.node_names[0], sandbox.node_names[1]
    assert sandbox.kernels[0] != sandbox.kernels[1]
    return [first, second]


async def test_a_quota_refusing_a_daemonset_degrades_the_module_and_the_other_goes(
    sandbox: testing.RunningSandbox,
    manifests: None,
    deployed_rbac: None,
    api_client: client.ApiClient,
) -> None:
    select = "kmm-test/quota"
    name = "counted"
    chosen = _two_kernels(sandbox)
    async with (
        _namespace(api_client, "ds-quota") as namespace,
        support.selecting(api_client, chosen, select),
    ):
        await client.CoreV1Api(api_client).create_namespaced_resource_quota(
            namespace,
            {"metadata": {"name": "one"}, "spec": {"hard": {"count/daemonsets.apps": "1"}}},
        )
        async with support.operator_in_process(sandbox.kubeconfig, impersonate=SERVICE_ACCOUNT):
            await support.create_module(
                api_client, namespace, _loader(support.module_body(name, {select: "yes"}))
            )
            message = await _degraded(
                api_client, namespace, name, conditions.REASON_DAEMONSET_REFUSED
            )
            assert "403 Forbidden: daemonsets.apps" in message
            assert "exceeded quota: one" in message
            # The other kernel's DaemonSet went, its pod ran, its node says loaded.
            (made,) = await support.loader_daemonsets(api_client, namespace)
            assert made.metadata.name not in message
            ready = labels.ready(namespace, name)

            async def one_loaded() -> bool:
                found = await support.node_labels(api_client)
                return sum(ready in found[node] for node in chosen) == 1

            await testing.eventually(one_loaded, "the admitted kernel loaded")
            assert await _warnings(api_client, namespace, "DaemonSetRefused") == [message]
            await support.delete_and_wait_clean(api_client, namespace, name)


async def test_a_daemonset_write_the_server_fails_shows_its_message_and_the_other_goes(
    sandbox: testing.RunningSandbox,
    manifests: None,
    deployed_rbac: None,
    api_client: client.ApiClient,
) -> None:
    """A 500 (here a webhook the API server cannot call, on one kernel's
    DaemonSet) was retried forever without a word; now it is Degraded with
    the server's message."""
    select = "kmm-test/webhook"
    name = "failing"
    chosen = _two_kernels(sandbox)
    failing_kernel = labels.kernel_value(kernels.node_kernel(sandbox.kernels[1]))
    registration = client.AdmissionregistrationV1Api(api_client)
    async with (
        _namespace(api_client, "webhook") as namespace,
        support.selecting(api_client, chosen, select),
    ):
        webhook = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": f"refuse-{namespace}"},
            "webhooks": [
                {
                    "name": "refuse.kmm.test",
                    # Loopback, where nothing listens: the call fails at once.
                    "clientConfig": {"url": "https://127.0.0.1:1/refuse"},
                    "rules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["daemonsets"],
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "objectSelector": {"matchLabels": {labels.KERNEL_VERSION_FULL: failing_kernel}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 2,
                }
            ],
        }
        await registration.create_validating_webhook_configuration(webhook)
        try:
            async with support.operator_in_process(sandbox.kubeconfig, impersonate=SERVICE_ACCOUNT):
                await support.create_module(
                    api_client, namespace, _loader(support.module_body(name, {select: "yes"}))
                )
                message = await _degraded(
                    api_client, namespace, name, conditions.REASON_DAEMONSET_REFUSED
                )
                assert (
                    "500 InternalError: Internal error occurred: failed calling webhook" in message
                )
                assert "refuse.kmm.test" in message
                (made,) = await support.loader_daemonsets(api_client, namespace)
                assert made.metadata.labels[labels.KERNEL_VERSION_FULL] != failing_kernel
                await registration.delete_validating_webhook_configuration(f"refuse-{namespace}")
                # Retried with backoff: once the server takes it, Degraded goes.

                async def both() -> bool:
                    return len(await support.loader_daemonsets(api_client, namespace)) == 2

                await testing.eventually(both, "the failed DaemonSet made once it can be")
                await support.delete_and_wait_clean(api_client, namespace, name)
        finally:
            with contextlib.suppress(client.ApiException):
                await registration.delete_validating_webhook_configuration(f"refuse-{namespace}")


# -- preflight ------------------------------------------------------------------------


def _building_module(name: str) -> dict[str, Any]:
    """A Module on no node that builds its image (in the registry double)
    when missing: only a PreflightValidation makes pods for it."""
    body = support.module_body(
        name,
        {"kmm-test/preflight": "nowhere"},
        moduleLoader={
            "container": {
                "modprobe": {"moduleName": "kmm_test"},
                "kernelMappings": [
                    {
                        "regexp": "^.+$",
                        "containerImage": f"{REGISTRY_HOST}/{name}:${{KERNEL_FULL_VERSION}}",
                        "registryTLS": {"insecure": True},
                        "build": {"dockerfileConfigMap": {"name": "dockerfile"}},
                    }
                ],
            }
        },
    )
    del body["spec"]["imageRepoSecret"]
    return body


async def test_a_refused_preflight_pod_is_its_modules_verdict_and_the_other_goes(
    sandbox: testing.RunningSandbox,
    manifests: None,
    deployed_rbac: None,
    api_client: client.ApiClient,
    registry: tuple[Registry, str],
) -> None:
    double, host = registry
    double.present = False  # every image is missing: each Module needs a pod
    core = client.CoreV1Api(api_client)
    validation = f"refusals-{sandbox.kernels[0].replace('+', '')}"
    async with (
        _namespace(api_client, "pf-quota") as refusing,
        _namespace(api_client, "pf-open") as open_,
        cluster.api_client(sandbox.kubeconfig) as admin,
    ):
        await core.create_namespaced_resource_quota(
            refusing, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
        )
        for namespace in (refusing, open_):
            await core.create_namespaced_config_map(
                namespace,
                {"metadata": {"name": "dockerfile"}, "data": {"dockerfile": "FROM scratch\n"}},
            )
            await support.create_module(api_client, namespace, _building_module("built"))
        async with support.operator_in_process(
            sandbox.kubeconfig,
            impersonate=SERVICE_ACCOUNT,
            registry_endpoints={REGISTRY_HOST: host},
        ):
            await admin.request(
                "POST",
                _PREFLIGHTS.path(),
                body={
                    "apiVersion": preflight.API_VERSION,
                    "kind": preflight.KIND,
                    "metadata": {"name": validation},
                    "spec": {"kernelVersion": sandbox.kernels[0]},
                },
            )
            try:
                verdicts: dict[str, dict[str, Any]] = {}

                async def judged() -> bool:
                    found = await admin.request("GET", _PREFLIGHTS.path(name=validation))
                    entries = (found.get("status") or {}).get("modules") or ()
                    verdicts.clear()
                    verdicts.update({e["namespace"]: e for e in entries})
                    return (
                        verdicts.get(refusing, {}).get("verificationStatus") == "Failure"
                        and verdicts.get(open_, {}).get("pod") is not None
                    )

                await testing.eventually(judged, "a verdict for each Module")
                refused = verdicts[refusing]
                name = podnames.preflight_pod_name(validation, "built")
                assert refused["statusReason"].startswith(
                    f"{preflight.REASON_BUILD_FAILED}: the API server refused pod "
                    f"{refusing}/{name}: 403 Forbidden: "
                )
                assert "exceeded quota: no-pods" in refused["statusReason"]
                assert verdicts[open_]["verificationStatus"] == "InProgress"
                made = await core.list_namespaced_pod(
                    open_, label_selector=f"{labels.PREFLIGHT}={validation}"
                )
                assert [p.metadata.name for p in made.items] == [
                    podnames.preflight_pod_name(validation, "built")
                ]
            finally:
                await admin.request("DELETE", _PREFLIGHTS.path(name=validation))
                for namespace in (refusing, open_):
                    await support.delete_and_wait_clean(api_client, namespace, "built")


# -- upstream KMM's DRA Module ---------------------------------------------------------


@contextlib.asynccontextmanager
async def _named_minikube(api: client.ApiClient, node: str) -> AsyncIterator[None]:
    """``node`` carries the hostname label of upstream CI's one node for the block."""
    core = client.CoreV1Api(api)
    key, value = UPSTREAM_NODE_LABEL
    before = (await core.read_node(node)).metadata.labels.get(key)
    await core.patch_node(node, {"metadata": {"labels": {key: value}}})
    try:
        yield
    finally:
        await core.patch_node(node, {"metadata": {"labels": {key: before}}})


async def test_upstreams_dra_module_converges(
    sandbox: testing.RunningSandbox,
    manifests: None,
    deployed_rbac: None,
    api_client: client.ApiClient,
    registry: tuple[Registry, str],
) -> None:
    """Upstream's ``ci/module-kmm-ci-dra.yaml`` as stored: its env sets
    DRIVER_NAME, which kmm presets. The server-side apply refused the
    DaemonSet (500, duplicate entries) and the Module showed nothing while
    the reconcile retried forever. Now it converges: DRIVER_NAME once, the
    user's value, the driver running, the DeviceClass made, Ready."""
    (module,) = [d for d in yaml.safe_load_all(UPSTREAM_DRA.read_text()) if d]
    _, host = registry  # it has the image: the Module's build is not needed
    node = sandbox.node_names[2]
    core = client.CoreV1Api(api_client)
    name = module["metadata"]["name"]
    async with (
        support.own_namespace(api_client, "upstream-dra") as namespace,
        _named_minikube(api_client, node),
        support.operator_in_process(
            sandbox.kubeconfig,
            impersonate=SERVICE_ACCOUNT,
            registry_endpoints={UPSTREAM_HOST: host},
        ) as running,
    ):
        # What upstream's CI installs beside it: the example driver's account.
        await core.create_namespaced_service_account(
            namespace, {"metadata": {"name": "dra-example-driver"}}
        )
        await support.create_module(api_client, namespace, copy.deepcopy(module))

        async def ready() -> bool:
            found = await support.get_module(api_client, namespace, name)
            condition = support.condition(found, "Ready")
            counts = (found or {}).get("status") or {}
            return (
                condition is not None
                and condition["status"] == "True"
                and (counts.get("dra") or {}).get("availableNumber") == 1
                and (counts.get("moduleLoader") or {}).get("availableNumber") == 1
            )

        await testing.eventually(ready, "upstream's DRA Module Ready, its counts written")
        listing = await client.AppsV1Api(api_client).list_namespaced_daemon_set(
            namespace, label_selector=f"{labels.ROLE}=dra"
        )
        (driver,) = listing.items
        (container,) = driver.spec.template.spec.containers
        assert [e.value for e in container.env if e.name == "DRIVER_NAME"] == ["gpu.example.com"]
        assert container.image == module["spec"]["dra"]["container"]["image"]
        assert driver.status.number_ready == 1
        found = await support.get_module(api_client, namespace, name)
        assert found is not None
        (image,) = found["status"]["images"]
        assert image["state"] == "Exists"
        degraded = support.condition(found, "Degraded")
        assert degraded is not None
        assert degraded["status"] == "False"
        classes = await client.CustomObjectsApi(api_client).get_cluster_custom_object(
            "resource.k8s.io", "v1", "deviceclasses", "kmm-ci-test-device"
        )
        assert classes["metadata"]["labels"][labels.MODULE_NAMESPACE] == namespace
        # Converged: a resync writes nothing (no retry loop).
        await running.wait_idle("upstream's DRA Module converged")
        writes = running.counter.total_writes
        running.op.resync()
        await running.wait_idle("a resync")
        assert running.counter.total_writes == writes
        await support.delete_and_wait_clean(api_client, namespace, name)
