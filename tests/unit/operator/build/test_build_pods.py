"""Build and sign pod builders (pure): names, labels, arguments, volumes, TLS."""

from __future__ import annotations

import dataclasses
import subprocess
from typing import Any

import pytest

from kmm.api import buildsign, formats, kernels, labels, modules
from kmm.operator import caches
from kmm.operator.build import hashing, podnames, podparts, pods, preflightpods, scripts

_OWNER = {
    "apiVersion": modules.API_VERSION,
    "kind": modules.KIND,
    "name": "m",
    "uid": "u-1",
    "controller": True,
    "blockOwnerDeletion": True,
}
_KERNEL = "6.12.57+deb13-amd64"


def _build(**changes: Any) -> kernels.BuildTarget:
    base = kernels.BuildTarget(
        dockerfile_config_map="dockerfile-cm",
        build_args=(),
        secrets=(),
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
        image="reg.io/m:k",
        builder_image="reg.io/builder:1",
        owner=_OWNER,
    )
    return dataclasses.replace(base, **changes)


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["spec"]["containers"]
    return container


def _args(pod: dict[str, Any]) -> list[str]:
    # command: /bin/sh -c SCRIPT $0 ARGS...
    command = _container(pod)["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    return list(command[4:])


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in _container(pod)["env"]}


def _volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def _mounts(pod: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in _container(pod)["volumeMounts"]}


@pytest.mark.parametrize(
    ("module", "role", "kernel", "expected"),
    [
        ("m", "build", "6.8.0-45-generic", "m-build-6.8.0-45-generic"),
        ("m", "sign", "6.8.0-45-generic", "m-sign-6.8.0-45-generic"),
    ],
)
def test_pod_name_is_kmms_when_the_kernel_is_dns_safe(
    module: str, role: podparts.PodRole, kernel: str, expected: str
) -> None:
    assert podnames.pod_name(module, role, kernel) == expected


@pytest.mark.parametrize(
    ("kernel", "alike"),
    [
        ("6.12.57+deb13-amd64", "6.12.57-deb13-amd64"),
        ("5.14.0-427.el9.x86_64", "5.14.0-427.el9.x86-64"),
        ("6.1.0-RT", "6.1.0-rt"),
        ("6.1.0-" + "x" * 80, "6.1.0-" + "x" * 79 + "y"),
    ],
)
def test_pod_name_changed_or_long_kernels_end_in_a_digest(kernel: str, alike: str) -> None:
    name = podnames.pod_name("a-module", "build", kernel)
    assert len(name) <= 63
    assert formats.dns_subdomain_error(name) is None, name
    assert name.startswith("a-module-build-")
    # Kernels that read alike as (cut) DNS names keep distinct pods.
    assert name != podnames.pod_name("a-module", "build", alike)
    assert name != podnames.pod_name("a-module", "sign", kernel)


def test_pod_name_of_a_long_module_stays_a_dns_name() -> None:
    name = podnames.pod_name("m" * 60, "sign", "6.8.0-45-generic")
    assert len(name) == 63
    assert formats.dns_subdomain_error(name) is None


