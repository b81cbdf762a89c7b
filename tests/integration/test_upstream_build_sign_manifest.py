"""Upstream KMM's build-and-sign CI Module, applied as its users apply it.

``upstream/module-kmm-ci-build-sign.yaml`` is upstream's
``ci/module-kmm-ci-build-sign.yaml`` with only its image host and selector
changed (its header says how); ``upstream/kmm-kmod-companions.yaml`` holds
kmm's own offline stand-in for the build Secret it names (upstream's name
and key) and says how the test makes the rest: the Dockerfile ConfigMap from
the build tests' offline Dockerfile, the signing Secrets with openssl. Everything
upstream's Module exercises at once: build and sign in one mapping, a build
secret read in a plain RUN, ``registryTLS.insecure``, ``kanikoParams.tag``,
a glob in ``filesToSign``, ``modulesLoadingOrder``, ``inTreeModulesToRemove``.

One sandbox of its own with one container node (``kmm-kubelet-0``, the node
upstream's selector now names; of the host's kernel) where the build and
sign pods really run (buildah, sign-file) and push to the sandbox registry,
and the loader pod pulls the signed image and runs.
The operator runs in the test process and reaches the registry at its
loopback port (``--registry-endpoint``).

What is checked: ``kmm apply`` applies the Module and warns that
``kanikoParams`` has no effect; the image appears under the final name and
the loader DaemonSet runs it; that image carries both modules, each
signed (module signature trailer, ``modinfo`` naming the test's signer and
``sha256``); ``status.images`` says ``Exists``; and ``kmm status`` shows it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import ssl
import subprocess
import sys
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import containersandbox
import pytest
import test_operator_support as support

from kmm.api import kernels, labels, modules
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
from kmm.operator.build import settings as build_settings
from kmm.sandbox import cluster, pki, registry, testing

HERE = Path(__file__).parent / "upstream"
MODULE_FILE = HERE / "module-kmm-ci-build-sign.yaml"
COMPANIONS_FILE = HERE / "kmm-kmod-companions.yaml"
IMAGES = Path("build/images")
BUILDER_ARCHIVE = Path("build/kmm-builder-image.tar")
# The build tests' Dockerfile: modules kmm_ci_a and kmm_ci_b, the names
# upstream's Module loads and signs.
BUILDSIGN_DOCKERFILE = Path("tests/buildsign/Dockerfile")
KMM = Path(sys.executable).with_name("kmm")
NAMESPACE = "default"
NAME = "kmm-ci"
NODE = "kmm-kubelet-0"
_MODULES = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)
_SECRETS = resources.Resource("", "v1", "secrets")
_CONFIG_MAPS = resources.Resource("", "v1", "configmaps")
SIGNER = "kmm-ci upstream manifest test"
TRAILER = b"~Module signature appended~\n"
KANIKO_WARNING = "has no effect in kmm: kmm builds with buildah, not kaniko"
FAILED = frozenset({"BuildFailed", "SignFailed", "AuthenticationFailed"})


_HEADERS = '"/usr/src/linux-headers-${KERNEL_FULL_VERSION}"'


def dockerfile_config_map() -> dict[str, Any]:
    """kmm-kmod-dockerfile (key ``dockerfile``): the build tests' Dockerfile
    (two modules, kmm_ci_a and kmm_ci_b, compiled offline), its base images
    given as ARG defaults since upstream's Module passes no build args, and
    compiling against the kbuild image's headers whatever the node's kernel."""
    text = BUILDSIGN_DOCKERFILE.read_text()
    for arg, image in (("KBUILD_IMAGE", "kmm-ci/kbuild:1"), ("LOADER_IMAGE", "kmm-ci/loader:1")):
        line = f"ARG {arg}\n"
        assert line in text, f"{BUILDSIGN_DOCKERFILE} no longer has {line!r}"
        text = text.replace(line, f"ARG {arg}={registry.REFERENCE_HOST}/{image}\n", 1)
    assert _HEADERS in text, f"{BUILDSIGN_DOCKERFILE} no longer builds against {_HEADERS}"
    text = text.replace(_HEADERS, '"$(ls -d /usr/src/linux-headers-*-amd64)"')
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kmm-kmod-dockerfile", "namespace": NAMESPACE},
        "data": {"dockerfile": text},
    }


@pytest.fixture(scope="module")
def upstream() -> Iterator[cluster.state.SandboxState]:
    """The sandbox, its images pushed where the companions' Dockerfile and the
    operator look for them, the CRD and admission installed."""
    with containersandbox.started("up", kubelet_nodes=1) as record:
        push = containersandbox.push
        push(record.directory, IMAGES / "kbuild.tar", "kmm-ci/kbuild:1")
        push(record.directory, IMAGES / "loader.tar", "kmm-ci/loader:1")
        push(record.directory, BUILDER_ARCHIVE, "kmm/builder:1")
        asyncio.run(support.install_manifests(record.kubeconfig))
        yield record


def signing_secrets(directory: Path) -> list[dict[str, Any]]:
    """kmm-kmod-signing-key (key ``key``) and kmm-kmod-signing-cert (key
    ``cert``), PEM, as upstream's CI has them; the key is the test's own."""
    key, cert = directory / "signing.key", directory / "signing.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-days", "2",
         "-subj", f"/CN={SIGNER}", "-addext", "extendedKeyUsage=codeSigning",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip

    def secret(name: str, field: str, path: Path) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "type": "Opaque",
            "data": {field: base64.b64encode(path.read_bytes()).decode()},
        }

    return [
        secret("kmm-kmod-signing-key", "key", key),
        secret("kmm-kmod-signing-cert", "cert", cert),
    ]


def kmm(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KMM), *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "250"},
        check=False,
    )


async def loader_daemonsets(api: kube_client.Client) -> list[dict[str, Any]]:
    found = await api.request(
        "GET",
        resources.DAEMONSETS.path(NAMESPACE),
        query={"labelSelector": f"{labels.MODULE_NAME}={NAME}"},
    )
    return list(found["items"])


async def image_entry(api: kube_client.Client) -> dict[str, Any] | None:
    module = await api.request("GET", _MODULES.path(NAMESPACE, NAME))
    entries = (module.get("status") or {}).get("images") or []
    return next(iter(entries), None)


async def why(api: kube_client.Client, entry: dict[str, Any] | None) -> str:
    """The image entry, the Module's conditions and events: what a failure says."""
    module = await api.request("GET", _MODULES.path(NAMESPACE, NAME))
    events = await api.request(
        "GET",
        resources.Resource("", "v1", "events").path(NAMESPACE),
        query={"fieldSelector": f"involvedObject.name={NAME}"},
    )
    said = [f"{e['reason']}: {e.get('message')}" for e in events["items"]]
    conditions = (module.get("status") or {}).get("conditions")
    return f"image {entry}; conditions {conditions}; events {said}"


