"""The operator builds and signs missing images in the cluster (issue 25).

One sandbox for the module: a container node (where build and sign pods
really run: buildah in the builder image ``make image`` made), two KWOK
nodes (where loader pods run, fake), and the registry with credentials.
The operator runs in the test process, outside the sandbox's network: it
reaches the registry that image references name ``10.253.0.1:5000`` at its
loopback port (``--registry-endpoint``), trusting the sandbox CA
(``--registry-ca``), whose certificate names both.

Kernels: ``K1`` is the kbuild image's (``build/images/kbuild.kernel``,
derived from its headers, never written here), ``K2`` another. The Modules
tolerate the KWOK nodes' taint, so their build and sign pods do too:
``build.selector`` pins those to the container node (KWOK would "run" them
for ever). What is shown, sharing builds between tests where one finds the
Module an earlier test left (each makes its own otherwise: no test needs
another to have run):

- a real module compiled against kbuild's headers and signed: one build pod,
  then one sign pod; no image under the final name before the sign pod
  succeeded; K1's loader DaemonSet only once the image exists, K2's (whose
  image exists) at once;
- a Dockerfile that fails: Degraded naming the pod and the failing step,
  no new build pod over several reconciles; the ConfigMap fixed: exactly
  one new build, then Ready;
- a converged Module: zero registry requests over several reconciles;
- the image deleted and ``imageRebuildTriggerGeneration`` bumped: rebuilt
  once, the running loader pods untouched;
- a signing key that does not match: SignFailed; the key fixed in the same
  Secret: one new sign pod, and still one build pod;
- a wrong password in ``imageRepoSecret``: an authentication error on the
  Module, no build pod;
- a build-only pod that no node can take yet: Unschedulable on the Module;
  ``sign`` added meanwhile: the pod is replaced, and once a node takes it
  only the signed image ever carries the final name (one manifest PUT of
  that tag, its module signed);
- kmm knows what it pushed: the signed image carries its labels (signed,
  the certificate's fingerprint), its intermediate image is deleted once
  signed (a DELETE in the registry's log), and the loader runs it by
  digest; an intermediate image an earlier build left (another Dockerfile)
  is built again, never signed, by an operator restarted in the middle;
- ``sign`` added to a Module whose unsigned module a node refuses (the
  image's modprobe refuses a module without a signature, as Secure Boot
  does): rebuilt and signed, the loader pod that never loaded replaced, the
  node loads the new image by digest, Ready with no other action;
- an image only the nodes reach (the operator's endpoint for the registry
  goes nowhere): a pull pod says it is missing, it is built, a pull pod
  says it exists, and its loader runs.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import buildsign_support
import containersandbox
import pytest
import test_operator_support as support

from kmm.api import labels, modules
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
from kmm.oci import configs, references
from kmm.operator.build import images, inputs, podnames
from kmm.operator.build import settings as build_settings
from kmm.sandbox import cluster, pki, registry, testing

IMAGES = Path("build/images")
BUILDER = Path("build/kmm-builder-image.tar")
DOCKERFILE = Path("tests/buildsign/Dockerfile")
NAMESPACE = "default"
K2 = "6.1.0-27-amd64"
_USER, _PASSWORD = "builder", "s3cret:build"
_SECRETS = resources.Resource("", "v1", "secrets")
_CONFIGMAPS = resources.Resource("", "v1", "configmaps")
_MODULES = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)
_KWOK_TOLERATION = {"key": "kmm.sandbox/kwok", "operator": "Exists", "effect": "NoSchedule"}
# Polling for fixed inputs, short for the test (the flag's default is 10 s).
_POLL = 1.0
_LONG = 1500  # seconds: a build on two shared cores, pulls included


class Sandbox:
    """The module's sandbox and what the fixture pushed."""

    def __init__(self, record: cluster.state.SandboxState, kernel: str) -> None:
        self.record = record
        self.kernel = kernel
        assert record.registry is not None
        self.host = record.registry.reference_host
        self.ca = pki.Pki(record.directory / "pki").ca_cert
        (self.node,) = record.kubelet_nodes  # where build and sign pods run
        self.builder = ""
        self.kbuild = ""
        self.loader = ""


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    kernel = (IMAGES / "kbuild.kernel").read_text().strip()
    auth = registry.Auth(_USER, _PASSWORD)
    with containersandbox.started(
        "kbo", kubelet_nodes=1, registry_auth=auth, nodes=2, kernels=(kernel, K2)
    ) as record:
        found = Sandbox(record, kernel)
        found.builder = containersandbox.push(record.directory, BUILDER, "kmm/builder:1")
        found.kbuild = containersandbox.push(record.directory, IMAGES / "kbuild.tar", "ci/kbuild:1")
        found.loader = containersandbox.push(record.directory, IMAGES / "loader.tar", "ci/loader:1")
        asyncio.run(support.install_manifests(record.kubeconfig))
        yield found


@pytest.fixture
async def api(sandbox: Sandbox) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(sandbox.record.kubeconfig) as found:
        yield found


# A loopback port nothing listens on (tcpmux): an operator told to dial the
# registry there gets no answer from it, as one outside the nodes' network.
_NOWHERE = "127.0.0.1:1"