@pytest.mark.parametrize(("role", "kind"), [("build", "BuildImage"), ("sign", "SignImage")])
def test_pods_carry_kmms_labels_owner_and_restart_policy(role: str, kind: str) -> None:
    params = _params()
    pod = (
        pods.build_pod(params, _build())
        if role == "build"
        else pods.sign_pod(params, _sign(), unsigned_image="reg.io/u:1", dir_name="/opt")
    )
    metadata = pod["metadata"]
    assert metadata["name"] == podnames.pod_name("m", role, _KERNEL)  # type: ignore[arg-type]
    assert metadata["namespace"] == "ns"
    assert metadata["labels"] == {
        labels.MODULE_NAME: "m",
        labels.MODULE_NAMESPACE: "ns",
        labels.ROLE: role,
        labels.RESOURCE_TYPE: kind,
        labels.TARGET_KERNEL: labels.kernel_value(_KERNEL),
    }
    assert metadata["ownerReferences"] == [_OWNER]
    assert pod["spec"]["restartPolicy"] == "Never"
    container = _container(pod)
    assert container["image"] == "reg.io/builder:1"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["securityContext"] == {
        "runAsUser": 0,
        "capabilities": {"add": ["SYS_ADMIN"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "privileged" not in container["securityContext"]
    assert _volumes(pod)["storage"] == {"name": "storage", "emptyDir": {}}
    assert _mounts(pod)[podparts.STORAGE] == "storage"
    assert _env(pod)["KMM_IMAGE"] == "reg.io/m:k"
    assert "nodeSelector" not in pod["spec"]
    assert "imagePullSecrets" not in pod["spec"]


def test_build_args_are_the_users_with_kmms_over_them() -> None:
    build = _build(
        build_args=(("A", "1"), ("KERNEL_VERSION", "mine"), ("MOD_NAME", "x"), ("B", "x=y"))
    )
    args = _args(pods.build_pod(_params(), build))
    assert [a for a in args if a.startswith("--build-arg=")] == [
        "--build-arg=A=1",
        "--build-arg=B=x=y",
        f"--build-arg=KERNEL_VERSION={_KERNEL}",
        f"--build-arg=KERNEL_FULL_VERSION={_KERNEL}",
        "--build-arg=MOD_NAME=m",
        "--build-arg=MOD_NAMESPACE=ns",
    ]


def test_build_pod_mounts_the_dockerfile_host_modules_and_each_secret() -> None:
    build = _build(dockerfile_config_map="df", secrets=("build-secret", "other"))
    pod = pods.build_pod(_params(), build, dockerfile_key="alt")
    volumes, mounts = _volumes(pod), _mounts(pod)
    assert volumes["dockerfile"]["configMap"] == {
        "name": "df",
        "items": [{"key": "alt", "path": "Dockerfile"}],
    }
    assert volumes["host-modules"]["hostPath"]["path"] == "/lib/modules"
    assert mounts[podparts.HOST_MODULES] == "host-modules"
    for secret in ("build-secret", "other"):
        path = f"/run/secrets/{secret}"
        assert podparts.secret_path(secret) == path
        assert volumes[mounts[path]]["secret"] == {"secretName": secret}
        # The same path inside RUN steps.
        assert f"--volume={path}:{path}:ro" in _args(pod)
    every = [m for c in pod["spec"]["containers"] for m in c["volumeMounts"]]
    assert all(m.get("readOnly") for m in every if m["name"] != "storage")


def test_build_pod_defaults_to_the_dockerfile_key() -> None:
    pod = pods.build_pod(_params(), _build())
    assert _volumes(pod)["dockerfile"]["configMap"]["items"][0]["key"] == "dockerfile"


@pytest.mark.parametrize(
    ("tls", "verify"),
    [
        (None, "true"),
        (buildsign.RegistryTLS(), "true"),
        (buildsign.RegistryTLS(insecure=True), "false"),
        (buildsign.RegistryTLS.model_validate({"insecureSkipTLSVerify": True}), "false"),
    ],
)
def test_tls_options_turn_verification_off_for_their_side_only(
    tls: buildsign.RegistryTLS | None, verify: str
) -> None:
    for pod in (
        pods.build_pod(_params(push_tls=tls), _build()),
        pods.sign_pod(_params(push_tls=tls), _sign(), unsigned_image="r/u:1", dir_name="/opt"),
    ):
        assert _env(pod)["KMM_PUSH_TLS_VERIFY"] == verify
        assert _env(pod)["KMM_PULL_TLS_VERIFY"] == "true"
    pulled = pods.build_pod(_params(pull_tls=tls), _build())
    assert _env(pulled)["KMM_PULL_TLS_VERIFY"] == verify
    assert _env(pulled)["KMM_PUSH_TLS_VERIFY"] == "true"


def test_repo_secret_is_the_authfile_and_pull_secret() -> None:
    pod = pods.build_pod(_params(repo_secret="repo"), _build())
    assert pod["spec"]["imagePullSecrets"] == [{"name": "repo"}]
    auth = _volumes(pod)[_mounts(pod)["/run/kmm/auth"]]
    assert auth["secret"] == {
        "secretName": "repo",
        "items": [{"key": ".dockerconfigjson", "path": ".dockerconfigjson"}],
    }
    env = _env(pod)
    assert env["REGISTRY_AUTH_FILE"] == "/run/kmm/auth/.dockerconfigjson"
    bare = _env(pods.build_pod(_params(), _build()))
    assert "REGISTRY_AUTH_FILE" not in bare


# Linux's limit on one string of an exec's arguments or environment
# (MAX_ARG_STRLEN, 32 pages): the kubelet's runtime execs the container's
# command with its environment, and a longer string fails it with E2BIG.
_MAX_ARG_STRLEN = 32 * 4096


def bundle(size: int) -> str:
    """PEM-shaped text of ``size`` bytes (what a CA bundle of some hundred
    certificates looks like to the pod: only its size matters here)."""
    block = "-----BEGIN CERTIFICATE-----\n" + "QUJD" * 16 + "\n-----END CERTIFICATE-----\n"
    text = block * (size // len(block) + 1)
    return text[:size]


def _all_pods(params: podparts.PodParams) -> list[dict[str, Any]]:
    return [
        pods.build_pod(params, _build()),
        pods.sign_pod(params, _sign(), unsigned_image="reg.io/u:1", dir_name="/opt"),
        preflightpods.preflight_pod(
            params, validation="v", owner=_OWNER, build=_build(), sign=_sign(), dir_name="/opt"
        ),
    ]


def test_a_200_kib_registry_ca_reaches_every_container_as_a_file_and_every_pod_execs() -> None:
    ca = bundle(200 * 1024)
    for pod in _all_pods(_params(registry_ca=ca)):
        containers = [*pod["spec"].get("initContainers", ()), *pod["spec"]["containers"]]
        for container in containers:
            env = {e["name"]: e["value"] for e in container["env"]}
            # The exec the runtime makes, its script aside: it starts (a
            # string over MAX_ARG_STRLEN fails it with E2BIG).
            command = [*container["command"][:2], "exit 0", *container["command"][3:]]
            assert subprocess.run(command, env=env, check=False).returncode == 0
            strings = [*container["command"], *(f"{k}={v}" for k, v in env.items())]
            assert max(len(text.encode()) for text in strings) < _MAX_ARG_STRLEN
            assert env["KMM_REGISTRY_CA_FILE"] == "/run/kmm/registry-ca/ca.crt"
            mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
            assert mounts["/run/kmm/registry-ca"] == {
                "name": "registry-ca", "mountPath": "/run/kmm/registry-ca", "readOnly": True,
            }  # fmt: skip
        assert pod["metadata"]["annotations"] == {labels.REGISTRY_CA: ca}
        assert _volumes(pod)["registry-ca"] == {
            "name": "registry-ca",
            "downwardAPI": {
                "items": [
                    {
                        "path": "ca.crt",
                        "fieldRef": {"fieldPath": f"metadata.annotations['{labels.REGISTRY_CA}']"},
                    }
                ]
            },
        }
    # Without a CA: no annotation, volume, mount or variable.
    for pod in _all_pods(_params()):
        assert "annotations" not in pod["metadata"]
        assert "registry-ca" not in _volumes(pod)
        for container in [*pod["spec"].get("initContainers", ()), *pod["spec"]["containers"]]:
            assert "KMM_REGISTRY_CA_FILE" not in {e["name"] for e in container["env"]}


def test_node_selector_is_passed() -> None:
    pod = pods.build_pod(_params(node_selector={"kubernetes.io/hostname": "n1"}), _build())
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "n1"}


def test_sign_pod_mounts_key_and_cert_and_passes_the_patterns() -> None:
    sign = _sign(key_secret="k", cert_secret="c", files_to_sign=("/opt/a/*.ko", "/opt/b.ko"))
    pod = pods.sign_pod(_params(), sign, unsigned_image="reg.io/m:k-kmm-unsigned", dir_name="/opt")
    volumes, mounts = _volumes(pod), _mounts(pod)
    assert volumes[mounts["/run/kmm/signing/key"]]["secret"] == {"secretName": "k"}
    assert volumes[mounts["/run/kmm/signing/cert"]]["secret"] == {"secretName": "c"}
    assert _args(pod) == ["/opt/a/*.ko", "/opt/b.ko"]
    env = _env(pod)
    assert env["KMM_UNSIGNED_IMAGE"] == "reg.io/m:k-kmm-unsigned"
    assert env["KMM_DIR_NAME"] == "/opt"
    assert (env["KMM_KEY_SECRET"], env["KMM_CERT_SECRET"]) == ("k", "c")
    assert "host-modules" not in volumes


@pytest.mark.parametrize("script", [scripts.BUILD, scripts.SIGN])
def test_scripts_are_posix_shell(script: str) -> None:
    # dash (Debian's sh, the builder image's /bin/sh) parses them.
    done = subprocess.run(["dash", "-n", "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_operators_pod_cache_keeps_no_copy_of_the_registry_ca() -> None:
    ca = bundle(200 * 1024)
    for pod in _all_pods(_params(registry_ca=ca)):
        stamped = hashing.stamp(pod, {"pod": "p"})
        kept = caches.project_pod(stamped)
        assert labels.REGISTRY_CA not in kept["metadata"]["annotations"]
        assert hashing.of_pod(kept) == hashing.of_pod(stamped)
        assert pod["metadata"]["annotations"][labels.REGISTRY_CA] == ca  # the pod's own, untouched