async def image_files(
    record: cluster.state.SandboxState, image: str, wanted: tuple[str, ...]
) -> dict[str, bytes]:
    """The files ``wanted`` (paths in the image) from the pushed image's
    layers, last layer wins, read at the registry's loopback port."""
    reference = image.removeprefix(f"{registry.REFERENCE_HOST}/")
    name, _, tag = reference.rpartition(":")
    assert record.registry is not None
    base = f"https://{record.registry.host}/v2/{name}"
    context = ssl.create_default_context(cafile=pki.Pki(record.directory / "pki").ca_cert)
    accept = "application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json"  # fmt: skip
    found: dict[str, bytes] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        async with session.get(f"{base}/manifests/{tag}", headers={"Accept": accept}) as answer:
            answer.raise_for_status()
            manifest = json.loads(await answer.read())
        for layer in manifest["layers"]:
            async with session.get(f"{base}/blobs/{layer['digest']}") as answer:
                answer.raise_for_status()
                data = await answer.read()
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
                for member in tar.getmembers():
                    path = "/" + member.name.removeprefix("./")
                    if path in wanted and member.isfile():
                        extracted = tar.extractfile(member)
                        assert extracted is not None
                        found[path] = extracted.read()
    return found


def modinfo(path: Path, field: str) -> str:
    done = subprocess.run(
        ["modinfo", "-F", field, str(path)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@contextlib.asynccontextmanager
async def created(api: kube_client.Client, resource: Any, body: dict[str, Any]) -> AsyncIterator[None]:  # fmt: skip
    await api.request("POST", resource.path(NAMESPACE), body=body)
    try:
        yield
    finally:
        with contextlib.suppress(kube_errors.NotFound):
            await api.request("DELETE", resource.path(NAMESPACE, body["metadata"]["name"]))


def operator_settings(record: cluster.state.SandboxState) -> dict[str, Any]:
    """What ``kmm operator`` would be given: the builder image as pushed
    (``--builder-image``), the registry at its loopback port
    (``--registry-endpoint``), the sandbox CA (``--registry-ca``)."""
    assert record.registry is not None
    ca = pki.Pki(record.directory / "pki").ca_cert
    return {
        "build": build_settings.Settings(
            builder_image=f"{registry.REFERENCE_HOST}/kmm/builder:1", registry_ca=ca.read_text()
        ),
        "registry_endpoints": {registry.REFERENCE_HOST: record.registry.host},
        "registry_ca_files": (ca,),
    }


async def test_upstreams_build_and_sign_module_applies_warns_builds_signs_and_loads(
    upstream: cluster.state.SandboxState, tmp_path: Path
) -> None:
    record = upstream
    companions = COMPANIONS_FILE.read_text()
    (tmp_path / "companions.yaml").write_text(companions)
    applied = kmm("apply", "-f", str(tmp_path / "companions.yaml"), kubeconfig=record.kubeconfig)
    assert applied.returncode == 0, applied.stderr
    key_secret, cert_secret = signing_secrets(tmp_path)
    async with (
        cluster.api_client(record.kubeconfig) as api,
        created(api, _SECRETS, key_secret),
        created(api, _SECRETS, cert_secret),
        created(api, _CONFIG_MAPS, dockerfile_config_map()),
        support.operator_in_process(record.kubeconfig, **operator_settings(record)),
    ):
        node = await api.request("GET", resources.NODES.path(name=NODE))
        kernel = kernels.node_kernel(node["status"]["nodeInfo"]["kernelVersion"])
        result = kmm("apply", "-f", str(MODULE_FILE), kubeconfig=record.kubeconfig)
        try:
            assert result.returncode == 0, result.stderr
            assert result.stdout.strip() == f"module/{NAME} created"
            warnings = [w for w in result.stderr.splitlines() if w.startswith("Warning:")]
            assert any("kanikoParams" in w and KANIKO_WARNING in w for w in warnings), warnings

            # That the loader waits for the image is the operator's tests'
            # (test_build_*): here, that upstream's Module gets there. A
            # failure is final (retried only on changed inputs): said at once.
            async def built() -> bool:
                entry = await image_entry(api)
                state = (entry or {}).get("state")
                assert state not in FAILED, await why(api, entry)
                return state == "Exists"

            try:
                await testing.eventually(built, "the signed image exists", bound=420, interval=1)
            except AssertionError as err:
                raise AssertionError(f"{err}; {await why(api, await image_entry(api))}") from None
            entry = await image_entry(api)
            assert entry is not None
            assert entry["kernel"] == kernel
            tag_kernel = kernels.variables(kernel, module_name=NAME, module_namespace=NAMESPACE)[
                "KERNEL_FULL_VERSION"
            ]
            image = f"{registry.REFERENCE_HOST}/{NAMESPACE}/{NAME}:{tag_kernel}"
            assert entry["image"] == image

            def pinned(reference: str) -> bool:
                # kmm built it, so loaders run it by digest (the tag kept
                # for readers): a tag cached on the node is never what runs.
                return reference.startswith(f"{image}@sha256:")

            async def loading() -> bool:
                found = await api.request(
                    "GET",
                    resources.PODS.path(NAMESPACE),
                    query={"labelSelector": f"{labels.MODULE_NAME}={NAME}"},
                )
                return any(
                    pod["spec"].get("nodeName") == NODE
                    and (pod.get("status") or {}).get("phase") == "Running"
                    and pinned(pod["spec"]["containers"][0]["image"])
                    for pod in found["items"]
                )

            # The node pulls the signed image and its loader runs.
            await testing.eventually(loading, "the loader pod Running", bound=120, interval=1)
            (daemonset,) = await loader_daemonsets(api)
            template = daemonset["spec"]["template"]["spec"]
            assert pinned(template["containers"][0]["image"])

            directory = f"/opt/lib/modules/{kernel}"
            wanted = (f"{directory}/kmm_ci_a.ko", f"{directory}/kmm_ci_b.ko")
            files = await image_files(record, image, wanted)
            assert sorted(files) == sorted(wanted)
            for path, data in files.items():
                assert data.endswith(TRAILER), path
                local = tmp_path / Path(path).name
                local.write_bytes(data)
                assert modinfo(local, "signer") == SIGNER
                assert modinfo(local, "sig_hashalgo") == "sha256"

            shown = kmm("status", f"{NAMESPACE}/{NAME}", kubeconfig=record.kubeconfig)
            assert shown.returncode == 0, shown.stderr
            row = next(line for line in shown.stdout.splitlines() if NODE in line)
            assert "exists" in row, shown.stdout
            # Build and sign each ran once.
            events = await api.request(
                "GET",
                resources.Resource("", "v1", "events").path(NAMESPACE),
                query={"fieldSelector": f"involvedObject.name={NAME}"},
            )
            reasons = sorted(e["reason"] for e in events["items"])
            assert reasons.count("BuildCreated") == 1, reasons
            assert reasons.count("SignCreated") == 1, reasons
        finally:
            await api.request("DELETE", _MODULES.path(NAMESPACE, NAME))

            async def gone() -> bool:
                try:
                    await api.request("GET", _MODULES.path(NAMESPACE, NAME))
                except kube_errors.NotFound:
                    return True
                return False

            await testing.eventually(gone, "the Module deleted", bound=180, interval=1)