@contextlib.asynccontextmanager
async def _operator(sandbox: Sandbox, *, endpoint: str | None = None) -> AsyncIterator[support.InProcess]:  # fmt: skip
    assert sandbox.record.registry is not None
    settings = build_settings.Settings(
        builder_image=sandbox.builder,
        registry_ca=sandbox.ca.read_text(),
        poll=_POLL,
    )
    async with support.operator_in_process(
        sandbox.record.kubeconfig,
        build=settings,
        registry_ca_files=(sandbox.ca,),
        registry_endpoints={sandbox.host: endpoint or sandbox.record.registry.host},
    ) as running:
        yield running
    # The operator's clients closed their TLS connections; the closing
    # handshakes finish on this loop, which ends with the test.
    await asyncio.sleep(0.2)


def _pull_secret(sandbox: Sandbox, name: str, *, password: str = _PASSWORD) -> dict[str, Any]:
    pair = base64.b64encode(f"{_USER}:{password}".encode()).decode()
    config = json.dumps({"auths": {sandbox.host: {"auth": pair}}}).encode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config).decode()},
    }


def _opaque(name: str, data: dict[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def _dockerfile(name: str, text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"dockerfile": text},
    }


async def _create(api: kube_client.Client, resource: resources.Resource, body: dict[str, Any]) -> None:  # fmt: skip
    await api.request("POST", resource.path(namespace=NAMESPACE), body=body)


async def _replace(api: kube_client.Client, resource: resources.Resource, body: dict[str, Any]) -> None:  # fmt: skip
    name = body["metadata"]["name"]
    await api.request(
        "PATCH",
        resource.path(namespace=NAMESPACE, name=name),
        body={"data": body["data"]},
        content_type=kube_client.MERGE_PATCH,
    )


def _module(
    name: str,
    secret: str,
    mappings: list[dict[str, Any]],
    *,
    builds_on: str | None = None,
    **container: Any,
) -> dict[str, Any]:
    """A Module whose loaders go to the KWOK nodes (tolerating their taint).
    Build and sign pods carry that toleration too, as KMM's do, and KWOK
    "runs" any pod it gets for ever: ``builds_on`` pins them, through
    ``build.selector``, to the container node of that name."""
    if builds_on is not None and "build" in container:
        container["build"] = {
            **container["build"],
            "selector": {"kubernetes.io/hostname": builds_on},
        }
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "selector": {"type": "kwok"},
            "tolerations": [_KWOK_TOLERATION],
            "imageRepoSecret": {"name": secret},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "kmm_ci_a", "dirName": "/opt"},
                    "kernelMappings": mappings,
                    **container,
                }
            },
        },
    }


async def _get_module(api: kube_client.Client, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await api.request("GET", _MODULES.path(namespace=NAMESPACE, name=name))
    return found


async def _until(
    api: kube_client.Client,
    name: str,
    done: Callable[[dict[str, Any]], bool],
    what: str,
    *,
    each: Callable[[], Any] | None = None,
    bound: float = _LONG,
) -> dict[str, Any]:
    """The Module once ``done`` says so; ``each`` runs at every look."""
    found: dict[str, Any] = {}
    try:
        async with asyncio.timeout(bound):
            while True:
                if each is not None:
                    await each()
                found = await _get_module(api, name)
                if done(found):
                    return found
                await asyncio.sleep(1)
    except TimeoutError:
        raise AssertionError(f"{what}: never; last status {found.get('status')}") from None


def _images(module: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["kernel"]: i for i in (module.get("status") or {}).get("images") or ()}


def _state(kernel: str, state: str) -> Callable[[dict[str, Any]], bool]:
    return lambda module: _images(module).get(kernel, {}).get("state") == state


def _condition(module: dict[str, Any], type_: str) -> dict[str, Any]:
    for found in (module.get("status") or {}).get("conditions") or ():
        if found["type"] == type_:
            return dict(found)
    return {}


async def _events(api: kube_client.Client, name: str) -> collections.Counter[str]:
    found = await api.request(
        "GET",
        resources.EVENTS.path(namespace=NAMESPACE),
        query={"fieldSelector": f"involvedObject.name={name},involvedObject.kind=Module"},
    )
    return collections.Counter(e["reason"] for e in found["items"])


async def _loader_daemonsets(api: kube_client.Client, name: str) -> dict[str, str]:
    """Kernel label -> name of the Module's loader DaemonSets."""
    found = await api.request(
        "GET",
        resources.DAEMONSETS.path(namespace=NAMESPACE),
        query={"labelSelector": f"{labels.MODULE_NAME}={name},{labels.ROLE}=module-loader"},
    )
    return {
        ds["metadata"]["labels"][labels.KERNEL_VERSION_FULL]: ds["metadata"]["name"]
        for ds in found["items"]
    }


async def _loader_pods(api: kube_client.Client, name: str) -> dict[str, str]:
    """Pod name -> uid of the Module's loader pods."""
    found = await api.request(
        "GET",
        resources.PODS.path(namespace=NAMESPACE),
        query={"labelSelector": f"{labels.MODULE_NAME}={name},{labels.ROLE}=module-loader"},
    )
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in found["items"]}


async def _exists(sandbox: Sandbox, image: str) -> bool:
    parsed = references.parse(image)
    async with registry.client(sandbox.record) as client:
        return await client.exists(parsed.name, parsed.reference) is not None


async def _inspect(sandbox: Sandbox, image: str) -> configs.Inspected:
    parsed = references.parse(image)
    async with registry.client(sandbox.record) as client:
        found = await configs.inspect(client, parsed.name, parsed.reference, keep=labels.PREFIX)
    assert found is not None, image
    return found


async def _loader_image(api: kube_client.Client, name: str, kernel: str) -> str:
    """The image the Module's loader DaemonSet for ``kernel`` runs."""
    found = await api.request(
        "GET",
        resources.DAEMONSETS.path(namespace=NAMESPACE),
        query={
            "labelSelector": f"{labels.MODULE_NAME}={name},"
            f"{labels.KERNEL_VERSION_FULL}={labels.kernel_value(kernel)}"
        },
    )
    (ds,) = found["items"]
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])


