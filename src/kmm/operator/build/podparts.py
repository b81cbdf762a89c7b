"""The builder container and the pod around it, shared by build, sign and
preflight pods (pure).

Every such container runs the builder image (``PodParams.builder_image``:
``--builder-image``, by default ``settings.DEFAULT_BUILDER_IMAGE``, made by
``make image``: scripts/build_builder_image.sh) and one of the shell scripts of
:mod:`.scripts`, which say what failed on one ``kmm-build:``/``kmm-sign:``
line and, on success, write one JSON line (described there) as the
termination message. A container is a ``Part``: ``build_part`` (``buildah
build`` on the Module's Dockerfile, a ConfigMap key, never templated, with
KMM's build arguments over the user's) or ``sign_part`` (the kernel's
``sign-file sha256`` on every file ``filesToSign`` matches). ``pods``
puts one in a Module's build or sign pod; ``preflightpods`` one or two in
a preflight pod.

Facts from KMM kept here: restartPolicy Never; build args KERNEL_VERSION,
KERNEL_FULL_VERSION (the trimmed kernel), MOD_NAME and MOD_NAMESPACE over
the user's, and DTK_AUTO (``toolkit``: given in ``PodParams.driver_toolkit``)
unless the user sets it; each build secret at ``/run/secrets/<name>/`` and the node's
``/lib/modules`` at ``/host/lib/modules``, both also inside RUN steps
(buildah ``--volume``) so Dockerfiles written for KMM's kaniko work
unchanged; the signing key and certificate are the Secrets' keys ``key``
and ``cert``.

A failed container writes no summary, so the kubelet puts the log's tail in
its termination message instead (``FallbackToLogsOnError``, on every
container) and the operator reads why without ``pods/log``.

TLS comes from ``PodParams`` only: ``pull_tls`` for what a pod pulls (base
images, the unsigned image), ``push_tls`` for its push; the caller picks
them from the Module (registryTLS, baseImageRegistryTLS,
unsignedImageRegistryTLS). Not here: pod names (``podnames``), the hash
annotation (the planners') and whether a pod should exist.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from kmm.api import buildsign, kernels, labels
from kmm.operator.build import scripts, toolkit

__all__ = [
    "BUILDER_CAPABILITIES",
    "DOCKERFILE_KEY",
    "HOST_MODULES",
    "STORAGE",
    "Part",
    "PodParams",
    "PodRole",
    "build_args",
    "build_part",
    "builder_container",
    "pod_annotations",
    "pod_labels",
    "pod_spec",
    "secret_path",
    "sign_part",
]

RawObject = dict[str, Any]
PodRole = Literal["build", "sign"]

DOCKERFILE_KEY: Final = "dockerfile"


# What buildah needs beyond a root container's default capabilities
# (measured on the sandbox's container nodes, README "Build and sign pods"):
# CAP_SYS_ADMIN, for the mounts of its overlay storage (on the emptyDir at
# STORAGE), of `buildah mount` (sign) and of RUN steps under chroot
# isolation. Without it buildah re-executes itself in a user namespace,
# which the RuntimeDefault seccomp profile the pods carry refuses, and
# `buildah mount` fails outright; privileged is not needed.
BUILDER_CAPABILITIES: Final = ("SYS_ADMIN",)

# Where the pods keep things (none of them user-visible but the first two).
HOST_MODULES: Final = "/host/lib/modules"
_SECRETS_DIR: Final = "/run/secrets"
STORAGE: Final = "/var/lib/containers"
_DOCKERFILE_DIR: Final = "/run/kmm/dockerfile"
_AUTH_DIR: Final = "/run/kmm/auth"
_KEY_DIR: Final = "/run/kmm/signing/key"
_CERT_DIR: Final = "/run/kmm/signing/cert"
# The registry CA reaches the containers as a file: the pod's
# labels.REGISTRY_CA annotation, projected by the downward API. Not an
# environment variable: Linux refuses an exec whose one string exceeds 128
# KiB (MAX_ARG_STRLEN), so a large bundle failed every pod at start;
# an annotation holds up to 256 KiB (settings.MAX_REGISTRY_CA).
_REGISTRY_CA_DIR: Final = "/run/kmm/registry-ca"
_REGISTRY_CA_FILE: Final = "ca.crt"


@dataclasses.dataclass(frozen=True)
class PodParams:
    """What build, sign and preflight pods of one (Module, kernel) share.

    ``kernel`` is the trimmed kernel (no trailing ``+``); ``image`` the
    reference the pod pushes (a preflight pod's: the Module's final image);
    ``owner`` the Module's controller reference
    (``objects.controller_reference``; ``preflight_pod`` takes its own);
    ``repo_secret`` the Module's ``imageRepoSecret`` (a ``.dockerconfigjson``
    Secret: the builder's authfile for pulls and the push, and the pod's
    imagePullSecrets); ``registry_ca`` PEM certificates the builder trusts
    besides Debian's (may be ""; see ``_REGISTRY_CA_DIR``); ``node_selector``
    and ``tolerations`` (the Module's, as KMM's pods carry them) where the
    pod may run; ``push`` false keeps the image in the pod and pushes
    nothing (a PreflightValidation's ``pushBuiltImage: false``);
    ``driver_toolkit`` the build argument ``DTK_AUTO`` (``toolkit.value``;
    None: not passed).
    """

    module: str
    namespace: str
    kernel: str
    image: str
    builder_image: str
    owner: Mapping[str, Any]
    repo_secret: str | None = None
    registry_ca: str = ""
    push_tls: buildsign.RegistryTLS | None = None
    pull_tls: buildsign.RegistryTLS | None = None
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    push: bool = True
    driver_toolkit: str | None = None


def secret_path(name: str) -> str:
    """Where a build secret is, in the pod and in RUN steps (KMM's path)."""
    return f"{_SECRETS_DIR}/{name}"


def _insecure(tls: buildsign.RegistryTLS | None) -> bool:
    return tls is not None and bool(tls.insecure or tls.insecure_skip_tls_verify)


def _tls_verify(tls: buildsign.RegistryTLS | None) -> str:
    return "false" if _insecure(tls) else "true"


def pod_labels(params: PodParams, role: str, resource_type: str) -> dict[str, str]:
    """What every such pod is labelled with: its Module, ``role``,
    ``resource_type`` and kernel."""
    return {
        labels.MODULE_NAME: params.module,
        labels.MODULE_NAMESPACE: params.namespace,
        labels.ROLE: role,
        labels.RESOURCE_TYPE: resource_type,
        labels.TARGET_KERNEL: labels.kernel_value(params.kernel),
    }


def pod_annotations(params: PodParams) -> RawObject:
    """The pod metadata's ``annotations``: the registry CA (projected into
    the containers as a file), none without one."""
    if not params.registry_ca:
        return {}
    return {"annotations": {labels.REGISTRY_CA: params.registry_ca}}


def _env(params: PodParams, image: str, push: bool) -> list[RawObject]:
    env = [
        {"name": "KMM_IMAGE", "value": image},
        {"name": "KMM_PUSH_TLS_VERIFY", "value": _tls_verify(params.push_tls)},
        {"name": "KMM_PULL_TLS_VERIFY", "value": _tls_verify(params.pull_tls)},
        {"name": "BUILDAH_ISOLATION", "value": "chroot"},
    ]
    if not push:
        # Only when not pushing: the scripts push by default, and a Module's
        # own pods render as they did before preflight pods existed.
        env.append({"name": "KMM_PUSH", "value": "false"})
    if params.registry_ca:
        path = f"{_REGISTRY_CA_DIR}/{_REGISTRY_CA_FILE}"
        env.append({"name": "KMM_REGISTRY_CA_FILE", "value": path})
    if params.repo_secret is not None:
        env.append({"name": "REGISTRY_AUTH_FILE", "value": f"{_AUTH_DIR}/.dockerconfigjson"})
    return env


@dataclasses.dataclass(frozen=True)
class Part:
    """One container's script, arguments, extra environment, mounts and the
    volumes those mounts need."""

    role: PodRole
    script: str
    args: Sequence[str]
    env: Sequence[RawObject]
    mounts: Sequence[RawObject]
    volumes: Sequence[RawObject]


def builder_container(params: PodParams, part: Part, *, image: str, push: bool) -> RawObject:
    """``part``'s container: its script in the builder image, as root with
    ``BUILDER_CAPABILITIES``, making ``image`` (pushed only when ``push``)."""
    mounts: list[RawObject] = [{"name": "storage", "mountPath": STORAGE}]
    if params.repo_secret is not None:
        mounts.append({"name": "repo-auth", "mountPath": _AUTH_DIR, "readOnly": True})
    if params.registry_ca:
        mounts.append({"name": "registry-ca", "mountPath": _REGISTRY_CA_DIR, "readOnly": True})
    return {
        "name": part.role,
        "image": params.builder_image,
        "command": ["/bin/sh", "-c", part.script, f"kmm-{part.role}", *part.args],
        "env": [*_env(params, image, push), *part.env],
        "securityContext": {
            "runAsUser": 0,
            "capabilities": {"add": list(BUILDER_CAPABILITIES)},
            # The runtime's default syscall filter, whatever the kubelet's
            # default: buildah needs nothing it forbids (measured).
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [*mounts, *part.mounts],
    }


def pod_spec(
    params: PodParams, containers: Sequence[RawObject], parts: Sequence[Part]
) -> RawObject:
    """restartPolicy Never, ``containers`` (the last is the main one, any
    before it init containers) and the volumes of the storage, the repo
    secret and ``parts``."""
    volumes: list[RawObject] = [{"name": "storage", "emptyDir": {}}]
    if params.repo_secret is not None:
        volumes.append(
            {
                "name": "repo-auth",
                "secret": {
                    "secretName": params.repo_secret,
                    "items": [{"key": ".dockerconfigjson", "path": ".dockerconfigjson"}],
                },
            }
        )
    if params.registry_ca:
        field = f"metadata.annotations['{labels.REGISTRY_CA}']"
        volumes.append(
            {
                "name": "registry-ca",
                "downwardAPI": {
                    "items": [{"path": _REGISTRY_CA_FILE, "fieldRef": {"fieldPath": field}}]
                },
            }
        )
    spec: RawObject = {"restartPolicy": "Never"}
    if containers[:-1]:
        spec["initContainers"] = list(containers[:-1])
    spec["containers"] = [containers[-1]]
    spec["volumes"] = [*volumes, *(v for part in parts for v in part.volumes)]
    if params.node_selector:
        spec["nodeSelector"] = dict(params.node_selector)
    if params.tolerations:
        spec["tolerations"] = [dict(t) for t in params.tolerations]
    if params.repo_secret is not None:
        # The builder image may live in the Module's registry too.
        spec["imagePullSecrets"] = [{"name": params.repo_secret}]
    return spec


def build_args(params: PodParams, build: kernels.BuildTarget) -> list[tuple[str, str]]:
    """The user's build args, then KMM's over them (the user cannot override
    those), then ``DTK_AUTO`` when given and the user does not set it (a
    preset the user sets too is passed once, with the user's value)."""
    ours = {
        "KERNEL_VERSION": params.kernel,
        "KERNEL_FULL_VERSION": params.kernel,
        "MOD_NAME": params.module,
        "MOD_NAMESPACE": params.namespace,
    }
    found = [(k, v) for k, v in build.build_args if k not in ours] + list(ours.items())
    if params.driver_toolkit is not None and all(k != toolkit.BUILD_ARG for k, _ in found):
        found.append((toolkit.BUILD_ARG, params.driver_toolkit))
    return found


def build_part(
    params: PodParams,
    build: kernels.BuildTarget,
    dockerfile_key: str,
    env: Sequence[RawObject] = (),
) -> Part:
    """The build's part: ``buildah build`` of ``build``'s Dockerfile (key
    ``dockerfile_key`` of its ConfigMap) with ``build_args``, the build
    secrets and the node's modules; ``env`` added."""
    args = [f"--build-arg={k}={v}" for k, v in build_args(params, build)]
    mounts: list[RawObject] = [
        {"name": "dockerfile", "mountPath": _DOCKERFILE_DIR, "readOnly": True},
        {"name": "host-modules", "mountPath": HOST_MODULES, "readOnly": True},
    ]
    volumes: list[RawObject] = [
        {
            "name": "dockerfile",
            "configMap": {
                "name": build.dockerfile_config_map,
                "items": [{"key": dockerfile_key, "path": "Dockerfile"}],
            },
        },
        # Created when missing: the script passes it on only when it has files.
        {"name": "host-modules", "hostPath": {"path": "/lib/modules", "type": "DirectoryOrCreate"}},
    ]
    for index, secret in enumerate(build.secrets):
        path = secret_path(secret)
        mounts.append({"name": f"secret-{index}", "mountPath": path, "readOnly": True})
        volumes.append({"name": f"secret-{index}", "secret": {"secretName": secret}})
        args.append(f"--volume={path}:{path}:ro")
    return Part("build", scripts.BUILD, args, env, mounts, volumes)


def sign_part(
    sign: kernels.SignTarget,
    *,
    unsigned_image: str,
    dir_name: str,
    local: bool,
    more: Sequence[RawObject] = (),
) -> Part:
    """The sign's part: ``sign-file`` on what ``sign``'s ``filesToSign``
    match (under ``dir_name``) in ``unsigned_image``, read from the pod's
    own storage when ``local`` (else pulled); ``more`` environment added."""
    mounts = [
        {"name": "signing-key", "mountPath": _KEY_DIR, "readOnly": True},
        {"name": "signing-cert", "mountPath": _CERT_DIR, "readOnly": True},
    ]
    volumes = [
        {"name": "signing-key", "secret": {"secretName": sign.key_secret}},
        {"name": "signing-cert", "secret": {"secretName": sign.cert_secret}},
    ]
    env = [
        {"name": "KMM_UNSIGNED_IMAGE", "value": unsigned_image},
        {"name": "KMM_DIR_NAME", "value": dir_name},
        {"name": "KMM_KEY_SECRET", "value": sign.key_secret},
        {"name": "KMM_CERT_SECRET", "value": sign.cert_secret},
    ]
    if local:
        env.append({"name": "KMM_UNSIGNED_LOCAL", "value": "true"})
    env.extend(more)
    return Part("sign", scripts.SIGN, sign.files_to_sign, env, mounts, volumes)
