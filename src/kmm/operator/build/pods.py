"""Build, sign and preflight pods (pure): the Pod objects that make one kernel's image.

A *build pod* runs ``buildah build`` on the Module's Dockerfile (a ConfigMap
key, never templated) with KMM's build arguments over the user's, then
``buildah push``; a *sign pod* pulls an unsigned image, runs the kernel's
``sign-file sha256`` on every file ``filesToSign`` matches and pushes the
result. Both run the builder image (``DEFAULT_BUILDER_IMAGE``, made by
``make image``: scripts/build_builder_image.sh) and the shell scripts of
:mod:`.scripts`, which say what failed on one ``kmm-build:``/``kmm-sign:``
line and, on success, write one JSON line (described there) as the
termination message.

A *preflight pod* (``preflight_pod``) answers a PreflightValidation for one
Module: the same containers in one pod, so that nothing but the final image
ever reaches a registry. Build only: container ``build``; sign only:
container ``sign`` pulling ``unsignedImage``; both: init container ``build``
tagging ``LOCAL_UNSIGNED_IMAGE`` in the pod's buildah storage (an emptyDir
both containers mount), then container ``sign`` reading it with
``--pull=never``. ``PodParams.push`` false (``pushBuiltImage: false``) pushes
nothing at all; true pushes the final image only. Such pods are owned by the
validation, not the Module, and kept while it exists (the build concern's
``retention`` does not apply to them).

Facts from KMM kept here: pod names ``<module>-build-<kernel>`` and
``<module>-sign-<kernel>``; labels module.name, resource-type
(``BuildImage``/``SignImage``) and target-kernel; restartPolicy Never; build
args KERNEL_VERSION, KERNEL_FULL_VERSION (the trimmed kernel), MOD_NAME and
MOD_NAMESPACE over the user's, and DTK_AUTO (``toolkit``: given in
``PodParams.driver_toolkit``) unless the user sets it; each build secret at ``/run/secrets/<name>/``
and the node's ``/lib/modules`` at ``/host/lib/modules``, both also inside
RUN steps (buildah ``--volume``) so Dockerfiles written for KMM's kaniko
work unchanged; the signing key and certificate are the Secrets' keys
``key`` and ``cert``.

A failed container writes no summary, so the kubelet puts the log's tail in
its termination message instead (``FallbackToLogsOnError``, on every
container) and the operator reads why without ``pods/log``; for a preflight
pod's failed build that is ``status.initContainerStatuses[]``.

TLS comes from ``PodParams`` only: ``pull_tls`` for what a pod pulls (base
images, the unsigned image), ``push_tls`` for its push; the caller picks
them from the Module (registryTLS, baseImageRegistryTLS,
unsignedImageRegistryTLS). Not here: the hash annotation (the planners') and
whether a pod should exist.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from kmm.api import buildsign, kernels, labels
from kmm.operator.build import scripts, toolkit

__all__ = [
    "BUILDER_CAPABILITIES",
    "DEFAULT_BUILDER_IMAGE",
    "DOCKERFILE_KEY",
    "HOST_MODULES",
    "LOCAL_UNSIGNED_IMAGE",
    "PREFLIGHT_RESOURCE_TYPE",
    "PREFLIGHT_ROLE",
    "RESOURCE_TYPES",
    "STORAGE",
    "PodParams",
    "PodRole",
    "build_args",
    "build_pod",
    "pod_name",
    "preflight_pod",
    "preflight_pod_name",
    "provenance_env",
    "secret_path",
    "sign_pod",
]

RawObject = dict[str, Any]
PodRole = Literal["build", "sign"]

# The image `make image` tags build/kmm-builder-image.tar with: the operator's
# --builder-image default (and the chart's builder.image), beside kmm's own
# image (kmm.api.installation.IMAGE).
DEFAULT_BUILDER_IMAGE: Final = "ghcr.io/kmm/kmm-builder:0.1.0"

DOCKERFILE_KEY: Final = "dockerfile"
RESOURCE_TYPES: Final[Mapping[PodRole, str]] = {"build": "BuildImage", "sign": "SignImage"}
PREFLIGHT_ROLE: Final = "preflight"
PREFLIGHT_RESOURCE_TYPE: Final = "PreflightImage"

# Where a preflight pod's build init container leaves the unsigned image for
# its sign container: a name in the pod's own buildah storage, never pushed
# (no registry answers to "localhost"), the same in every pod (each has its
# own storage).
LOCAL_UNSIGNED_IMAGE: Final = "localhost/kmm-preflight/unsigned:latest"

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

_MAX_NAME: Final = 63

# KMM's build arguments: the caller's values win over the user's.
_KMM_ARGS: Final = ("KERNEL_VERSION", "KERNEL_FULL_VERSION", "MOD_NAME", "MOD_NAMESPACE")


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


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


_UNSAFE_NAME = re.compile(r"[^a-z0-9.-]")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def pod_name(module: str, role: PodRole, kernel: str) -> str:
    """``<module>-<role>-<kernel>`` as a DNS name of at most 63 characters.

    The kernel keeps ``[a-z0-9.-]``; anything else becomes ``-``. When that
    changed the kernel (``6.12.57+deb13-amd64``: two kernels could then share
    a name) or the name is too long or invalid, the name is cut and ends in a
    digest of (module, role, kernel), so distinct kernels keep distinct pods.
    """
    safe = _UNSAFE_NAME.sub("-", kernel.lower())
    name = f"{module}-{role}-{safe}"
    if safe == kernel and len(name) <= _MAX_NAME and _DNS_SUBDOMAIN.match(name):
        return name
    digest = _digest("\x00".join((module, role, kernel)), 10)
    head = name[: _MAX_NAME - len(digest) - 1]
    # Each dot-separated part must end alphanumeric: cut back to one that does.
    head = re.sub(r"[^a-z0-9]+$", "", re.sub(r"[-.]{2,}", "-", head))
    return f"{head}-{digest}" if head else digest


def preflight_pod_name(validation: str, module: str) -> str:
    """``<validation>-<module>-<digest>`` as a DNS label of at most 63 characters.

    The digest of (validation, module) is always there: the joined text alone
    is ambiguous (``a`` + ``b-c`` and ``a-b`` + ``c`` both read ``a-b-c``, and
    two validations' pods for Modules of one namespace would then fight over
    one name). Dots become ``-`` and the text is cut to leave room for it.
    """
    digest = _digest("\x00".join((validation, module)), 10)
    name = f"{validation}-{module}"
    head = re.sub(r"[^a-z0-9-]", "-", name.lower())[: _MAX_NAME - len(digest) - 1]
    head = re.sub(r"-{2,}", "-", head).strip("-")
    return f"{head}-{digest}" if head else digest


def secret_path(name: str) -> str:
    """Where a build secret is, in the pod and in RUN steps (KMM's path)."""
    return f"{_SECRETS_DIR}/{name}"


def _insecure(tls: buildsign.RegistryTLS | None) -> bool:
    return tls is not None and bool(tls.insecure or tls.insecure_skip_tls_verify)


def _tls_verify(tls: buildsign.RegistryTLS | None) -> str:
    return "false" if _insecure(tls) else "true"


def _labels(params: PodParams, role: str, resource_type: str) -> dict[str, str]:
    return {
        labels.MODULE_NAME: params.module,
        labels.MODULE_NAMESPACE: params.namespace,
        labels.ROLE: role,
        labels.RESOURCE_TYPE: resource_type,
        labels.TARGET_KERNEL: labels.kernel_value(params.kernel),
    }


def _metadata(params: PodParams, role: PodRole) -> RawObject:
    return {
        "name": pod_name(params.module, role, params.kernel),
        "namespace": params.namespace,
        "labels": _labels(params, role, RESOURCE_TYPES[role]),
        **_annotations(params),
        "ownerReferences": [dict(params.owner)],
    }


def _annotations(params: PodParams) -> RawObject:
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
class _Part:
    """One container's script, arguments, extra environment, mounts and the
    volumes those mounts need."""

    role: PodRole
    script: str
    args: Sequence[str]
    env: Sequence[RawObject]
    mounts: Sequence[RawObject]
    volumes: Sequence[RawObject]


def _container(params: PodParams, part: _Part, *, image: str, push: bool) -> RawObject:
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


def _spec(params: PodParams, containers: Sequence[RawObject], parts: Sequence[_Part]) -> RawObject:
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


def _build_part(
    params: PodParams,
    build: kernels.BuildTarget,
    dockerfile_key: str,
    env: Sequence[RawObject] = (),
) -> _Part:
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
    return _Part("build", scripts.BUILD, args, env, mounts, volumes)


def _sign_part(
    sign: kernels.SignTarget,
    *,
    unsigned_image: str,
    dir_name: str,
    local: bool,
    more: Sequence[RawObject] = (),
) -> _Part:
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
    return _Part("sign", scripts.SIGN, sign.files_to_sign, env, mounts, volumes)


def _module_pod(params: PodParams, part: _Part) -> RawObject:
    container = _container(params, part, image=params.image, push=params.push)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(params, part.role),
        "spec": _spec(params, [container], [part]),
    }