async def _delete_image(sandbox: Sandbox, image: str) -> None:
    parsed = references.parse(image)
    async with registry.client(sandbox.record) as client:
        found = await client.head_manifest(parsed.name, parsed.reference)
        await client.delete_manifest(parsed.name, found.digest)


async def _rebuild(api: kube_client.Client, name: str, generation: int) -> None:
    """Ask for a rebuild (``imageRebuildTriggerGeneration``) and wait until
    the status says every image exists for it."""
    await api.request(
        "PATCH",
        _MODULES.path(namespace=NAMESPACE, name=name),
        body={"spec": {"imageRebuildTriggerGeneration": generation}},
        content_type=kube_client.MERGE_PATCH,
    )
    await _until(
        api, name,
        lambda m: (m.get("status") or {}).get("imageRebuildTriggerGeneration") == generation,
        "status.imageRebuildTriggerGeneration",
    )  # fmt: skip


async def _delete_module(api: kube_client.Client, name: str) -> None:
    """Delete the Module and wait until it is gone: call it while the
    operator runs (it removes the finalizer once the loader pods are gone)."""
    path = _MODULES.path(namespace=NAMESPACE, name=name)
    with contextlib.suppress(kube_errors.NotFound):
        await api.request("DELETE", path)

    async def gone() -> bool:
        try:
            await api.request("GET", path)
        except kube_errors.NotFound:
            return True
        return False

    await testing.eventually(gone, f"Module {name} deleted", bound=180)


async def _reconciles(running: support.InProcess, count: int) -> None:
    """Wait for ``count`` more reconciles. A Module whose pod failed is
    requeued every poll, so the operator is never idle meanwhile."""
    start = running.op.counting.done

    async def done() -> bool:
        return running.op.counting.done >= start + count

    running.op.resync()
    await testing.eventually(done, f"{count} reconciles")


def _tag(kernel: str) -> str:
    return kernel.replace("+", "_")


def _quick_dockerfile(sandbox: Sandbox, *, failing: bool = False) -> str:
    """Two ``.ko`` files on the loader image, without compiling (quick)."""
    step = (
        'RUN echo "kmm-ci: compiling against missing headers" >&2 && exit 3'
        if failing
        else "RUN true"
    )
    return (
        f"FROM {sandbox.loader}\n"
        "ARG KERNEL_FULL_VERSION\n"
        f"{step}\n"
        "RUN mkdir -p /opt/lib/modules/${KERNEL_FULL_VERSION} && "
        "printf 'a' >/opt/lib/modules/${KERNEL_FULL_VERSION}/kmm_ci_a.ko && "
        "printf 'b' >/opt/lib/modules/${KERNEL_FULL_VERSION}/kmm_ci_b.ko\n"
    )


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


def _key_and_cert(directory: Path, stem: str) -> tuple[bytes, bytes]:
    _openssl(
        directory, "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN=kmm {stem}", "-keyout", f"{stem}.key", "-out", f"{stem}.crt",
    )  # fmt: skip
    return (directory / f"{stem}.key").read_bytes(), (directory / f"{stem}.crt").read_bytes()


