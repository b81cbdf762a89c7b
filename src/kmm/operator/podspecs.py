"""The pod-spec fields every pod kmm makes for a Module shares (pure).

Loader, device-plugin and DRA pods all run ``system-node-critical`` (a node
must not evict what holds its drivers), carry the Module's tolerations (so
they go where the Module may go, DESIGN §5), pull with its
``imageRepoSecret``, and run as the service account their part of the spec
names (device-plugin and DRA pods also take its
``automountServiceAccountToken``, as KMM's do). Each builder adds its
containers and volumes to this base.

``environment`` merges the variables kmm presets with the user's: each name
once, its last definition winning (the user's, which come after kmm's). The
kubelet would take the last one of a repeated name too, but a server-side
apply refuses the list (``env`` is a map keyed by ``name``: the API server
answers 500, "duplicate entries for key"), so the workload is never made.
``ROOT`` is the security context of every privileged container kmm makes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from kmm.api import devices, modules

__all__ = ["ROOT", "base", "container", "environment", "mounts", "tolerations", "volumes"]

RawObject = dict[str, Any]

# Privileged and root: a privileged container has every capability, but
# file access still goes by its user, and an image may name one of its own
# (kmm's names 65532): it could not write the kubelet's root-owned plugin,
# registry and CDI directories, nor /dev and /sys as an init container's
# mknod does. Upstream KMM leaves the image's user (and such images fail).
ROOT: Final[RawObject] = {"privileged": True, "runAsUser": 0}


def base(
    module: modules.Module,
    *,
    service_account: str | None,
    automount_token: bool | None = None,
) -> RawObject:
    """A pod spec with the shared fields set; containers and volumes are the caller's.

    ``automount_token`` None leaves the pod (and so the service account) to decide.
    """
    spec: RawObject = {"priorityClassName": "system-node-critical"}
    if module.spec.tolerations:
        spec["tolerations"] = tolerations(module)
    if module.spec.image_repo_secret is not None:
        spec["imagePullSecrets"] = [{"name": module.spec.image_repo_secret.name}]
    if service_account:
        spec["serviceAccountName"] = service_account
    if automount_token is not None:
        spec["automountServiceAccountToken"] = automount_token
    return spec


def tolerations(module: modules.Module) -> list[RawObject]:
    """The Module's tolerations as pod-spec entries (build, sign and
    preflight pods carry them too, ``kmm.operator.build.desired``)."""
    return [t.model_dump(by_alias=True, exclude_none=True) for t in module.spec.tolerations or ()]


def volumes(declared: Sequence[devices.Volume] | None) -> list[RawObject]:
    """The Module's own volumes as pod-spec entries (admission limited their host paths)."""
    return [v.model_dump(by_alias=True, exclude_none=True) for v in declared or ()]


def mounts(declared: Sequence[devices.VolumeMount] | None) -> list[RawObject]:
    """The user's volume mounts as pod-spec entries (admission checked their volumes)."""
    return [m.model_dump(by_alias=True, exclude_none=True) for m in declared or ()]


def environment(*lists: Sequence[RawObject] | None) -> list[RawObject]:
    """The entries of ``lists`` in order, each name once: where a name
    repeats, its last entry stands at the place of its last entry."""
    entries = [entry for found in lists for entry in found or ()]
    last = {entry.get("name"): index for index, entry in enumerate(entries)}
    return [entry for index, entry in enumerate(entries) if last[entry.get("name")] == index]


def container(spec: devices.ContainerSpec, name: str) -> RawObject:
    """A device-plugin or DRA container from the Module's ``ContainerSpec``
    (volume mounts and security context are the builder's)."""
    found: RawObject = {"name": name, "image": spec.image}
    for wire, value in (
        ("command", spec.command),
        ("args", spec.args),
        ("env", environment(spec.env) if spec.env is not None else None),
        ("imagePullPolicy", spec.image_pull_policy),
        ("resources", spec.resources),
    ):
        if value is not None:
            found[wire] = value
    return found