def provenance_env(
    *,
    build_hash: str | None = None,
    trigger: str = "",
    sign_hash: str | None = None,
    expect_build_hash: str | None = None,
) -> list[RawObject]:
    """The environment that makes a pod label what it pushes
    (``scripts``: ``KMM_BUILD_HASH`` ...), and a sign check its input."""
    env: list[RawObject] = []
    if build_hash is not None:
        env.append({"name": "KMM_BUILD_HASH", "value": build_hash})
    if sign_hash is not None:
        env.append({"name": "KMM_SIGN_HASH", "value": sign_hash})
    if expect_build_hash is not None:
        env.append({"name": "KMM_EXPECT_BUILD_HASH", "value": expect_build_hash})
    if env and trigger:
        env.append({"name": "KMM_REBUILD_TRIGGER", "value": trigger})
    return env


def build_pod(
    params: PodParams,
    build: kernels.BuildTarget,
    *,
    dockerfile_key: str = DOCKERFILE_KEY,
    env: Sequence[RawObject] = (),
) -> RawObject:
    """The pod that builds ``params.image`` from ``build``'s Dockerfile and
    pushes it (unless ``params.push`` is false); ``env``:
    ``provenance_env``'s."""
    return _module_pod(params, _build_part(params, build, dockerfile_key, env))