async def test_a_missing_image_is_built_and_signed_before_its_loader_runs(
    sandbox: Sandbox, api: kube_client.Client, tmp_path: Path
) -> None:
    """A real module compiled against kbuild's headers, signed; K2 served meanwhile."""
    name = f"ci-{uuid.uuid4().hex[:6]}"
    key, cert = _key_and_cert(tmp_path, "signer")
    final = f"{sandbox.host}/ci/{name}:{_tag(sandbox.kernel)}"
    served = f"{sandbox.host}/ci/{name}:{_tag(K2)}"
    # K2's image exists already: a copy of the loader image under its name.
    containersandbox.push(sandbox.record.directory, IMAGES / "loader.tar", f"ci/{name}:{_tag(K2)}")
    await _create(api, _SECRETS, _pull_secret(sandbox, f"{name}-repo"))
    await _create(api, _SECRETS, _opaque("build-secret", {"ci-build-secret": b"the secret\n"}))
    await _create(api, _SECRETS, _opaque(f"{name}-key", {"key": key}))
    await _create(api, _SECRETS, _opaque(f"{name}-cert", {"cert": cert}))
    await _create(api, _CONFIGMAPS, _dockerfile(f"{name}-dockerfile", DOCKERFILE.read_text()))
    body = _module(
        name,
        f"{name}-repo",
        [
            {"literal": sandbox.kernel, "containerImage": final},
            {"literal": K2, "containerImage": served},
        ],
        build={
            "dockerfileConfigMap": {"name": f"{name}-dockerfile"},
            "secrets": [{"name": "build-secret"}],
            "buildArgs": [
                {"name": "KBUILD_IMAGE", "value": sandbox.kbuild},
                {"name": "LOADER_IMAGE", "value": sandbox.loader},
                {"name": "KMM_CI_VERSION", "value": "1.0-ci"},
            ],
        },
        sign={
            "keySecret": {"name": f"{name}-key"},
            "certSecret": {"name": f"{name}-cert"},
            # A glob, not ${KERNEL_FULL_VERSION}: that variable is the tag-safe
            # form ("+" -> "_"), the modules' directory the kernel itself.
            "filesToSign": ["/opt/lib/modules/*/kmm_ci_a.ko"],
        },
        builds_on=sandbox.node,
    )
    intermediate = images.intermediate_image(final)
    early: list[str] = []  # the final image seen before any sign pod was made
    between: list[bool] = []  # built, not signed yet: whether the final image was there
    k1_before_image: list[str] = []

    async def watch() -> None:
        reasons = await _events(api, name)
        final_there = await _exists(sandbox, final)
        if final_there and reasons["SignCreated"] == 0:
            early.append(str(reasons))
        if reasons["SignCreated"] == 0 and await _exists(sandbox, intermediate):
            between.append(final_there)
        daemonsets = await _loader_daemonsets(api, name)
        if labels.kernel_value(sandbox.kernel) in daemonsets and not final_there:
            k1_before_image.append(daemonsets[labels.kernel_value(sandbox.kernel)])

    async with _operator(sandbox):
        await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=body)
        try:
            # K2 is served while K1 builds.
            await _until(
                api, name,
                lambda m: _state(K2, "Exists")(m) and _state(sandbox.kernel, "Building")(m),
                "K2's image found and K1's building",
            )  # fmt: skip
            daemonsets = await _loader_daemonsets(api, name)
            assert labels.kernel_value(K2) in daemonsets
            assert labels.kernel_value(sandbox.kernel) not in daemonsets
            await _until(api, name, _state(sandbox.kernel, "Exists"), "K1's image", each=watch)
            await _until(
                api, name, lambda m: _condition(m, "Ready").get("status") == "True", "Ready",
                each=watch,
            )  # fmt: skip
            assert early == []
            assert not any(between)
            assert k1_before_image == []
            assert labels.kernel_value(sandbox.kernel) in await _loader_daemonsets(api, name)
            reasons = await _events(api, name)
            assert (reasons["BuildCreated"], reasons["SignCreated"]) == (1, 1), reasons
            assert (reasons["BuildSucceeded"], reasons["SignSucceeded"]) == (1, 1), reasons
            # kmm_ci_b.ko is not listed: only the listed one was signed, no warning.
            assert reasons["FilesToSignUnmatched"] == 0
            # What made it is in its config; the intermediate image is gone.
            found = await _inspect(sandbox, final)
            assert found.labels is not None
            assert found.labels[labels.IMAGE_SIGNED] == "true"
            assert found.labels[labels.IMAGE_SIGNING_CERT] == inputs.fingerprint(cert)
            assert found.labels[labels.IMAGE_BUILD_HASH]
            assert not await _exists(sandbox, intermediate)
            parsed = references.parse(intermediate)
            assert any(
                r[0] == "DELETE" and r[1].startswith(f"/v2/{parsed.name}/manifests/sha256:") and r[2] == 202
                for r in buildsign_support.requests(sandbox.record)
            )  # fmt: skip
            assert await _loader_image(api, name, sandbox.kernel) == f"{final}@{found.digest}"

            # The final image deleted and a rebuild asked for: the
            # intermediate image the first build left is stale, so the
            # kernel is built again, then signed; the loader is untouched.
            loaders = await _loader_pods(api, name)
            await _delete_image(sandbox, final)
            await _rebuild(api, name, 1)
            assert await _exists(sandbox, final)
            reasons = await _events(api, name)
            assert (reasons["BuildCreated"], reasons["SignCreated"]) == (2, 2), reasons
            assert (reasons["BuildSucceeded"], reasons["SignSucceeded"]) == (2, 2), reasons
            assert await _loader_pods(api, name) == loaders
        finally:
            await _delete_module(api, name)


@pytest.fixture(scope="module")
def quick() -> dict[str, Any]:
    """State the quick-Dockerfile tests share (one Module, built once)."""
    return {}


async def test_a_failed_build_is_kept_until_its_configmap_is_fixed(
    sandbox: Sandbox, api: kube_client.Client, quick: dict[str, Any]
) -> None:
    name = f"fx-{uuid.uuid4().hex[:6]}"
    final = f"{sandbox.host}/ci/{name}:{_tag(sandbox.kernel)}"
    await _create(api, _SECRETS, _pull_secret(sandbox, f"{name}-repo"))
    config = _dockerfile(f"{name}-dockerfile", _quick_dockerfile(sandbox, failing=True))
    await _create(api, _CONFIGMAPS, config)
    body = _module(
        name,
        f"{name}-repo",
        [{"literal": sandbox.kernel, "containerImage": final}],
        build={"dockerfileConfigMap": {"name": f"{name}-dockerfile"}},
        builds_on=sandbox.node,
    )
    await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=body)
    quick.update(name=name, final=final)
    async with _operator(sandbox) as running:
        failed = await _until(api, name, _state(sandbox.kernel, "BuildFailed"), "BuildFailed")
        degraded = _condition(failed, "Degraded")
        pod = podnames.pod_name(name, "build", sandbox.kernel)
        assert degraded["status"] == "True"
        assert degraded["reason"] == "BuildFailed"
        assert pod in degraded["message"]
        assert "compiling against missing headers" in degraded["message"], degraded
        # Several reconciles (each polls the inputs): no new build pod.
        await _reconciles(running, 5)
        reasons = await _events(api, name)
        assert reasons["BuildCreated"] == 1
        assert reasons["BuildFailed"] == 1  # told once, not per reconcile
        config["data"]["dockerfile"] = _quick_dockerfile(sandbox)
        await _replace(api, _CONFIGMAPS, config)
        await _until(
            api, name, lambda m: _condition(m, "Ready").get("status") == "True", "Ready after fix"
        )
        reasons = await _events(api, name)
        assert reasons["BuildCreated"] == 2
        assert reasons["BuildSucceeded"] == 1
        assert await _exists(sandbox, final)


