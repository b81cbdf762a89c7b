"""Build and sign pods (pure): the Pod objects that make one kernel's image.

A *build pod* runs ``buildah build`` on the Module's Dockerfile (a ConfigMap
key, never templated) with KMM's build arguments over the user's, then
``buildah push``; a *sign pod* pulls an unsigned image, runs the kernel's
``sign-file sha256`` on every file ``filesToSign`` matches and pushes the
result. Both run the builder image (``DEFAULT_BUILDER_IMAGE``, made by
``make image``: scripts/build_builder_image.sh) and the POSIX shell scripts
below, which say what failed on one ``kmm-build:``/``kmm-sign:`` line.

Facts from KMM kept here: pod names ``<module>-build-<kernel>`` and
``<module>-sign-<kernel>``; labels module.name, resource-type
(``BuildImage``/``SignImage``) and target-kernel; restartPolicy Never; build
args KERNEL_VERSION, KERNEL_FULL_VERSION (the trimmed kernel), MOD_NAME and
MOD_NAMESPACE over the user's; each build secret at ``/run/secrets/<name>/``
and the node's ``/lib/modules`` at ``/host/lib/modules``, both also inside
RUN steps (buildah ``--volume``) so Dockerfiles written for KMM's kaniko
work unchanged; the signing key and certificate are the Secrets' keys
``key`` and ``cert``.

What a pod reports: on success one JSON line in its termination message
(build: ``{"image": ..., "digest": "sha256:..."}``; sign: ``{"image": ...,
"digest": ..., "signed": [paths in the image], "unmatched": [patterns]}``);
on failure nothing, so the kubelet puts the log's tail there instead
(``FallbackToLogsOnError``) and the operator reads why without ``pods/log``.

TLS comes from ``PodInputs`` only: ``pull_tls`` for what a pod pulls (base
images, the unsigned image), ``push_tls`` for its push; the caller picks
them from the Module (registryTLS, baseImageRegistryTLS,
unsignedImageRegistryTLS). Not here: the hash annotation (the planner's) and
whether a pod should exist.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from kmm.api import kernels, labels, modules

__all__ = [
    "BUILDER_CAPABILITIES",
    "BUILD_SCRIPT",
    "DEFAULT_BUILDER_IMAGE",
    "DOCKERFILE_KEY",
    "HOST_MODULES",
    "RESOURCE_TYPES",
    "SIGN_SCRIPT",
    "STORAGE",
    "PodInputs",
    "PodRole",
    "build_args",
    "build_pod",
    "intermediate_image",
    "pod_name",
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

_MAX_NAME: Final = 63
# Docker's limit on a tag's length.
_MAX_TAG: Final = 128
_UNSIGNED_SUFFIX: Final = "-kmm-unsigned"

# KMM's build arguments: the caller's values win over the user's.
_KMM_ARGS: Final = ("KERNEL_VERSION", "KERNEL_FULL_VERSION", "MOD_NAME", "MOD_NAMESPACE")


@dataclasses.dataclass(frozen=True)
class PodInputs:
    """What build and sign pods of one (Module, kernel) share.

    ``kernel`` is the trimmed kernel (no trailing ``+``); ``image`` the
    reference the pod pushes; ``owner`` the Module's controller reference
    (``objects.controller_reference``); ``repo_secret`` the Module's
    ``imageRepoSecret`` (a ``.dockerconfigjson`` Secret: the builder's
    authfile for pulls and the push, and the pod's imagePullSecrets);
    ``registry_ca`` PEM certificates the builder trusts besides Debian's
    (may be ""); ``node_selector`` where the pod may run.
    """

    module: str
    namespace: str
    kernel: str
    image: str
    builder_image: str
    owner: Mapping[str, Any]
    repo_secret: str | None = None
    registry_ca: str = ""
    push_tls: modules.RegistryTLS | None = None
    pull_tls: modules.RegistryTLS | None = None
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)


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


def intermediate_image(final: str) -> str:
    """Where a build that a sign follows pushes: ``<repo>:<tag>-kmm-unsigned``.

    Only the sign pod pushes under the final name, so a loader never runs an
    unsigned image. A tag that would exceed 128 characters is cut and ends
    in a digest of the whole tag. ``final`` must carry a tag, not a digest
    (admission refuses a digest beside ``build``).
    """
    repository, tag = _split_tag(final)
    new_tag = tag + _UNSIGNED_SUFFIX
    if len(new_tag) > _MAX_TAG:
        digest = _digest(tag, 12)
        new_tag = f"{tag[: _MAX_TAG - len(_UNSIGNED_SUFFIX) - len(digest) - 1]}-{digest}"
        new_tag += _UNSIGNED_SUFFIX
    return f"{repository}:{new_tag}"


def _split_tag(image: str) -> tuple[str, str]:
    if "@" in image:
        raise ValueError(f"image {image!r} names a digest; a build pushes to a tag")
    repository, colon, tag = image.rpartition(":")
    if not colon or "/" in tag:
        raise ValueError(f"image {image!r} has no tag")
    return repository, tag


def secret_path(name: str) -> str:
    """Where a build secret is, in the pod and in RUN steps (KMM's path)."""
    return f"{_SECRETS_DIR}/{name}"


def _insecure(tls: modules.RegistryTLS | None) -> bool:
    return tls is not None and bool(tls.insecure or tls.insecure_skip_tls_verify)


def _tls_verify(tls: modules.RegistryTLS | None) -> str:
    return "false" if _insecure(tls) else "true"


def _metadata(inputs: PodInputs, role: PodRole) -> RawObject:
    return {
        "name": pod_name(inputs.module, role, inputs.kernel),
        "namespace": inputs.namespace,
        "labels": {
            labels.MODULE_NAME: inputs.module,
            labels.MODULE_NAMESPACE: inputs.namespace,
            labels.ROLE: role,
            labels.RESOURCE_TYPE: RESOURCE_TYPES[role],
            labels.TARGET_KERNEL: labels.kernel_value(inputs.kernel),
        },
        "ownerReferences": [dict(inputs.owner)],
    }


def _env(inputs: PodInputs) -> list[RawObject]:
    env = [
        {"name": "KMM_IMAGE", "value": inputs.image},
        {"name": "KMM_PUSH_TLS_VERIFY", "value": _tls_verify(inputs.push_tls)},
        {"name": "KMM_PULL_TLS_VERIFY", "value": _tls_verify(inputs.pull_tls)},
        {"name": "BUILDAH_ISOLATION", "value": "chroot"},
    ]
    if inputs.registry_ca:
        env.append({"name": "KMM_REGISTRY_CA", "value": inputs.registry_ca})
    if inputs.repo_secret is not None:
        env.append({"name": "REGISTRY_AUTH_FILE", "value": f"{_AUTH_DIR}/.dockerconfigjson"})
    return env


def _pod(
    inputs: PodInputs,
    role: PodRole,
    script: str,
    args: Sequence[str],
    env: Sequence[RawObject],
    mounts: Sequence[RawObject],
    volumes: Sequence[RawObject],
) -> RawObject:
    shared_mounts: list[RawObject] = [{"name": "storage", "mountPath": STORAGE}]
    shared_volumes: list[RawObject] = [{"name": "storage", "emptyDir": {}}]
    if inputs.repo_secret is not None:
        shared_mounts.append({"name": "repo-auth", "mountPath": _AUTH_DIR, "readOnly": True})
        shared_volumes.append(
            {
                "name": "repo-auth",
                "secret": {
                    "secretName": inputs.repo_secret,
                    "items": [{"key": ".dockerconfigjson", "path": ".dockerconfigjson"}],
                },
            }
        )
    container: RawObject = {
        "name": role,
        "image": inputs.builder_image,
        "command": ["/bin/sh", "-c", script, f"kmm-{role}", *args],
        "env": [*_env(inputs), *env],
        "securityContext": {
            "runAsUser": 0,
            "capabilities": {"add": list(BUILDER_CAPABILITIES)},
            # The runtime's default syscall filter, whatever the kubelet's
            # default: buildah needs nothing it forbids (measured).
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [*shared_mounts, *mounts],
    }
    spec: RawObject = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [*shared_volumes, *volumes],
    }
    if inputs.node_selector:
        spec["nodeSelector"] = dict(inputs.node_selector)
    if inputs.repo_secret is not None:
        # The builder image may live in the Module's registry too.
        spec["imagePullSecrets"] = [{"name": inputs.repo_secret}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _metadata(inputs, role), "spec": spec}


def build_args(inputs: PodInputs, build: kernels.BuildTarget) -> list[tuple[str, str]]:
    """The user's build args, then KMM's over them (the user cannot override those)."""
    ours = {
        "KERNEL_VERSION": inputs.kernel,
        "KERNEL_FULL_VERSION": inputs.kernel,
        "MOD_NAME": inputs.module,
        "MOD_NAMESPACE": inputs.namespace,
    }
    return [(k, v) for k, v in build.build_args if k not in ours] + list(ours.items())


def build_pod(
    inputs: PodInputs, build: kernels.BuildTarget, *, dockerfile_key: str = DOCKERFILE_KEY
) -> RawObject:
    """The pod that builds ``inputs.image`` from ``build``'s Dockerfile and pushes it."""
    args = [f"--build-arg={k}={v}" for k, v in build_args(inputs, build)]
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
    return _pod(inputs, "build", BUILD_SCRIPT, args, [], mounts, volumes)


def sign_pod(
    inputs: PodInputs, sign: kernels.SignTarget, *, unsigned_image: str, dir_name: str
) -> RawObject:
    """The pod that signs ``unsigned_image``'s modules and pushes ``inputs.image``.

    Every ``filesToSign`` pattern (a shell glob, already expanded for the
    kernel) must lie under ``dir_name`` (``modprobe.dirName``, as admission
    checks); the script refuses one that does not.
    """
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
    return _pod(inputs, "sign", SIGN_SCRIPT, sign.files_to_sign, env, mounts, volumes)


# Shared by both scripts: error lines, the registry CA, JSON strings.
_COMMON: Final = r"""set -eu
fail() { echo "$0: error: $*" >&2; exit 1; }
say() { echo "$0: $*" >&2; }
# A PEM bundle the operator was given: trusted besides Debian's CAs, for
# every registry (containers/image reads the system bundle).
if [ -n "${KMM_REGISTRY_CA:-}" ]; then
    printf '%s\n' "$KMM_REGISTRY_CA" >>/etc/ssl/certs/ca-certificates.crt
fi
if [ -n "${REGISTRY_AUTH_FILE:-}" ] && [ ! -s "$REGISTRY_AUTH_FILE" ]; then
    fail "imageRepoSecret has no .dockerconfigjson"
fi
json() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g')"; }
"""

BUILD_SCRIPT: Final = (
    _COMMON
    + r"""
# "$@": buildah build's arguments (--build-arg, --volume for build secrets).
[ -s /run/kmm/dockerfile/Dockerfile ] || fail "the Dockerfile ConfigMap key is missing or empty"
if [ -n "$(ls -A /host/lib/modules 2>/dev/null)" ]; then
    set -- "$@" --volume=/host/lib/modules:/host/lib/modules:ro
fi
mkdir -p /tmp/context
say "building $KMM_IMAGE"
# RUN steps keep the pod's limits: buildah would raise them to 1048576 as
# root, which needs CAP_SYS_RESOURCE.
buildah build --tls-verify="$KMM_PULL_TLS_VERIFY" --file /run/kmm/dockerfile/Dockerfile \
    --ulimit "nofile=$(ulimit -Sn):$(ulimit -Hn)" --ulimit "nproc=$(ulimit -Sp):$(ulimit -Hp)" \
    --tag "$KMM_IMAGE" "$@" /tmp/context || fail "buildah build failed (see the lines above)"
say "pushing $KMM_IMAGE"
buildah push --tls-verify="$KMM_PUSH_TLS_VERIFY" --digestfile /tmp/digest "$KMM_IMAGE" ||
    fail "pushing $KMM_IMAGE failed"
printf '{"image": %s, "digest": %s}\n' "$(json "$KMM_IMAGE")" "$(json "$(cat /tmp/digest)")" \
    >/dev/termination-log
say "pushed $KMM_IMAGE@$(cat /tmp/digest)"
"""
)

SIGN_SCRIPT: Final = (
    _COMMON
    + r"""
# "$@": the filesToSign patterns, shell globs of paths in the image.
[ "$#" -gt 0 ] || fail "no filesToSign"
key=/run/kmm/signing/key/key
cert=/run/kmm/signing/cert/cert
[ -s "$key" ] || fail "Secret $KMM_KEY_SECRET has no key 'key'"
[ -s "$cert" ] || fail "Secret $KMM_CERT_SECRET has no key 'cert'"
# sign-file reads a PEM key only: convert a DER one.
if openssl pkey -in "$key" -inform PEM -out /tmp/key.pem 2>/dev/null ||
    openssl pkey -in "$key" -inform DER -out /tmp/key.pem 2>/dev/null; then
    key=/tmp/key.pem
else
    fail "key 'key' of Secret $KMM_KEY_SECRET is not a PEM or DER private key"
fi
openssl x509 -in "$cert" -inform PEM -noout 2>/dev/null ||
    openssl x509 -in "$cert" -inform DER -noout 2>/dev/null ||
    fail "key 'cert' of Secret $KMM_CERT_SECRET is not a PEM or DER certificate"
# sign-file refuses a key that is not the certificate's too, but only after
# the pull and in OpenSSL's words: refuse it first, naming both Secrets.
certkey=$(openssl x509 -in "$cert" -inform PEM -pubkey -noout 2>/dev/null ||
    openssl x509 -in "$cert" -inform DER -pubkey -noout)
[ "$certkey" = "$(openssl pkey -in "$key" -pubout)" ] ||
    fail "the key of Secret $KMM_KEY_SECRET does not match the certificate of Secret $KMM_CERT_SECRET"
for pattern in "$@"; do
    case $pattern in
    "${KMM_DIR_NAME%/}"/*) ;;
    *) fail "filesToSign pattern $pattern is not under $KMM_DIR_NAME" ;;
    esac
done
say "pulling $KMM_UNSIGNED_IMAGE"
container=$(buildah from --quiet --pull=always --tls-verify="$KMM_PULL_TLS_VERIFY" "$KMM_UNSIGNED_IMAGE") ||
    fail "pulling $KMM_UNSIGNED_IMAGE failed"
root=$(buildah mount "$container") || fail "mounting $KMM_UNSIGNED_IMAGE failed"
signed=""
unmatched=""
count=0
for pattern in "$@"; do
    found=0
    # Globs expand under the image's root; a pattern that matches nothing
    # stays itself and is not a file there.
    for file in "$root"$pattern; do
        [ -f "$file" ] || continue
        sign-file sha256 "$key" "$cert" "$file" || fail "sign-file failed on ${file#"$root"}"
        say "signed ${file#"$root"}"
        signed="$signed${signed:+, }$(json "${file#"$root"}")"
        found=1
        count=$((count + 1))
    done
    if [ "$found" = 0 ]; then
        say "no file matches $pattern"
        unmatched="$unmatched${unmatched:+, }$(json "$pattern")"
    fi
done
[ "$count" -gt 0 ] || fail "no file in $KMM_UNSIGNED_IMAGE matches filesToSign: $*"
buildah umount "$container" >/dev/null
buildah commit --quiet "$container" "$KMM_IMAGE" >/dev/null || fail "committing the signed image failed"
say "pushing $KMM_IMAGE"
buildah push --tls-verify="$KMM_PUSH_TLS_VERIFY" --digestfile /tmp/digest "$KMM_IMAGE" ||
    fail "pushing $KMM_IMAGE failed"
printf '{"image": %s, "digest": %s, "signed": [%s], "unmatched": [%s]}\n' \
    "$(json "$KMM_IMAGE")" "$(json "$(cat /tmp/digest)")" "$signed" "$unmatched" >/dev/termination-log
say "pushed $KMM_IMAGE@$(cat /tmp/digest), $count files signed"
"""
)
