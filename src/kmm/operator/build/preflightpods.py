"""The preflight pod (pure): the pod that answers a PreflightValidation for
one Module, making its final image for one kernel.

The same containers as the Module's build and sign pods (``podparts``) in
one pod, so that nothing but the final image ever reaches a registry.
Build only: container ``build``; sign only: container ``sign`` pulling
``unsignedImage``; both: init container ``build`` tagging
``LOCAL_UNSIGNED_IMAGE`` in the pod's buildah storage (an emptyDir both
containers mount), then container ``sign`` reading it with
``--pull=never``. ``PodParams.push`` false (``pushBuiltImage: false``)
pushes nothing at all; true pushes the final image only. Such pods are
named ``podnames.preflight_pod_name``, labelled with role
``PREFLIGHT_ROLE`` and the validation, owned by the validation, not the
Module, and kept while it exists (the build concern's ``retention`` does
not apply to them). For a preflight pod's failed build, the log's tail is
in ``status.initContainerStatuses[]``.

Not here: whether a pod should exist (``kmm.operator.preflight.planner``),
its hash annotation, and provenance labels (preflight pods set none:
``scripts``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kmm.api import kernels, labels
from kmm.operator.build import podnames, podparts

__all__ = ["LOCAL_UNSIGNED_IMAGE", "PREFLIGHT_RESOURCE_TYPE", "PREFLIGHT_ROLE", "preflight_pod"]

RawObject = dict[str, Any]

PREFLIGHT_ROLE: Final = "preflight"
PREFLIGHT_RESOURCE_TYPE: Final = "PreflightImage"

# Where a preflight pod's build init container leaves the unsigned image for
# its sign container: a name in the pod's own buildah storage, never pushed
# (no registry answers to "localhost"), the same in every pod (each has its
# own storage).
LOCAL_UNSIGNED_IMAGE: Final = "localhost/kmm-preflight/unsigned:latest"


def preflight_pod(
    params: podparts.PodParams,
    *,
    validation: str,
    owner: Mapping[str, Any],
    build: kernels.BuildTarget | None,
    sign: kernels.SignTarget | None,
    unsigned_image: str | None = None,
    dir_name: str,
    dockerfile_key: str = podparts.DOCKERFILE_KEY,
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
    parts: list[podparts.Part] = []
    containers: list[RawObject] = []
    if build is not None:
        part = podparts.build_part(params, build, dockerfile_key)
        if sign is None:
            containers.append(
                podparts.builder_container(params, part, image=params.image, push=params.push)
            )
        else:
            # The init container's image stays in the pod: only the signed
            # one may reach a registry, under the final name.
            containers.append(
                podparts.builder_container(params, part, image=LOCAL_UNSIGNED_IMAGE, push=False)
            )
        parts.append(part)
    if sign is not None:
        if build is not None:
            if unsigned_image is not None:
                raise ValueError(
                    "with a build, the sign reads the build's image: no unsigned_image"
                )
            part = podparts.sign_part(
                sign, unsigned_image=LOCAL_UNSIGNED_IMAGE, dir_name=dir_name, local=True
            )
        else:
            unsigned = unsigned_image if unsigned_image is not None else sign.unsigned_image
            if unsigned is None:
                raise ValueError("a sign without build needs an unsigned image")
            part = podparts.sign_part(sign, unsigned_image=unsigned, dir_name=dir_name, local=False)
        containers.append(
            podparts.builder_container(params, part, image=params.image, push=params.push)
        )
        parts.append(part)
    metadata: RawObject = {
        "name": podnames.preflight_pod_name(validation, params.module),
        "namespace": params.namespace,
        "labels": {
            **podparts.pod_labels(params, PREFLIGHT_ROLE, PREFLIGHT_RESOURCE_TYPE),
            labels.PREFLIGHT: labels.preflight_value(validation),
        },
        **podparts.pod_annotations(params),
        "ownerReferences": [dict(owner)],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": podparts.pod_spec(params, containers, parts),
    }
