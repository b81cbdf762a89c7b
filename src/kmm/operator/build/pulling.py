"""Asking a node whether an image exists: pull pods (pure).

The operator's own registry check (``asking``) cannot always decide: the
registry wants credentials the Module does not give (a node has them from a
kubelet credential provider), or it is reachable from the nodes only (a
containerd mirror, a network the operator is not in). Such a fact is
``undecided``; as upstream KMM does, a node is then asked: a *pull pod*
whose only container's image is the image under test. Past the pull, the
image exists; a pull that fails says why.

The pod (``pull_pod``): ``<module>-pull-<digest of the image>``, labelled as
the Module's (``labels.PULL_ROLE``, the kernel, the image's hash), owned by
the Module (its controller); ``restartPolicy: Never``; the Module's
tolerations and ``imagePullSecrets``; ``imagePullPolicy: Always`` (the
question is whether the registry has it, not whether one node kept a copy);
the command ``/bin/sh -c "exit 0"`` (KMM's) as user 65534, without
privileges, capabilities or a service account token, so it meets the
``restricted`` Pod Security level. An image without a shell fails at start:
past the pull all the same.

Where (``choose_node``): a selected node that runs containers and on which
the Module may schedule, preferring one whose kernel is the image's, pinned
by node affinity on its name (the scheduler still applies taints and
resources). A node KWOK manages (``caches.fake_node``) "runs" any pod
without pulling anything and is never chosen. None when no selected node
fits: the kernel stays "Checking" and says so.

The verdict (``verdict``), from what the kubelet wrote: a container running
or terminated (whatever its exit), or waiting for a reason past the pull
(``CreateContainerConfigError`` ...), or the pod ``Succeeded``: the image
exists. ``ErrImagePull``/``ImagePullBackOff`` whose message says the
reference was not found (containerd's ``not found``, a registry's
``MANIFEST_UNKNOWN`` or ``insufficient_scope``, as ``asking`` reads a
refused granted token): missing. One that says the registry refused
(401/403, ``unauthorized``): ``AUTH_FAILED``. Anything else (no answer
from the node either): ``ERROR``, asked again after the back-off. The
concern keeps the verdict as the checker's fact (``existence.Checker.record``)
and the planner deletes the pod; it is asked again when the fact is
forgotten (a build or sign of the image succeeded, the trigger moved) or
its back-off passes. Limits: a node's verdict carries no digest and no
labels, so such an image is taken as it is (``images``) and its loader is
not pinned by digest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from typing import Any, Final

from kmm.api import kernels, labels, modules, scheduling
from kmm.operator import caches, objects, podspecs, views
from kmm.operator.build import existence, podstatus

__all__ = [
    "CONTAINER",
    "Asked",
    "ask",
    "choose_node",
    "image_of",
    "pod_name",
    "pull_pod",
    "verdict",
]

RawObject = dict[str, Any]

CONTAINER: Final = "pull"
_MAX_NAME: Final = 63
_NOBODY: Final = 65534
# Waiting reasons the kubelet gives only once the image is on the node.
_PAST_PULL: Final = frozenset(
    {
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
        "PostStartHookError",
    }
)
_PULL_FAILED: Final = frozenset({"ErrImagePull", "ImagePullBackOff"})
_MISSING = re.compile(
    r"not found|NotFound|manifest unknown|MANIFEST_UNKNOWN|NAME_UNKNOWN|insufficient_scope"
    r"|repository does not exist",
    re.IGNORECASE,
)
_REFUSED = re.compile(r"\b40[13]\b|unauthorized|forbidden|authorization failed|denied", re.I)


def pod_name(module: str, image: str) -> str:
    """``<module>-pull-<digest of image>``, at most 63 characters."""
    digest = hashlib.sha256(image.encode()).hexdigest()[:10]
    head = module[: _MAX_NAME - len(digest) - 6].rstrip(".-")
    return f"{head}-pull-{digest}"


def image_of(pod: Mapping[str, Any]) -> str:
    """The ``labels.IMAGE_HASH`` a pull pod carries (what it pulls)."""
    return str((podstatus.meta(pod).get("labels") or {}).get(labels.IMAGE_HASH) or "")


def pull_pod(module: modules.Module, *, image: str, kernel: str, node: str) -> RawObject:
    """The pod that asks ``node`` whether it can pull ``image``."""
    namespace = module.metadata.namespace or ""
    container: RawObject = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "Always",
        "command": ["/bin/sh", "-c", "exit 0"],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": _NOBODY,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    spec: RawObject = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            }
        },
    }
    if module.spec.tolerations:
        spec["tolerations"] = podspecs.tolerations(module)
    if module.spec.image_repo_secret is not None:
        spec["imagePullSecrets"] = [{"name": module.spec.image_repo_secret.name}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(module.metadata.name, image),
            "namespace": namespace,
            "labels": {
                labels.MODULE_NAME: module.metadata.name,
                labels.MODULE_NAMESPACE: namespace,
                labels.ROLE: labels.PULL_ROLE,
                labels.TARGET_KERNEL: labels.kernel_value(kernel),
                labels.IMAGE_HASH: labels.image_hash(image),
            },
            "ownerReferences": [objects.controller_reference(module)],
        },
        "spec": spec,
    }


@dataclasses.dataclass(frozen=True)
class Asked:
    """What asking a node takes now: a pod to create (on ``node``) or to
    delete, the pod to show (its name) and the image's message; ``later``:
    no node can be asked now, look again after a while (a node event may
    not concern the Module)."""

    message: str
    create: RawObject | None = None
    delete: RawObject | None = None
    pod: str | None = None
    node: str | None = None
    later: bool = False


def ask(
    view: views.ModuleView,
    *,
    kernel: str,
    image: str,
    fact: existence.Fact,
    judged: frozenset[str],
) -> Asked:
    """The next move to ask a node about ``image`` (``fact``: the undecided
    answer of the registry check): make the pull pod when there is none,
    wait for it, or delete one whose verdict was kept before the fact was
    forgotten (``judged``, by uid) so a new one asks again."""
    name = pod_name(view.name, image)
    pod = next((p for p in view.pods.get(labels.PULL_ROLE, ()) if podstatus.name(p) == name), None)
    why = fact.message or f"the operator cannot tell whether {image} exists"
    if pod is not None and podstatus.deleting(pod):
        return Asked(f"{why}; waiting for the last pull pod to go")
    if pod is not None and podstatus.uid(pod) in judged:
        return Asked(f"{why}; asking a node again", delete=pod)
    if pod is not None:
        bound = str((pod.get("spec") or {}).get("nodeName") or "")
        held = podstatus.waiting(pod)
        where = f"node {bound}" if bound else "a node"
        said = f" ({held.reason}: {held.message})" if held is not None else ""
        return Asked(f"{why}; asking {where}{said}", pod=name, node=bound)
    node = choose_node(view, kernel)
    if node is None:
        return Asked(f"{why}; no selected node that runs containers can be asked", later=True)
    made = pull_pod(view.module, image=image, kernel=kernel, node=node)
    return Asked(f"{why}; asking node {node}", create=made, pod=name, node=node)


def _node_kernel(node: Mapping[str, Any]) -> str:
    found = ((node.get("status") or {}).get("nodeInfo") or {}).get("kernelVersion")
    return kernels.node_kernel(found) if isinstance(found, str) and found else ""


def choose_node(view: views.ModuleView, kernel: str) -> str | None:
    """The node to ask (``module``'s docstring), or None when none fits."""
    tolerations = view.module.spec.tolerations
    fit = [
        n
        for n in view.selected
        if not caches.fake_node(n) and scheduling.is_schedulable(n, tolerations)
    ]
    fit.sort(key=lambda n: (_node_kernel(n) != kernel, podstatus.name(n)))
    return podstatus.name(fit[0]) if fit else None


def verdict(pod: Mapping[str, Any], image: str) -> existence.Fact | None:
    """What the pull pod says of ``image``; None while it has not said."""
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    where = f"node {node}" if node else "a node"
    if podstatus.phase(pod) == "Succeeded":
        return existence.Fact(existence.State.EXISTS, node=node or "?")
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        state = status.get("state") or {}
        if "running" in state or "terminated" in state:
            return existence.Fact(existence.State.EXISTS, node=node or "?")
        waiting = state.get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason in _PAST_PULL:
            return existence.Fact(existence.State.EXISTS, node=node or "?")
        message = str(waiting.get("message") or "")
        if reason == "InvalidImageName":
            return existence.Fact(
                existence.State.ERROR,
                f"{image}: {where} refused the image name",
                node=node or "?",
                failure=reason,
            )
        if reason in _PULL_FAILED:
            return _failed_pull(image, where, node or "?", message)
    if podstatus.phase(pod) == "Failed":
        return existence.Fact(
            existence.State.ERROR,
            f"{image}: the pull pod on {where} failed before its container started",
            node=node or "?",
            failure="PullPodFailed",
        )
    return None


def _failed_pull(image: str, where: str, node: str, message: str) -> existence.Fact:
    if _MISSING.search(message):
        return existence.Fact(
            existence.State.MISSING,
            f"{image} does not exist ({where} found no such image)",
            node=node,
        )
    if _REFUSED.search(message):
        return existence.Fact(
            existence.State.AUTH_FAILED,
            f"{image}: the registry refused {where} the image (its pull credentials)",
            node=node,
            failure="PullRefused",
        )
    return existence.Fact(
        existence.State.ERROR,
        f"{image}: {where} could not pull the image either",
        node=node,
        failure="PullFailed",
    )
