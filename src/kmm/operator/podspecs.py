"""The pod-spec fields every pod kmm makes for a Module shares (pure).

Loader, device-plugin and DRA pods all run ``system-node-critical`` (a node
must not evict what holds its drivers), carry the Module's tolerations (so
they go where the Module may go, DESIGN §5), pull with its
``imageRepoSecret``, and run as the service account their part of the spec
names (device-plugin and DRA pods also take its
``automountServiceAccountToken``, as KMM's do). Each builder adds its
containers and volumes to this base.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kmm.api import modules

__all__ = ["base", "container", "tolerations", "volumes"]

RawObject = dict[str, Any]


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


def volumes(declared: Sequence[modules.Volume] | None) -> list[RawObject]:
    """The Module's own volumes as pod-spec entries (admission limited their host paths)."""
    return [v.model_dump(by_alias=True, exclude_none=True) for v in declared or ()]


def container(spec: modules.ContainerSpec, name: str) -> RawObject:
    """A device-plugin or DRA container from the Module's ``ContainerSpec``
    (volume mounts and security context are the builder's)."""
    found: RawObject = {"name": name, "image": spec.image}
    for wire, value in (
        ("command", spec.command),
        ("args", spec.args),
        ("env", spec.env),
        ("imagePullPolicy", spec.image_pull_policy),
        ("resources", spec.resources),
    ):
        if value is not None:
            found[wire] = value
    return found
