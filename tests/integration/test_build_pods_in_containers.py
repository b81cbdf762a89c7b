"""Build and sign pods (kmm.operator.build.pods) run on a container node.

One sandbox for the module: one container node and the registry with
credentials. The fixture pushes the builder image (``make image``), the
kbuild and loader test images (``make test-images``), creates the
Dockerfile ConfigMap (tests/buildsign/Dockerfile), a build secret, the
imageRepoSecret and a signing key and certificate made here with openssl,
then creates the build pod and, once it succeeded, the sign pod, both
exactly as ``build_pod``/``sign_pod`` return them (no operator), and pulls
what they pushed with ``kmm.oci``. The tests read that one run: the build
compiled two modules against kbuild's headers, fully offline, reading the
secret and a build arg; the listed module carries a signature that modinfo
and ``openssl cms`` accept; the other is byte for byte the built one. That
only a signed image ever carries the final name is the operator's doing,
not these pods': test_build_in_containers shows it through the operator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import buildsign_support as support
import containersandbox
import pytest

from kmm.api import kernels
from kmm.kube import resources
from kmm.operator.build import images, podnames, podparts, pods
from kmm.sandbox import cluster, pki, registry

IMAGES = Path("build/images")
BUILDER = Path("build/kmm-builder-image.tar")
DOCKERFILE = Path("tests/buildsign/Dockerfile")
NAMESPACE = "default"
MODULE = "kmm-ci"
SECRET_TEXT = b"the build secret\n"
VERSION_ARG = "1.2.3-ci"
_USER, _PASSWORD = "builder", "s3cret:build"


@dataclasses.dataclass
class Run:
    """What the fixture saw and pulled."""

    record: cluster.state.SandboxState
    kernel: str
    final: str
    unsigned: str
    build_pod: dict[str, Any]
    sign_pod: dict[str, Any]
    unsigned_digest: str
    final_digest: str
    built: dict[str, bytes]  # path in the image -> bytes, of the unsigned image
    signed: dict[str, bytes]  # the same, of the final image
    cert_pem: bytes
    workdir: Path
    # Module name -> (its failed sign pod, whether its final image exists).
    failed: dict[str, tuple[dict[str, Any], bool]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    kernel = (IMAGES / "kbuild.kernel").read_text().strip()
    workdir = tmp_path_factory.mktemp("buildsign")
    key_der, cert_der, cert_pem, other_key = support.signing_material(workdir)
    auth = registry.Auth(_USER, _PASSWORD)
    with containersandbox.started("kb", kubelet_nodes=1, registry_auth=auth) as record:
        builder = containersandbox.push(record.directory, BUILDER, "kmm/builder:1")
        kbuild = containersandbox.push(record.directory, IMAGES / "kbuild.tar", "ci/kbuild:1")
        loader = containersandbox.push(record.directory, IMAGES / "loader.tar", "ci/loader:1")
        assert record.registry is not None
        assert record.registry.credentials is not None
        host = record.registry.reference_host
        tag = kernels.variables(kernel, module_name=MODULE, module_namespace=NAMESPACE)
        final = f"{host}/ci/{MODULE}:{tag['KERNEL_FULL_VERSION']}"
        unsigned = images.intermediate_image(final)
        ca = pki.Pki(record.directory / "pki").ca_cert.read_text()
        node = record.kubelet_nodes[0]
        result = asyncio.run(
            _build_and_sign(
                record, kernel, final, unsigned, builder, kbuild, loader, ca, node,
                key_der, cert_der, other_key,
            )
        )  # fmt: skip
        build_pod, sign_pod, failed = result
        unsigned_digest, built = asyncio.run(support.pulled(record, unsigned))
        final_digest, signed = asyncio.run(support.pulled(record, final))
        yield Run(
            record, kernel, final, unsigned, build_pod, sign_pod,
            unsigned_digest, final_digest, built, signed, cert_pem, workdir, failed,
        )  # fmt: skip


async def _build_and_sign(
    record: cluster.state.SandboxState,
    kernel: str,
    final: str,
    unsigned: str,
    builder: str,
    kbuild: str,
    loader: str,
    ca: str,
    node: str,
    key_der: bytes,
    cert_der: bytes,
    other_key: bytes,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, tuple[dict[str, Any], bool]]]:
    assert record.registry is not None
    assert record.registry.credentials is not None
    config = record.registry.credentials.read_bytes()
    async with cluster.api_client(record.kubeconfig) as api:
        secrets = support.SECRETS.path(namespace=NAMESPACE)
        for body in (
            support.secret("build-secret", NAMESPACE, {"ci-build-secret": SECRET_TEXT}),
            support.secret(
                "repo", NAMESPACE, {".dockerconfigjson": config}, "kubernetes.io/dockerconfigjson"
            ),
            support.secret("signing-key", NAMESPACE, {"key": key_der}),
            support.secret("other-key", NAMESPACE, {"key": other_key}),
            support.secret("signing-cert", NAMESPACE, {"cert": cert_der}),
        ):
            await api.request("POST", secrets, body=body)
        dockerfile = await api.request(
            "POST",
            support.CONFIGMAPS.path(namespace=NAMESPACE),
            body={
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "ci-dockerfile", "namespace": NAMESPACE},
                "data": {"dockerfile": DOCKERFILE.read_text()},
            },
        )
        # A real object as owner, so the garbage collector keeps the pods
        # (the operator passes its Module; no CRD is needed here).
        owner = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "ci-dockerfile",
            "uid": dockerfile["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        inputs = podparts.PodParams(
            module=MODULE,
            namespace=NAMESPACE,
            kernel=kernel,
            image=unsigned,
            builder_image=builder,
            owner=owner,
            repo_secret="repo",
            registry_ca=ca,
            node_selector={"kubernetes.io/hostname": node},
        )
        build = kernels.BuildTarget(
            dockerfile_config_map="ci-dockerfile",
            build_args=(
                ("KBUILD_IMAGE", kbuild),
                ("LOADER_IMAGE", loader),
                ("KMM_CI_VERSION", VERSION_ARG),
                # KMM's own arguments win over a user's.
                ("KERNEL_FULL_VERSION", "not-the-kernel"),
            ),
            secrets=("build-secret",),
            base_image_registry_tls=None,
            selector=(),
        )
        await api.request(
            "POST", resources.PODS.path(namespace=NAMESPACE), body=pods.build_pod(inputs, build)
        )
        built = await support.finished(api, NAMESPACE, podnames.pod_name(MODULE, "build", kernel))
        sign = kernels.SignTarget(
            unsigned_image=None,
            unsigned_image_registry_tls=None,
            key_secret="signing-key",
            cert_secret="signing-cert",
            files_to_sign=(
                f"/opt/lib/modules/{kernel}/kmm_ci_a*.ko",
                f"/opt/lib/modules/{kernel}/absent-*.ko",
            ),
        )
        # The sign, and two that fail beside it (other Modules' names): a key
        # that is not the certificate's, and filesToSign that match nothing.
        failing = {
            "kmm-ci-wrong-key": dataclasses.replace(sign, key_secret="other-key"),
            "kmm-ci-no-match": dataclasses.replace(
                sign, files_to_sign=(f"/opt/lib/modules/{kernel}/absent-*.ko",)
            ),
        }
        for module, target in ((MODULE, sign), *failing.items()):
            image = final if module == MODULE else final.replace(MODULE, module)
            body = pods.sign_pod(
                dataclasses.replace(inputs, module=module, image=image),
                target,
                unsigned_image=unsigned,
                dir_name="/opt",
            )
            await api.request("POST", resources.PODS.path(namespace=NAMESPACE), body=body)
        signed = await support.finished(api, NAMESPACE, podnames.pod_name(MODULE, "sign", kernel))
        failed = {}
        async with registry.client(record) as looked:
            for module in failing:
                pod = await support.finished(
                    api, NAMESPACE, podnames.pod_name(module, "sign", kernel), "Failed"
                )
                name, _, tag = final.replace(MODULE, module).partition("/")[2].rpartition(":")
                failed[module] = pod, await looked.exists(name, tag) is not None
        return built, signed, failed


def _modules_dir(run: Run) -> str:
    return f"/opt/lib/modules/{run.kernel}"


def _termination(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["containerStatuses"]
    return json.loads(status["state"]["terminated"]["message"])


def test_the_build_pod_pushed_the_intermediate_image_and_said_its_digest(run: Run) -> None:
    assert _termination(run.build_pod) == {
        "image": run.unsigned,
        "digest": run.unsigned_digest,
        "pushed": True,
    }
    assert (
        run.unsigned
        == run.final.rpartition(":")[0] + ":" + run.final.rpartition(":")[2] + "-kmm-unsigned"
    )


def test_the_build_compiled_both_modules_offline_with_the_secret_and_build_args(
    run: Run,
) -> None:
    directory = _modules_dir(run)
    assert {f"{directory}/kmm_ci_a.ko", f"{directory}/kmm_ci_b.ko"} <= set(run.built)
    # The loader image is the final stage's base: its modprobe is there.
    assert "/usr/sbin/modprobe" in run.built
    for name in ("kmm_ci_a", "kmm_ci_b"):
        path = run.workdir / f"{name}.built.ko"
        path.write_bytes(run.built[f"{directory}/{name}.ko"])
        info = support.modinfo(path)
        assert info["name"] == name
        # KERNEL_FULL_VERSION was KMM's (the build arg the test tried to
        # override would not have found any headers).
        assert info["vermagic"].split()[0] == run.kernel
        assert info["version"] == VERSION_ARG
        assert info["kmm_ci_secret"] == hashlib.sha256(SECRET_TEXT).hexdigest()
        assert "signer" not in info


def test_the_sign_pod_said_what_it_signed_and_what_matched_nothing(run: Run) -> None:
    directory = _modules_dir(run)
    assert _termination(run.sign_pod) == {
        "image": run.final,
        "digest": run.final_digest,
        "pushed": True,
        "signed": [f"{directory}/kmm_ci_a.ko"],
        "unmatched": [f"{directory}/absent-*.ko"],
        # The intermediate image it signed, which the operator deletes by
        # this digest once the sign succeeded.
        "unsignedDigest": run.unsigned_digest,
    }


def test_the_listed_module_carries_a_signature_modinfo_and_openssl_accept(run: Run) -> None:
    path = f"{_modules_dir(run)}/kmm_ci_a.ko"
    unsigned, signed = run.built[path], run.signed[path]
    content, signature = support.split_signature(signed)
    # sign-file only appended: the module before it is the built one.
    assert content == unsigned
    module = run.workdir / "kmm_ci_a.signed.ko"
    module.write_bytes(signed)
    info = support.modinfo(module)
    assert info["signer"] == "kmm build-and-sign test"
    assert info["sig_hashalgo"] == "sha256"
    assert info["sig_id"] == "PKCS#7"
    assert support.cms_verifies(run.workdir, signature, unsigned, run.cert_pem)
    # The same signature over other bytes does not verify.
    assert not support.cms_verifies(run.workdir, signature, unsigned + b"x", run.cert_pem)


def test_the_unlisted_module_is_unchanged(run: Run) -> None:
    path = f"{_modules_dir(run)}/kmm_ci_b.ko"
    assert run.signed[path] == run.built[path]
    assert not run.signed[path].endswith(support.TRAILER)


@pytest.mark.parametrize(
    ("module", "says"),
    [
        (
            "kmm-ci-wrong-key",
            "error: the key of Secret other-key does not match the certificate of Secret signing-cert",
        ),
        ("kmm-ci-no-match", "matches filesToSign: /opt/lib/modules/"),
    ],
)
def test_a_failed_sign_says_why_in_its_termination_message_and_pushes_nothing(
    run: Run, module: str, says: str
) -> None:
    pod, pushed = run.failed[module]
    (status,) = pod["status"]["containerStatuses"]
    terminated = status["state"]["terminated"]
    assert terminated["exitCode"] == 1
    # No summary was written: the kubelet put the log's tail there.
    message = terminated["message"]
    assert says in message, message
    assert not message.lstrip().startswith("{")
    assert pushed is False