async def _quick_module(
    sandbox: Sandbox, api: kube_client.Client, quick: dict[str, Any]
) -> tuple[str, str]:
    """(name, final image) of a Module built from the quick Dockerfile and
    Ready: the one an earlier test of this module left, else one made and
    built here (its operator stopped again)."""
    name = quick.get("name")
    if name is not None:
        with contextlib.suppress(kube_errors.NotFound):
            if _condition(await _get_module(api, name), "Ready").get("status") == "True":
                return name, quick["final"]
    name = f"qk-{uuid.uuid4().hex[:6]}"
    final = f"{sandbox.host}/ci/{name}:{_tag(sandbox.kernel)}"
    await _create(api, _SECRETS, _pull_secret(sandbox, f"{name}-repo"))
    await _create(api, _CONFIGMAPS, _dockerfile(f"{name}-dockerfile", _quick_dockerfile(sandbox)))
    body = _module(
        name,
        f"{name}-repo",
        [{"literal": sandbox.kernel, "containerImage": final}],
        build={"dockerfileConfigMap": {"name": f"{name}-dockerfile"}},
        builds_on=sandbox.node,
    )
    await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=body)
    async with _operator(sandbox):
        await _until(api, name, lambda m: _condition(m, "Ready").get("status") == "True", "Ready")
    quick.update(name=name, final=final)
    return name, final


async def test_a_converged_module_asks_no_registry(
    sandbox: Sandbox, api: kube_client.Client, quick: dict[str, Any]
) -> None:
    """A built Module under a restarted operator: one check each after the
    restart, then none however often it reconciles."""
    name, _ = await _quick_module(sandbox, api, quick)
    async with _operator(sandbox) as running:
        await running.wait_idle("converged")
        checks = running.op.asker.requests
        assert checks > 0  # the restart asked once
        writes = running.counter.total_writes
        done = running.op.counting.done
        for _ in range(5):
            running.op.resync()
            await running.wait_idle("resynced")
        assert running.op.counting.done >= done + 5
        assert running.op.asker.requests == checks
        assert running.counter.total_writes == writes  # no status write, no Event
        assert _state(sandbox.kernel, "Exists")(await _get_module(api, name))


async def test_a_bumped_trigger_rebuilds_a_deleted_image_once(
    sandbox: Sandbox, api: kube_client.Client, quick: dict[str, Any]
) -> None:
    name, final = await _quick_module(sandbox, api, quick)
    async with _operator(sandbox) as running:
        await running.wait_idle("converged")
        before = await _loader_pods(api, name)
        assert before  # a loader pod runs on the K1 node
        built = (await _events(api, name))["BuildCreated"]
        await _delete_image(sandbox, final)
        assert not await _exists(sandbox, final)
        await _rebuild(api, name, 1)
        assert await _exists(sandbox, final)
        assert (await _events(api, name))["BuildCreated"] == built + 1
        assert await _loader_pods(api, name) == before  # not disturbed
        for _ in range(2):
            running.op.resync()
            await running.wait_idle("resynced")
        assert (await _events(api, name))["BuildCreated"] == built + 1
        await _delete_module(api, name)
        quick.clear()


async def test_a_wrong_signing_key_fails_the_sign_until_the_secret_is_fixed(
    sandbox: Sandbox, api: kube_client.Client, tmp_path: Path
) -> None:
    name = f"sg-{uuid.uuid4().hex[:6]}"
    final = f"{sandbox.host}/ci/{name}:{_tag(sandbox.kernel)}"
    key, cert = _key_and_cert(tmp_path, "right")
    other, _ = _key_and_cert(tmp_path, "wrong")
    await _create(api, _SECRETS, _pull_secret(sandbox, f"{name}-repo"))
    wrong = _opaque(f"{name}-key", {"key": other})
    await _create(api, _SECRETS, wrong)
    await _create(api, _SECRETS, _opaque(f"{name}-cert", {"cert": cert}))
    await _create(api, _CONFIGMAPS, _dockerfile(f"{name}-dockerfile", _quick_dockerfile(sandbox)))
    body = _module(
        name,
        f"{name}-repo",
        [{"literal": sandbox.kernel, "containerImage": final}],
        build={"dockerfileConfigMap": {"name": f"{name}-dockerfile"}},
        sign={
            "keySecret": {"name": f"{name}-key"},
            "certSecret": {"name": f"{name}-cert"},
            "filesToSign": ["/opt/lib/modules/*/*.ko"],
        },
        builds_on=sandbox.node,
    )
    await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=body)
    async with _operator(sandbox) as running:
        try:
            failed = await _until(api, name, _state(sandbox.kernel, "SignFailed"), "SignFailed")
            degraded = _condition(failed, "Degraded")
            assert degraded["reason"] == "SignFailed"
            assert podnames.pod_name(name, "sign", sandbox.kernel) in degraded["message"]
            assert not await _exists(sandbox, final)  # never an unsigned image there
            await _reconciles(running, 5)
            reasons = await _events(api, name)
            assert (reasons["BuildCreated"], reasons["SignCreated"]) == (1, 1), reasons
            wrong["data"]["key"] = base64.b64encode(key).decode()
            await _replace(api, _SECRETS, wrong)
            await _until(api, name, _state(sandbox.kernel, "Exists"), "signed after the fix")
            reasons = await _events(api, name)
            assert (reasons["BuildCreated"], reasons["SignCreated"]) == (1, 2), reasons
        finally:
            await _delete_module(api, name)


