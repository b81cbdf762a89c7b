"""Preflight pods (kmm.operator.build.preflightpods.preflight_pod) run on a container node.

One sandbox for the module: one container node and the registry with
credentials, set up as test_build_pods_in_containers does (builder, kbuild
and loader images pushed, Secrets, signing material made with openssl). The
pods are created exactly as ``preflight_pod`` returns them (no operator),
all with build and sign, so the build runs as init container and the sign
reads its image from the pod's own storage:

- "quiet" (pushBuiltImage false, a small Dockerfile) and "broken" (false, a
  Dockerfile whose RUN fails) run together; the registry's access log over
  their whole lives holds no write request, while it shows the builds'
  pulls (so the log was live). "quiet" succeeds and lists the file it
  signed; "broken" fails in its init container, which says why, and its
  sign container never runs.
- "pushed" (true, the real test Dockerfile: two modules compiled against
  kbuild's headers) then runs alone: the only writes are the final image's
  (its blobs and one manifest under the final tag), no ``-kmm-unsigned``
  tag exists, and the listed module in the final image carries a signature
  modinfo and ``openssl cms`` accept.

Three builds, two of them a few seconds' (the small and the failing
Dockerfile).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import buildsign_support as support
import containersandbox
import pytest

from kmm.api import kernels
from kmm.kube import resources
from kmm.operator.build import images, podparts, preflightpods
from kmm.sandbox import cluster, pki, registry

IMAGES = Path("build/images")
BUILDER = Path("build/kmm-builder-image.tar")
DOCKERFILE = Path("tests/buildsign/Dockerfile")
NAMESPACE = "default"
MODULE = "kmm-ci"
BROKEN_MODULE = "kmm-ci-broken"
_USER, _PASSWORD = "preflight", "s3cret:preflight"
_BROKEN_SAYS = "kmm-ci: compiling against missing headers"

# Two files where the real Dockerfile puts its modules, on the loader image:
# enough to sign, in seconds.
_SMALL_DOCKERFILE = """\
ARG LOADER_IMAGE
FROM ${LOADER_IMAGE}
ARG KERNEL_FULL_VERSION
RUN mkdir -p /opt/lib/modules/${KERNEL_FULL_VERSION} && \\
    printf 'a' >/opt/lib/modules/${KERNEL_FULL_VERSION}/kmm_ci_a.ko && \\
    printf 'b' >/opt/lib/modules/${KERNEL_FULL_VERSION}/kmm_ci_b.ko
