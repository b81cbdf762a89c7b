"""What the device-plugin and DRA driver builders share (pure).

Both build one DaemonSet per Module (per version with ordered upgrades): its
name and pod labels carry the role and the version; it runs where the module
is loaded (``.ready``, plus the role's own gates and the device-plugin
version label with a version), or on ``spec.selector`` for a Module without
``moduleLoader``; its init container mounts what the user listed and runs
privileged and as root, as the main container does. The builders add their containers,
volumes and gates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from kmm.api import devices, labels, modules
from kmm.operator import objects, podspecs

__all__ = ["daemonset", "daemonset_name", "init_container", "node_selector", "pod_labels"]

RawObject = dict[str, Any]
Role = Literal["device-plugin", "dra"]


def _version(module: modules.Module) -> str | None:
    loader = module.spec.module_loader
    return loader.container.version if loader is not None else None


def _ids(module: modules.Module) -> tuple[str, str]:
    return module.metadata.namespace or "", module.metadata.name


def daemonset_name(module: modules.Module, role: Role) -> str:
    version = _version(module)
    return labels.daemonset_name(
        module.metadata.name, role, *(() if version is None else (version,))
    )


def pod_labels(module: modules.Module, role: Role) -> dict[str, str]:
    found = labels.module_labels(*_ids(module), role)
    version = _version(module)
    if version is not None:
        found[labels.MODULE_VERSION] = version
    return found


def node_selector(module: modules.Module, gates: Mapping[str, str] = {}) -> dict[str, str]:
    """``spec.selector`` and ``gates`` without a loader; else ``.ready``, ``gates``
    and the version label. The gates hold either way: they are how the
    operator takes a role off a node (a cordoned node loses its DRA target)."""
    if module.spec.module_loader is None:
        return {**module.spec.selector, **(gates or {})}
    namespace, name = _ids(module)
    selected = {labels.ready(namespace, name): "", **(gates or {})}
    version = _version(module)
    if version is not None:
        selected[labels.device_plugin_version(namespace, name)] = version
    return selected


def init_container(spec: devices.ContainerSpec, name: str) -> RawObject:
    init = podspecs.container(spec, name)
    # Privileged, as upstream KMM makes every device-plugin and DRA container,
    # init containers included: the init containers of KMM Modules are
    # written for it (mknod of device nodes, writes under /sys) and would
    # fail here unprivileged; root for the same reason (``podspecs.ROOT``).
    # The pod is privileged already (its main container), so this grants
    # the pod nothing it did not have.
    init["securityContext"] = dict(podspecs.ROOT)
    if spec.volume_mounts:
        init["volumeMounts"] = podspecs.mounts(spec.volume_mounts)
    return init


def daemonset(module: modules.Module, role: Role, pod_spec: RawObject) -> RawObject:
    """The role's DaemonSet around ``pod_spec``, owned by the Module, hash-stamped."""
    selected = pod_labels(module, role)
    return objects.stamped(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {
                "name": daemonset_name(module, role),
                "namespace": module.metadata.namespace,
                "labels": dict(selected),
                "ownerReferences": [objects.controller_reference(module)],
            },
            "spec": {
                "selector": {"matchLabels": dict(selected)},
                "template": {"metadata": {"labels": dict(selected)}, "spec": pod_spec},
            },
        }
    )