async def test_a_wrong_password_is_an_authentication_error_and_builds_nothing(
    sandbox: Sandbox, api: kube_client.Client
) -> None:
    name = f"au-{uuid.uuid4().hex[:6]}"
    final = f"{sandbox.host}/ci/{name}:{_tag(sandbox.kernel)}"
    await _create(api, _SECRETS, _pull_secret(sandbox, f"{name}-repo", password="wrong"))
    await _create(api, _CONFIGMAPS, _dockerfile(f"{name}-dockerfile", _quick_dockerfile(sandbox)))
    body = _module(
        name,
        f"{name}-repo",
        [{"literal": sandbox.kernel, "containerImage": final}],
        build={"dockerfileConfigMap": {"name": f"{name}-dockerfile"}},
        builds_on=sandbox.node,
    )
    await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=body)
    async with _operator(sandbox) as running:
        try:
            refused = await _until(
                api, name, _state(sandbox.kernel, "AuthenticationFailed"), "AuthenticationFailed"
            )
            degraded = _condition(refused, "Degraded")
            assert degraded["reason"] == "AuthenticationFailed"
            assert f"{NAMESPACE}/{name}-repo" in degraded["message"]
            await _reconciles(running, 5)
            reasons = await _events(api, name)
            assert reasons["BuildCreated"] == 0
            assert reasons["AuthenticationFailed"] == 1
            found = await api.request(
                "GET",
                resources.PODS.path(namespace=NAMESPACE),
                query={"labelSelector": f"{labels.MODULE_NAME}={name}"},
            )
            assert found["items"] == []
            assert await _loader_daemonsets(api, name) == {}
        finally:
            await _delete_module(api, name)


async def _label_node(api: kube_client.Client, node: str, key: str, value: str | None) -> None:
    await api.request(
        "PATCH",
        resources.NODES.path(name=node),
        body={"metadata": {"labels": {key: value}}},
        content_type=kube_client.MERGE_PATCH,
    )


def _manifest_puts(sandbox: Sandbox, image: str) -> int:
    """Manifest PUTs of ``image``'s tag the registry answered with 201."""
    parsed = references.parse(image)
    path = f"/v2/{parsed.name}/manifests/{parsed.reference}"
    return sum(1 for r in buildsign_support.requests(sandbox.record) if r == ("PUT", path, 201))


async def test_only_the_signed_image_ever_carried_the_final_name(
    sandbox: Sandbox, api: kube_client.Client, tmp_path: Path
) -> None:
    """The operator's own path: a build-only pod, pushing to the final name,
    waits for a node (its build.selector matches none yet: Unschedulable,
    shown on the Module); ``sign`` is added to the Module meanwhile; then a
    node takes the pods. The stale pod would push an unsigned image under
    the final name: it is replaced, so the one manifest the final tag ever
    received is the signed one."""
    name = f"us-{uuid.uuid4().hex[:6]}"
    final = f"{sandbox.host}/ci/{name}:{_tag(sandbox.kernel)}"
    builders = f"kmm-test/builders-{name}"
    key, cert = _key_and_cert(tmp_path, "signer")
    await _create(api, _SECRETS, _pull_secret(sandbox, f"{name}-repo"))
    await _create(api, _SECRETS, _opaque(f"{name}-key", {"key": key}))
    await _create(api, _SECRETS, _opaque(f"{name}-cert", {"cert": cert}))
    await _create(api, _CONFIGMAPS, _dockerfile(f"{name}-dockerfile", _quick_dockerfile(sandbox)))
    build = {"dockerfileConfigMap": {"name": f"{name}-dockerfile"}, "selector": {builders: "yes"}}
    body = _module(
        name, f"{name}-repo", [{"literal": sandbox.kernel, "containerImage": final}], build=build
    )
    path = _MODULES.path(namespace=NAMESPACE, name=name)
    await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=body)
    async with _operator(sandbox):
        try:
            stuck = await _until(
                api, name,
                lambda m: "Unschedulable" in (_images(m).get(sandbox.kernel, {}).get("message") or ""),
                "the build pod shown Unschedulable", bound=180,
            )  # fmt: skip
            assert _condition(stuck, "Degraded")["reason"] == "Unschedulable"
            assert podnames.pod_name(name, "build", sandbox.kernel) in _condition(stuck, "Degraded")["message"]  # fmt: skip
            sign = {
                "keySecret": {"name": f"{name}-key"},
                "certSecret": {"name": f"{name}-cert"},
                "filesToSign": ["/opt/lib/modules/*/kmm_ci_a.ko"],
            }
            await api.request(
                "PATCH", path,
                body={"spec": {"moduleLoader": {"container": {"sign": sign}}}},
                content_type=kube_client.MERGE_PATCH,
            )  # fmt: skip
            await _until(
                api, name, lambda m: (m.get("status") or {}).get("observedGeneration") == 2,
                "the sign seen", bound=180,
            )  # fmt: skip
            await _label_node(api, sandbox.node, builders, "yes")
            await _until(api, name, _state(sandbox.kernel, "Exists"), "the final image")
            _, files = await buildsign_support.pulled(sandbox.record, final)
            module = next(v for k, v in files.items() if k.endswith("/kmm_ci_a.ko"))
            assert module.endswith(buildsign_support.TRAILER), "an unsigned module under the final name"  # fmt: skip
            assert _manifest_puts(sandbox, final) == 1
            reasons = await _events(api, name)
            assert reasons["BuildReplaced"] == 1, reasons
            assert (reasons["BuildCreated"], reasons["SignCreated"]) == (2, 1), reasons
            assert reasons["BuildSucceeded"] == 1, reasons
        finally:
            await _label_node(api, sandbox.node, builders, None)
            await _delete_module(api, name)


