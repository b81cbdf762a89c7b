"""Preflight pods (pure): one per (validation, Module), build and/or sign, push or not."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from kmm.api import buildsign, formats, kernels, labels, modules, preflight
from kmm.operator.build import images, podnames, podparts, pods, preflightpods, scripts

_MODULE_OWNER = {
    "apiVersion": modules.API_VERSION,
    "kind": modules.KIND,
    "name": "m",
    "uid": "u-module",
    "controller": True,
    "blockOwnerDeletion": True,
}
_OWNER = {
    "apiVersion": preflight.API_VERSION,
    "kind": preflight.KIND,
    "name": "pfv",
    "uid": "u-pfv",
    "controller": True,
    "blockOwnerDeletion": True,
}
_KERNEL = "6.12.57+deb13-amd64"
_FINAL = "reg.io/m:k"


def _build(**changes: Any) -> kernels.BuildTarget:
    base = kernels.BuildTarget(
        dockerfile_config_map="dockerfile-cm",
        build_args=(("A", "1"),),
        secrets=("build-secret",),
        base_image_registry_tls=None,
        selector=(),
    )
    return dataclasses.replace(base, **changes)


def _sign(**changes: Any) -> kernels.SignTarget:
    base = kernels.SignTarget(
        unsigned_image=None,
        unsigned_image_registry_tls=None,
        key_secret="signing-key",
        cert_secret="signing-cert",
        files_to_sign=("/opt/lib/modules/k/*.ko",),
    )
    return dataclasses.replace(base, **changes)


def _params(**changes: Any) -> podparts.PodParams:
    base = podparts.PodParams(
        module="m",
        namespace="ns",
        kernel=_KERNEL,
        image=_FINAL,
        builder_image="reg.io/builder:1",
        owner=_MODULE_OWNER,
        push=False,
    )
    return dataclasses.replace(base, **changes)


def _pod(
    *,
    build: kernels.BuildTarget | None = None,
    sign: kernels.SignTarget | None = None,
    unsigned_image: str | None = None,
    **changes: Any,
) -> dict[str, Any]:
    return preflightpods.preflight_pod(
        _params(**changes),
        validation="pfv",
        owner=_OWNER,
        build=build,
        sign=sign,
        unsigned_image=unsigned_image,
        dir_name="/opt",
    )


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def _script(container: dict[str, Any]) -> str:
    command = container["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    assert command[3] == f"kmm-{container['name']}"
    script: str = command[2]
    return script


def _volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert len(found) == len(pod["spec"]["volumes"]), "volume names repeat"
    return found


def _mounts(container: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in container["volumeMounts"]}


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [*spec.get("initContainers", ()), *spec["containers"]]


# Names


def test_the_name_is_the_validation_then_the_module_then_a_digest() -> None:
    assert re.fullmatch(r"preflight-x7k2q-kmm-ci-[0-9a-f]{10}", podnames.preflight_pod_name("preflight-x7k2q", "kmm-ci"))  # fmt: skip


def test_pairs_that_join_into_the_same_text_keep_distinct_names() -> None:
    # Two validations' pods for Modules of one namespace: "a-b-c" either way.
    assert podnames.preflight_pod_name("a", "b-c") != podnames.preflight_pod_name("a-b", "c")


@pytest.mark.parametrize(
    ("validation", "module"),
    [
        ("v" * 40, "m" * 40),
        ("pre.flight", "m"),
        ("pfv", "my.module"),
        ("a" * 253, "b"),
    ],
)
def test_a_long_or_dotted_name_is_cut_and_ends_in_a_digest(validation: str, module: str) -> None:
    name = podnames.preflight_pod_name(validation, module)
    assert len(name) <= 63
    assert "." not in name
    assert formats.dns_subdomain_error(name) is None, name
    # Distinct pairs keep distinct names, also when they read alike once cut.
    assert name != podnames.preflight_pod_name(validation, module + "x")
    assert name != podnames.preflight_pod_name(validation + "x", module)
    assert name.startswith(validation.replace(".", "-")[:20])


def test_pod_name_uses_the_name_of_the_module_from_its_params() -> None:
    pod = _pod(build=_build(), module="other")
    assert pod["metadata"]["name"] == podnames.preflight_pod_name("pfv", "other")


# Metadata


@pytest.mark.parametrize(
    ("build", "sign"),
    [(_build(), None), (None, _sign(unsigned_image="u/m:1")), (_build(), _sign())],
)
def test_labels_owner_and_restart_policy(
    build: kernels.BuildTarget | None, sign: kernels.SignTarget | None
) -> None:
    pod = _pod(build=build, sign=sign)
    metadata = pod["metadata"]
    assert metadata["name"] == podnames.preflight_pod_name("pfv", "m")
    assert metadata["namespace"] == "ns"
    assert metadata["labels"] == {
        labels.MODULE_NAME: "m",
        labels.MODULE_NAMESPACE: "ns",
        labels.ROLE: "preflight",
        labels.RESOURCE_TYPE: "PreflightImage",
        labels.TARGET_KERNEL: labels.kernel_value(_KERNEL),
        labels.PREFLIGHT: "pfv",
    }
    assert preflightpods.PREFLIGHT_ROLE == "preflight"
    assert preflightpods.PREFLIGHT_RESOURCE_TYPE == "PreflightImage"
    # The validation owns it, not the Module of the params.
    assert metadata["ownerReferences"] == [_OWNER]
    assert "annotations" not in metadata
    assert pod["spec"]["restartPolicy"] == "Never"
    for container in _containers(pod):
        assert container["image"] == "reg.io/builder:1"
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert container["securityContext"] == {
            "runAsUser": 0,
            "capabilities": {"add": ["SYS_ADMIN"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert _mounts(container)[podparts.STORAGE] == "storage"
        # Every mount has its volume.
        assert set(_mounts(container).values()) <= set(_volumes(pod))
    assert _volumes(pod)["storage"] == {"name": "storage", "emptyDir": {}}


def test_a_long_validation_name_is_a_valid_label_value() -> None:
    validation = "preflight-" + "x" * 100
    pod = preflightpods.preflight_pod(
        _params(), validation=validation, owner=_OWNER, build=_build(), sign=None, dir_name="/opt"
    )
    value = pod["metadata"]["labels"][labels.PREFLIGHT]
    assert labels.is_label_value(value)
    assert value == labels.preflight_value(validation)
    assert value != validation


# Shapes


@pytest.mark.parametrize("push", [False, True])
def test_build_only_is_one_build_container_pushing_the_final_image_only_when_asked(
    push: bool,
) -> None:
    pod = _pod(build=_build(), push=push)
    assert "initContainers" not in pod["spec"]
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "build"
    assert _script(container) == scripts.BUILD
    env = _env(container)
    assert env["KMM_IMAGE"] == _FINAL
    assert env.get("KMM_PUSH", "true") == ("true" if push else "false")
    assert "KMM_UNSIGNED_LOCAL" not in env
    assert container["command"][4:] == [
        "--build-arg=A=1",
        f"--build-arg=KERNEL_VERSION={_KERNEL}",
        f"--build-arg=KERNEL_FULL_VERSION={_KERNEL}",
        "--build-arg=MOD_NAME=m",
        "--build-arg=MOD_NAMESPACE=ns",
        "--volume=/run/secrets/build-secret:/run/secrets/build-secret:ro",
    ]
    volumes = _volumes(pod)
    assert volumes["dockerfile"]["configMap"]["name"] == "dockerfile-cm"
    assert volumes["host-modules"]["hostPath"]["path"] == "/lib/modules"
    assert volumes[_mounts(container)["/run/secrets/build-secret"]]["secret"] == {
        "secretName": "build-secret"
    }
    assert "signing-key" not in volumes


@pytest.mark.parametrize("push", [False, True])
def test_sign_only_is_one_sign_container_pulling_the_unsigned_image(push: bool) -> None:
    pod = _pod(sign=_sign(unsigned_image="u.io/m:unsigned"), push=push)
    assert "initContainers" not in pod["spec"]
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "sign"
    assert _script(container) == scripts.SIGN
    env = _env(container)
    assert env["KMM_IMAGE"] == _FINAL
    assert env["KMM_UNSIGNED_IMAGE"] == "u.io/m:unsigned"
    assert env["KMM_DIR_NAME"] == "/opt"
    assert env.get("KMM_PUSH", "true") == ("true" if push else "false")
    assert "KMM_UNSIGNED_LOCAL" not in env
    assert container["command"][4:] == ["/opt/lib/modules/k/*.ko"]
    volumes = _volumes(pod)
    assert volumes[_mounts(container)["/run/kmm/signing/key"]]["secret"] == {
        "secretName": "signing-key"
    }
    assert volumes[_mounts(container)["/run/kmm/signing/cert"]]["secret"] == {
        "secretName": "signing-cert"
    }
    assert "dockerfile" not in volumes


def test_sign_only_takes_a_given_unsigned_image_over_the_mappings() -> None:
    pod = _pod(sign=_sign(unsigned_image="u.io/m:1"), unsigned_image="u.io/m:2")
    (container,) = pod["spec"]["containers"]
    assert _env(container)["KMM_UNSIGNED_IMAGE"] == "u.io/m:2"


@pytest.mark.parametrize("push", [False, True])
def test_build_and_sign_build_locally_then_sign_that_and_push_the_final_image_only(
    push: bool,
) -> None:
    pod = _pod(build=_build(), sign=_sign(), push=push)
    (build,) = pod["spec"]["initContainers"]
    (sign,) = pod["spec"]["containers"]
    assert (build["name"], sign["name"]) == ("build", "sign")
    assert (_script(build), _script(sign)) == (scripts.BUILD, scripts.SIGN)
    built = _env(build)
    # The build's image stays in the pod whatever the validation asks.
    assert built["KMM_IMAGE"] == preflightpods.LOCAL_UNSIGNED_IMAGE
    assert built["KMM_PUSH"] == "false"
    assert preflightpods.LOCAL_UNSIGNED_IMAGE.startswith("localhost/")
    signed = _env(sign)
    assert signed["KMM_UNSIGNED_IMAGE"] == preflightpods.LOCAL_UNSIGNED_IMAGE
    assert signed["KMM_UNSIGNED_LOCAL"] == "true"
    assert signed["KMM_IMAGE"] == _FINAL
    assert signed.get("KMM_PUSH", "true") == ("true" if push else "false")
    # Both containers share the buildah storage: the one emptyDir.
    assert _mounts(build)[podparts.STORAGE] == _mounts(sign)[podparts.STORAGE] == "storage"
    assert "/run/kmm/dockerfile" in _mounts(build)
    assert "/run/kmm/dockerfile" not in _mounts(sign)
    assert "/run/kmm/signing/key" in _mounts(sign)
    assert "/run/kmm/signing/key" not in _mounts(build)
    assert set(_volumes(pod)) == {
        "storage",
        "dockerfile",
        "host-modules",
        "secret-0",
        "signing-key",
        "signing-cert",
    }
    assert not any(images.intermediate_image(_FINAL) in str(c) for c in _containers(pod))


def test_the_repo_secret_and_node_selector_reach_every_container() -> None:
    pod = _pod(
        build=_build(),
        sign=_sign(),
        repo_secret="repo",
        registry_ca="PEM",
        node_selector={"kubernetes.io/hostname": "n1"},
    )
    assert pod["spec"]["imagePullSecrets"] == [{"name": "repo"}]
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "n1"}
    for container in _containers(pod):
        assert _mounts(container)["/run/kmm/auth"] == "repo-auth"
        assert _env(container)["REGISTRY_AUTH_FILE"] == "/run/kmm/auth/.dockerconfigjson"
        assert _env(container)["KMM_REGISTRY_CA_FILE"] == "/run/kmm/registry-ca/ca.crt"
        assert _mounts(container)["/run/kmm/registry-ca"] == "registry-ca"
    assert pod["metadata"]["annotations"]["kmm.node.kubernetes.io/registry-ca"] == "PEM"
    assert _volumes(pod)["repo-auth"]["secret"]["secretName"] == "repo"


def test_push_tls_is_the_final_images_and_pull_tls_the_builds() -> None:
    insecure = buildsign.RegistryTLS(insecure=True)
    pod = _pod(build=_build(), sign=_sign(), push=True, push_tls=insecure)
    (build,) = pod["spec"]["initContainers"]
    (sign,) = pod["spec"]["containers"]
    assert _env(sign)["KMM_PUSH_TLS_VERIFY"] == "false"
    assert _env(build)["KMM_PULL_TLS_VERIFY"] == "true"


def test_push_changes_the_pod() -> None:
    # So the operator's hash of it changes too: a kept pod made for the
    # other setting is not taken as the verdict.
    assert _pod(build=_build(), sign=_sign(), push=True) != _pod(
        build=_build(), sign=_sign(), push=False
    )


@pytest.mark.parametrize(
    ("build", "sign", "unsigned", "says"),
    [
        (None, None, None, "a build or a sign"),
        (_build(), _sign(), "u.io/m:1", "reads the build's image"),
        (None, _sign(), None, "needs an unsigned image"),
    ],
)
def test_impossible_shapes_are_refused(
    build: kernels.BuildTarget | None,
    sign: kernels.SignTarget | None,
    unsigned: str | None,
    says: str,
) -> None:
    with pytest.raises(ValueError, match=says):
        _pod(build=build, sign=sign, unsigned_image=unsigned)


# The Module's own pods


def test_module_pods_push_by_default_and_not_when_told() -> None:
    sign_args = {"unsigned_image": "u/m:1", "dir_name": "/opt"}
    pushed = [
        pods.build_pod(_params(push=True), _build()),
        pods.sign_pod(_params(push=True), _sign(), **sign_args),
    ]
    kept = [
        pods.build_pod(_params(push=False), _build()),
        pods.sign_pod(_params(push=False), _sign(), **sign_args),
    ]
    for pod in pushed:
        assert "KMM_PUSH" not in _env(pod["spec"]["containers"][0])
        assert "initContainers" not in pod["spec"]
    for pod in kept:
        assert _env(pod["spec"]["containers"][0])["KMM_PUSH"] == "false"
