"""A Module's build and sign pods (pure): the Pod objects that make one
kernel's image.

A *build pod* runs ``buildah build`` on the Module's Dockerfile, then
``buildah push``; a *sign pod* pulls an unsigned image, signs its modules
and pushes the result (the containers: ``podparts``). Each has one
container and is owned by the Module (``PodParams.owner``).

Facts from KMM kept here: pod names ``<module>-build-<kernel>`` and
``<module>-sign-<kernel>`` (``podnames.pod_name``); labels module.name,
resource-type (``BuildImage``/``SignImage``) and target-kernel.
``provenance_env`` makes a pod label what it pushes with the hashes of its
inputs (``scripts``), so an image can be told made from other inputs
(``images``).

Not here: the hash annotation (the planners'), whether a pod should exist
(``steps``, ``planner``) and preflight pods (``preflightpods``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from kmm.api import kernels
from kmm.operator.build import podnames, podparts

__all__ = ["RESOURCE_TYPES", "build_pod", "provenance_env", "sign_pod"]

RawObject = dict[str, Any]

RESOURCE_TYPES: Final[Mapping[podparts.PodRole, str]] = {
    "build": "BuildImage",
    "sign": "SignImage",
}


def _metadata(params: podparts.PodParams, role: podparts.PodRole) -> RawObject:
    return {
        "name": podnames.pod_name(params.module, role, params.kernel),
        "namespace": params.namespace,
        "labels": podparts.pod_labels(params, role, RESOURCE_TYPES[role]),
        **podparts.pod_annotations(params),
        "ownerReferences": [dict(params.owner)],
    }


def _module_pod(params: podparts.PodParams, part: podparts.Part) -> RawObject:
    container = podparts.builder_container(params, part, image=params.image, push=params.push)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(params, part.role),
        "spec": podparts.pod_spec(params, [container], [part]),
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
    params: podparts.PodParams,
    build: kernels.BuildTarget,
    *,
    dockerfile_key: str = podparts.DOCKERFILE_KEY,
    env: Sequence[RawObject] = (),
) -> RawObject:
    """The pod that builds ``params.image`` from ``build``'s Dockerfile and
    pushes it (unless ``params.push`` is false); ``env``:
    ``provenance_env``'s."""
    return _module_pod(params, podparts.build_part(params, build, dockerfile_key, env))


def sign_pod(
    params: podparts.PodParams,
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
    part = podparts.sign_part(
        sign, unsigned_image=unsigned_image, dir_name=dir_name, local=False, more=env
    )
    return _module_pod(params, part)