async def _node_kernel(api: kube_client.Client, node: str) -> str:
    found = await api.request("GET", resources.NODES.path(name=node))
    return str(found["status"]["nodeInfo"]["kernelVersion"]).removesuffix("+")


def _on_the_container_node(body: dict[str, Any], node: str) -> dict[str, Any]:
    """``body``'s loaders on the container node (real containers), not KWOK's."""
    body["spec"]["selector"] = {"kubernetes.io/hostname": node}
    body["spec"].pop("tolerations", None)
    return body


async def _module_pods(api: kube_client.Client, name: str, role: str) -> list[dict[str, Any]]:
    found = await api.request(
        "GET",
        resources.PODS.path(namespace=NAMESPACE),
        query={"labelSelector": f"{labels.MODULE_NAME}={name},{labels.ROLE}={role}"},
    )
    return list(found["items"])


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


async def test_an_intermediate_image_an_earlier_build_left_is_built_again_never_signed(
    sandbox: Sandbox, api: kube_client.Client, tmp_path: Path
) -> None:
    """Under ``<final>-kmm-unsigned`` lies an image no build of these inputs
    made (an earlier Dockerfile's: here the bare loader image, without the
    module). It is not signed: the kernel is built again, then signed; the
    operator is replaced by a new instance while the build runs, and the new
    one carries on from what the registry's labels say."""
    name = f"st-{uuid.uuid4().hex[:6]}"
    final = f"{sandbox.host}/ci/{name}:{_tag(sandbox.kernel)}"
    stale = images.intermediate_image(final)
    containersandbox.push(sandbox.record.directory, IMAGES / "loader.tar", stale.split("/", 1)[1])
    key, cert = _key_and_cert(tmp_path, "signer")
    await _create(api, _SECRETS, _pull_secret(sandbox, f"{name}-repo"))
    await _create(api, _SECRETS, _opaque(f"{name}-key", {"key": key}))
    await _create(api, _SECRETS, _opaque(f"{name}-cert", {"cert": cert}))
    await _create(api, _CONFIGMAPS, _dockerfile(f"{name}-dockerfile", _quick_dockerfile(sandbox)))
    body = _module(
        name,
        f"{name}-repo",
        [{"literal": sandbox.kernel, "containerImage": final}],
        build={"dockerfileConfigMap": {"name": f"{name}-dockerfile"}},
        sign={
            "keySecret": {"name": f"{name}-key"},
            "certSecret": {"name": f"{name}-cert"},
            "filesToSign": ["/opt/lib/modules/*/kmm_ci_a.ko"],
        },
        builds_on=sandbox.node,
    )
    await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=body)
    try:
        async with _operator(sandbox):
            await _until(api, name, _state(sandbox.kernel, "Building"), "the build", bound=300)
        async with _operator(sandbox):
            await _until(api, name, _state(sandbox.kernel, "Exists"), "the signed image")
        reasons = await _events(api, name)
        assert (reasons["BuildCreated"], reasons["SignCreated"]) == (1, 1), reasons
        assert reasons["SignFailed"] == 0, reasons
        _, files = await buildsign_support.pulled(sandbox.record, final)
        module = next(v for k, v in files.items() if k.endswith("/kmm_ci_a.ko"))
        assert module.endswith(buildsign_support.TRAILER)
        assert not await _exists(sandbox, stale)  # the build's own, signed and deleted
    finally:
        async with _operator(sandbox):
            await _delete_module(api, name)


def _secure_boot_dockerfile(sandbox: Sandbox) -> str:
    """The quick Dockerfile, whose image's modprobe refuses to load a module
    without sign-file's signature ("Key was rejected by service"), as a
    kernel under Secure Boot does (the sandbox's kernel loads nothing)."""
    script = [
        "#!/bin/sh",
        'case " $* " in *" -r"*) exec /usr/sbin/modprobe.recording "$@" ;; esac',
        "for ko in /opt/lib/modules/*/kmm_ci_a.ko; do",
        '  tail -c 28 "$ko" | grep -q "Module signature appended" || '
        '{ echo "modprobe: ERROR: could not insert kmm_ci_a: Key was rejected by service" >&2; exit 1; }',
        "done",
        'exec /usr/sbin/modprobe.recording "$@"',
    ]
    lines = " ".join(f"'{line}'" for line in script)
    return (
        _quick_dockerfile(sandbox)
        + "RUN mv /usr/sbin/modprobe /usr/sbin/modprobe.recording && "
        + f"printf '%s\\n' {lines} >/usr/sbin/modprobe && chmod 755 /usr/sbin/modprobe\n"
    )


