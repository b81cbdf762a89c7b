"""Pure builder for the device-plugin DaemonSet of a Module.

It runs where the module is loaded: it selects the node label
``<ns>.<name>.ready`` that the operator keeps true to the loader pod's
readiness. A Module without ``moduleLoader`` (an in-tree driver) has nothing
to wait for, so its device plugin selects ``spec.selector`` directly
(DESIGN §4-§5). With ``version`` set there is one per version, also
selecting the node label ``version-device-plugin`` = that version (the
upgrade planner moves it). The kubelet's device-plugin socket directory is mounted, as
every device plugin needs it.
"""

from __future__ import annotations

from typing import Any

from kmm.api import labels, modules
from kmm.operator import objects, podspecs

__all__ = ["daemonset", "daemonset_name", "node_selector", "pod_labels"]

RawObject = dict[str, Any]

_PLUGINS_DIR = "/var/lib/kubelet/device-plugins"
(_PLUGINS_VOLUME,) = modules.DEVICE_PLUGIN_VOLUMES


def _version(module: modules.Module) -> str | None:
    loader = module.spec.module_loader
    return loader.container.version if loader is not None else None


def pod_labels(module: modules.Module) -> dict[str, str]:
    found = labels.module_labels(
        module.metadata.namespace or "", module.metadata.name, "device-plugin"
    )
    version = _version(module)
    if version is not None:
        found[labels.MODULE_VERSION] = version
    return found


def node_selector(module: modules.Module) -> dict[str, str]:
    if module.spec.module_loader is None:
        return dict(module.spec.selector)
    namespace, name = module.metadata.namespace or "", module.metadata.name
    selected = {labels.ready(namespace, name): ""}
    version = _version(module)
    if version is not None:
        selected[labels.device_plugin_version(namespace, name)] = version
    return selected


def daemonset_name(module: modules.Module) -> str:
    version = _version(module)
    parts = () if version is None else (version,)
    return labels.daemonset_name(module.metadata.name, "device-plugin", *parts)


def daemonset(module: modules.Module) -> RawObject:
    """The desired device-plugin DaemonSet, hash-stamped. Needs ``spec.devicePlugin``."""
    plugin = module.spec.device_plugin
    if plugin is None:
        raise ValueError("a device-plugin DaemonSet needs spec.devicePlugin")
    container = podspecs.container(plugin.container, "device-plugin")
    container["securityContext"] = {"privileged": True}
    container["volumeMounts"] = [
        {"name": _PLUGINS_VOLUME, "mountPath": _PLUGINS_DIR},
        *(plugin.container.volume_mounts or ()),
    ]
    pod_spec: RawObject = {
        **podspecs.base(module, service_account=plugin.service_account_name),
        "containers": [container],
        "nodeSelector": node_selector(module),
        "volumes": [
            {"name": _PLUGINS_VOLUME, "hostPath": {"path": _PLUGINS_DIR}},
            *podspecs.volumes(plugin.volumes),
        ],
    }
    if plugin.init_container is not None:
        init = podspecs.container(plugin.init_container, "device-plugin-init")
        if plugin.init_container.volume_mounts:
            init["volumeMounts"] = list(plugin.init_container.volume_mounts)
        pod_spec["initContainers"] = [init]
    selected = pod_labels(module)
    return objects.stamped(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {
                "name": daemonset_name(module),
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