"""
_BROKEN_DOCKERFILE = f"""\
ARG LOADER_IMAGE
FROM ${{LOADER_IMAGE}}
RUN echo "{_BROKEN_SAYS}" >&2 && exit 3
"""

Request = tuple[str, str, int]


@dataclasses.dataclass
class Run:
    """What the fixture saw: the pods once ended, the registry's requests
    during each phase, and what the registry holds afterwards."""

    record: cluster.state.SandboxState
    kernel: str
    final: str
    tag: str
    quiet: dict[str, Any]
    broken: dict[str, Any]
    pushed: dict[str, Any]
    quiet_requests: list[Request]
    pushed_requests: list[Request]
    final_after_quiet: bool
    intermediate_exists: bool
    final_digest: str
    signed: dict[str, bytes]  # path in the final image -> bytes
    cert_pem: bytes
    workdir: Path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    kernel = (IMAGES / "kbuild.kernel").read_text().strip()
    workdir = tmp_path_factory.mktemp("preflight")
    key_der, cert_der, cert_pem, _ = support.signing_material(workdir)
    auth = registry.Auth(_USER, _PASSWORD)
    with containersandbox.started("pf", kubelet_nodes=1, registry_auth=auth) as record:
        builder = containersandbox.push(record.directory, BUILDER, "kmm/builder:1")
        kbuild = containersandbox.push(record.directory, IMAGES / "kbuild.tar", "ci/kbuild:1")
        loader = containersandbox.push(record.directory, IMAGES / "loader.tar", "ci/loader:1")
        assert record.registry is not None
        tag = kernels.variables(kernel, module_name=MODULE, module_namespace=NAMESPACE)[
            "KERNEL_FULL_VERSION"
        ]
        final = f"{record.registry.reference_host}/ci/{MODULE}:{tag}"
        setup = _Setup(record, kernel, final, builder, kbuild, loader, key_der, cert_der)
        quiet, broken, quiet_requests, pushed, pushed_requests, after_quiet = asyncio.run(
            _preflight(setup)
        )
        intermediate = asyncio.run(support.exists(record, images.intermediate_image(final)))
        final_digest, signed = asyncio.run(support.pulled(record, final))
        yield Run(
            record, kernel, final, tag, quiet, broken, pushed, quiet_requests,
            pushed_requests, after_quiet, intermediate, final_digest, signed, cert_pem, workdir,
        )  # fmt: skip


@dataclasses.dataclass
class _Setup:
    record: cluster.state.SandboxState
    kernel: str
    final: str
    builder: str
    kbuild: str
    loader: str
    key_der: bytes
    cert_der: bytes


async def _preflight(
    setup: _Setup,
) -> tuple[dict[str, Any], dict[str, Any], list[Request], dict[str, Any], list[Request], bool]:
    record = setup.record
    assert record.registry is not None
    assert record.registry.credentials is not None
    config = record.registry.credentials.read_bytes()
    async with cluster.api_client(record.kubeconfig) as api:
        secrets = support.SECRETS.path(namespace=NAMESPACE)
        for body in (
            support.secret("build-secret", NAMESPACE, {"ci-build-secret": b"the secret\n"}),
            support.secret(
                "repo", NAMESPACE, {".dockerconfigjson": config}, "kubernetes.io/dockerconfigjson"
            ),
            support.secret("signing-key", NAMESPACE, {"key": setup.key_der}),
            support.secret("signing-cert", NAMESPACE, {"cert": setup.cert_der}),
        ):
            await api.request("POST", secrets, body=body)
        config_maps = support.CONFIGMAPS.path(namespace=NAMESPACE)
        for name, text in (
            ("ci-dockerfile", DOCKERFILE.read_text()),
            ("small-dockerfile", _SMALL_DOCKERFILE),
            ("broken-dockerfile", _BROKEN_DOCKERFILE),
        ):
            made = await api.request(
                "POST",
                config_maps,
                body=support.config_map(name, NAMESPACE, {"dockerfile": text}),
            )
        # A real object as owner, so the garbage collector keeps the pods
        # (the operator passes its PreflightValidation; no CRD is needed here).
        owner = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": made["metadata"]["name"],
            "uid": made["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        inputs = podparts.PodParams(
            module=MODULE,
            namespace=NAMESPACE,
            kernel=setup.kernel,
            image=setup.final,
            builder_image=setup.builder,
            owner={},  # preflight_pod takes its owner apart
            repo_secret="repo",
            registry_ca=pki.Pki(record.directory / "pki").ca_cert.read_text(),
            node_selector={"kubernetes.io/hostname": record.kubelet_nodes[0]},
            push=False,
        )
        build = kernels.BuildTarget(
            dockerfile_config_map="small-dockerfile",
            build_args=(
                ("KBUILD_IMAGE", setup.kbuild),
                ("LOADER_IMAGE", setup.loader),
                ("KMM_CI_VERSION", "1.0-preflight"),
            ),
            secrets=("build-secret",),
            base_image_registry_tls=None,
            selector=(),
        )
        sign = kernels.SignTarget(
            unsigned_image=None,
            unsigned_image_registry_tls=None,
            key_secret="signing-key",
            cert_secret="signing-cert",
            files_to_sign=(f"/opt/lib/modules/{setup.kernel}/kmm_ci_a*.ko",),
        )

        async def create(validation: str, inputs: podparts.PodParams, dockerfile: str) -> str:
            body = preflightpods.preflight_pod(
                inputs,
                validation=validation,
                owner=owner,
                build=dataclasses.replace(build, dockerfile_config_map=dockerfile),
                sign=sign,
                dir_name="/opt",
            )
            await api.request("POST", resources.PODS.path(namespace=NAMESPACE), body=body)
            return str(body["metadata"]["name"])

        before = len(support.requests(record))
        quiet_name = await create("preflight-quiet", inputs, "small-dockerfile")
        broken_name = await create(
            "preflight-quiet",
            dataclasses.replace(inputs, module=BROKEN_MODULE),
            "broken-dockerfile",
        )
        quiet = await support.finished(api, NAMESPACE, quiet_name)
        broken = await support.finished(api, NAMESPACE, broken_name, "Failed")
        quiet_requests = support.requests(record)[before:]
        after_quiet = await support.exists(record, setup.final)

        before = len(support.requests(record))
        pushed_name = await create(
            "preflight-pushed", dataclasses.replace(inputs, push=True), "ci-dockerfile"
        )
        pushed = await support.finished(api, NAMESPACE, pushed_name)
        pushed_requests = support.requests(record)[before:]
        return quiet, broken, quiet_requests, pushed, pushed_requests, after_quiet


def _status(pod: dict[str, Any], field: str, name: str) -> dict[str, Any]:
    (found,) = (s for s in pod["status"].get(field) or () if s["name"] == name)
    return dict(found)


def _summary(pod: dict[str, Any], field: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(_status(pod, field, name)["state"]["terminated"]["message"])
    return found


def _modules_dir(run: Run) -> str:
    return f"/opt/lib/modules/{run.kernel}"


def test_pods_are_named_after_the_validation_and_the_module(run: Run) -> None:
    digest = "-[0-9a-f]{10}"
    assert re.fullmatch("preflight-quiet-kmm-ci" + digest, run.quiet["metadata"]["name"])
    assert re.fullmatch("preflight-quiet-kmm-ci-broken" + digest, run.broken["metadata"]["name"])
    assert re.fullmatch("preflight-pushed-kmm-ci" + digest, run.pushed["metadata"]["name"])


def test_without_push_the_registry_receives_no_write(run: Run) -> None:
    assert support.writes(run.quiet_requests) == []
    # The log was live: the builds pulled the loader image meanwhile.
    assert any(
        method == "GET" and path.startswith("/v2/ci/loader/")
        for method, path, _ in run.quiet_requests
    ), run.quiet_requests
    assert run.final_after_quiet is False


def test_without_push_the_build_kept_its_image_and_the_sign_signed_it(run: Run) -> None:
    built = _summary(run.quiet, "initContainerStatuses", "build")
    assert built["image"] == preflightpods.LOCAL_UNSIGNED_IMAGE
    assert built["pushed"] is False
    assert "digest" not in built
    assert built["imageId"].startswith("sha256:")
    signed = _summary(run.quiet, "containerStatuses", "sign")
    assert signed["imageId"].startswith("sha256:")
    assert signed["imageId"] != built["imageId"]
    assert signed == {
        "image": run.final,
        "pushed": False,
        "imageId": signed["imageId"],
        "signed": [f"{_modules_dir(run)}/kmm_ci_a.ko"],
        "unmatched": [],
    }


def test_a_failing_build_fails_the_pod_in_its_init_container_saying_why(run: Run) -> None:
    assert run.broken["status"]["phase"] == "Failed"
    terminated = _status(run.broken, "initContainerStatuses", "build")["state"]["terminated"]
    assert terminated["exitCode"] == 1
    message = terminated["message"]
    assert _BROKEN_SAYS in message, message
    assert "kmm-build: error: buildah build failed" in message, message
    # The sign container never ran.
    sign = _status(run.broken, "containerStatuses", "sign")
    assert not sign.get("started")
    assert "running" not in sign["state"]
    assert (sign["state"].get("terminated") or {}).get("exitCode") != 0


def test_with_push_only_the_final_image_is_written(run: Run) -> None:
    writes = support.writes(run.pushed_requests)
    assert writes, run.pushed_requests
    repository = f"/v2/ci/{MODULE}/"
    assert all(path.startswith(repository) for _, path, _ in writes), writes
    manifests = [(m, p) for m, p, _ in writes if "/manifests/" in p]
    assert manifests == [("PUT", f"{repository}manifests/{run.tag}")]
    assert not any("kmm-unsigned" in path for _, path, _ in run.pushed_requests)
    assert run.intermediate_exists is False


def test_with_push_the_sign_container_says_the_registrys_digest(run: Run) -> None:
    assert _summary(run.pushed, "containerStatuses", "sign") == {
        "image": run.final,
        "digest": run.final_digest,
        "pushed": True,
        "signed": [f"{_modules_dir(run)}/kmm_ci_a.ko"],
        "unmatched": [],
    }
    built = _summary(run.pushed, "initContainerStatuses", "build")
    assert (built["image"], built["pushed"]) == (preflightpods.LOCAL_UNSIGNED_IMAGE, False)


def test_the_pushed_image_carries_a_signature_modinfo_and_openssl_accept(run: Run) -> None:
    directory = _modules_dir(run)
    signed = run.signed[f"{directory}/kmm_ci_a.ko"]
    content, signature = support.split_signature(signed)
    module = run.workdir / "kmm_ci_a.signed.ko"
    module.write_bytes(signed)
    info = support.modinfo(module)
    assert info["name"] == "kmm_ci_a"
    assert info["vermagic"].split()[0] == run.kernel
    assert info["version"] == "1.0-preflight"
    assert info["signer"] == "kmm build-and-sign test"
    assert info["sig_hashalgo"] == "sha256"
    assert support.cms_verifies(run.workdir, signature, content, run.cert_pem)
    assert not support.cms_verifies(run.workdir, signature, content + b"x", run.cert_pem)
    # The module it did not list is as built: no signature.
    assert not run.signed[f"{directory}/kmm_ci_b.ko"].endswith(support.TRAILER)