async def test_sign_added_rebuilds_and_signs_and_the_node_loads_the_new_image(
    sandbox: Sandbox, api: kube_client.Client, tmp_path: Path
) -> None:
    """Issue 32's sentence on a container node: the same Module without
    ``sign`` loads nothing (its loader pod never becomes Ready); ``sign`` is
    added: the image is rebuilt and signed, the loader pod that never loaded
    is replaced, the node runs the new image by digest, and the Module is
    Ready with no other action."""
    name = f"sb-{uuid.uuid4().hex[:6]}"
    kernel = await _node_kernel(api, sandbox.node)
    final = f"{sandbox.host}/ci/{name}:{_tag(kernel)}"
    key, cert = _key_and_cert(tmp_path, "signer")
    await _create(api, _SECRETS, _pull_secret(sandbox, f"{name}-repo"))
    await _create(api, _SECRETS, _opaque(f"{name}-key", {"key": key}))
    await _create(api, _SECRETS, _opaque(f"{name}-cert", {"cert": cert}))
    dockerfile = _secure_boot_dockerfile(sandbox)
    await _create(api, _CONFIGMAPS, _dockerfile(f"{name}-dockerfile", dockerfile))
    body = _module(
        name,
        f"{name}-repo",
        [{"regexp": "^.+$", "containerImage": final}],
        build={"dockerfileConfigMap": {"name": f"{name}-dockerfile"}},
        builds_on=sandbox.node,
    )
    await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=_on_the_container_node(body, sandbox.node))  # fmt: skip
    path = _MODULES.path(namespace=NAMESPACE, name=name)
    try:
        async with _operator(sandbox):
            await _until(api, name, _state(kernel, "Exists"), "the unsigned image")
            unsigned = await _inspect(sandbox, final)
            assert await _loader_image(api, name, kernel) == f"{final}@{unsigned.digest}"

            async def refused() -> bool:
                found = await _module_pods(api, name, "module-loader")
                return bool(found) and all(
                    not _ready(p)
                    and any(
                        s.get("restartCount", 0) > 0 or "terminated" in (s.get("lastState") or {})
                        for s in (p.get("status") or {}).get("containerStatuses") or ()
                    )
                    for p in found
                )

            await testing.eventually(refused, "the unsigned module refused", bound=300)
            (never,) = await _module_pods(api, name, "module-loader")
            sign = {
                "keySecret": {"name": f"{name}-key"},
                "certSecret": {"name": f"{name}-cert"},
                "filesToSign": ["/opt/lib/modules/*/kmm_ci_a.ko"],
            }
            await api.request(
                "PATCH", path,
                body={"spec": {"moduleLoader": {"container": {"sign": sign}}}},
                content_type=kube_client.MERGE_PATCH,
            )  # fmt: skip
            await _until(
                api, name, lambda m: _condition(m, "Ready").get("status") == "True", "Ready"
            )
            signed = await _inspect(sandbox, final)
            assert signed.labels is not None
            assert signed.labels[labels.IMAGE_SIGNED] == "true"
            assert signed.digest != unsigned.digest
            (loader,) = [p for p in await _module_pods(api, name, "module-loader") if _ready(p)]
            assert loader["metadata"]["uid"] != never["metadata"]["uid"]
            (container,) = loader["spec"]["containers"]
            assert container["image"] == f"{final}@{signed.digest}"
            (status,) = loader["status"]["containerStatuses"]
            assert signed.digest in status["imageID"]  # what the node runs, not a cached tag
            reasons = await _events(api, name)
            assert reasons["ImageOutdated"] == 1, reasons
            assert (reasons["BuildCreated"], reasons["SignCreated"]) == (2, 1), reasons
            assert reasons["LoaderPodReplaced"] >= 1, reasons
            assert not await _exists(sandbox, images.intermediate_image(final))
            await _delete_module(api, name)
    finally:
        async with _operator(sandbox):
            await _delete_module(api, name)


def _operator_requests(sandbox: Sandbox) -> int:
    """Requests to ``/v2/`` the registry served with aiohttp's user agent
    (the operator's, and this test's own clients'; containerd and buildah
    send theirs)."""
    log = sandbox.record.directory / "logs" / f"{registry.COMPONENT}.log"
    return sum(1 for line in log.read_text().splitlines() if "aiohttp" in line and " /v2/" in line)


async def test_an_image_only_the_nodes_reach_is_asked_of_a_node(
    sandbox: Sandbox, api: kube_client.Client
) -> None:
    """The operator cannot reach the registry (its endpoint for it goes
    nowhere), the nodes can: a pull pod on the container node finds the
    image missing, it is built, a pull pod finds it there, its loader runs."""
    name = f"pl-{uuid.uuid4().hex[:6]}"
    kernel = await _node_kernel(api, sandbox.node)
    final = f"{sandbox.host}/ci/{name}:{_tag(kernel)}"
    await _create(api, _SECRETS, _pull_secret(sandbox, f"{name}-repo"))
    await _create(api, _CONFIGMAPS, _dockerfile(f"{name}-dockerfile", _quick_dockerfile(sandbox)))
    body = _module(
        name,
        f"{name}-repo",
        [{"regexp": "^.+$", "containerImage": final}],
        build={"dockerfileConfigMap": {"name": f"{name}-dockerfile"}},
        builds_on=sandbox.node,
    )
    before = _operator_requests(sandbox)
    await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=_on_the_container_node(body, sandbox.node))  # fmt: skip
    try:
        async with _operator(sandbox, endpoint=_NOWHERE) as running:
            await _until(
                api, name, lambda m: _condition(m, "Ready").get("status") == "True", "Ready"
            )
            assert running.op.asker.requests > 0  # it tried
            assert _operator_requests(sandbox) == before  # and never reached the registry
            reasons = await _events(api, name)
            assert reasons["PullPodCreated"] == 2, reasons  # missing, then there
            assert reasons["BuildCreated"] == 1, reasons
            assert await _exists(sandbox, final)

            async def judged_and_gone() -> bool:
                return await _module_pods(api, name, labels.PULL_ROLE) == []

            await testing.eventually(judged_and_gone, "the pull pods deleted", bound=120)
            # A node's verdict has no digest: the loader runs the tag.
            assert await _loader_image(api, name, kernel) == final
            await _delete_module(api, name)
    finally:
        async with _operator(sandbox):
            await _delete_module(api, name)