def sign_pod(
    params: PodParams,
    sign: kernels.SignTarget,
    *,
    unsigned_image: str,
    dir_name: str,
    env: Sequence[RawObject] = (),
) -> RawObject:
    """The pod that signs ``unsigned_image``'s modules and pushes ``params.image``
    (unless ``params.push`` is false); ``env``: ``provenance_env``'s.

    Every ``filesToSign`` pattern (a shell glob, already expanded for the
    kernel) must lie under ``dir_name`` (``modprobe.dirName``, as admission
    checks); the script refuses one that does not.
    """
    part = _sign_part(sign, unsigned_image=unsigned_image, dir_name=dir_name, local=False, more=env)
    return _module_pod(params, part)


def preflight_pod(
    params: PodParams,
    *,
    validation: str,
    owner: Mapping[str, Any],
    build: kernels.BuildTarget | None,
    sign: kernels.SignTarget | None,
    unsigned_image: str | None = None,
    dir_name: str,
    dockerfile_key: str = DOCKERFILE_KEY,
) -> RawObject:
    """The pod that makes ``params.image`` (the Module's final image) for
    PreflightValidation ``validation``, pushing it only when ``params.push``.

    ``owner`` is the validation's controller reference and the pod's only
    owner (``params.owner``, the Module's, is not read: params can be made
    as for the Module's own pods). ``build`` and ``sign`` are the kernel
    mapping's (at least one). ``unsigned_image`` is what a sign without
    build signs (default: ``sign.unsigned_image``); with a build there is
    none to give, the sign reads the build's ``LOCAL_UNSIGNED_IMAGE``.
    ``dir_name`` is ``modprobe.dirName`` (the sign's patterns lie under it).
    """
    if build is None and sign is None:
        raise ValueError("a preflight pod needs a build or a sign")
    parts: list[_Part] = []
    containers: list[RawObject] = []
    if build is not None:
        part = _build_part(params, build, dockerfile_key)
        if sign is None:
            containers.append(_container(params, part, image=params.image, push=params.push))
        else:
            # The init container's image stays in the pod: only the signed
            # one may reach a registry, under the final name.
            containers.append(_container(params, part, image=LOCAL_UNSIGNED_IMAGE, push=False))
        parts.append(part)
    if sign is not None:
        if build is not None:
            if unsigned_image is not None:
                raise ValueError(
                    "with a build, the sign reads the build's image: no unsigned_image"
                )
            part = _sign_part(
                sign, unsigned_image=LOCAL_UNSIGNED_IMAGE, dir_name=dir_name, local=True
            )
        else:
            unsigned = unsigned_image if unsigned_image is not None else sign.unsigned_image
            if unsigned is None:
                raise ValueError("a sign without build needs an unsigned image")
            part = _sign_part(sign, unsigned_image=unsigned, dir_name=dir_name, local=False)
        containers.append(_container(params, part, image=params.image, push=params.push))
        parts.append(part)
    metadata: RawObject = {
        "name": preflight_pod_name(validation, params.module),
        "namespace": params.namespace,
        "labels": {
            **_labels(params, PREFLIGHT_ROLE, PREFLIGHT_RESOURCE_TYPE),
            labels.PREFLIGHT: labels.preflight_value(validation),
        },
        **_annotations(params),
        "ownerReferences": [dict(owner)],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": _spec(params, containers, parts),
    }
