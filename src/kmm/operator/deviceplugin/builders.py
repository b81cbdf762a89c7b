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

from kmm.api import devices, modules
from kmm.operator import podspecs, workloadbuilders

__all__ = ["daemonset"]

RawObject = dict[str, Any]

_PLUGINS_DIR = "/var/lib/kubelet/device-plugins"
(_PLUGINS_VOLUME,) = devices.DEVICE_PLUGIN_VOLUMES


def daemonset(module: modules.Module) -> RawObject:
    """The desired device-plugin DaemonSet, hash-stamped. Needs ``spec.devicePlugin``."""
    plugin = module.spec.device_plugin
    if plugin is None:
        raise ValueError("a device-plugin DaemonSet needs spec.devicePlugin")
    container = podspecs.container(plugin.container, "device-plugin")
    container["securityContext"] = dict(podspecs.ROOT)
    container["volumeMounts"] = [
        {"name": _PLUGINS_VOLUME, "mountPath": _PLUGINS_DIR},
        *podspecs.mounts(plugin.container.volume_mounts),
    ]
    pod_spec: RawObject = {
        **podspecs.base(
            module,
            service_account=plugin.service_account_name,
            automount_token=plugin.automount_service_account_token,
        ),
        "containers": [container],
        "nodeSelector": workloadbuilders.node_selector(module),
        "volumes": [
            {"name": _PLUGINS_VOLUME, "hostPath": {"path": _PLUGINS_DIR}},
            *podspecs.volumes(plugin.volumes),
        ],
    }
    if plugin.init_container is not None:
        pod_spec["initContainers"] = [
            workloadbuilders.init_container(plugin.init_container, "device-plugin-init")
        ]
    return workloadbuilders.daemonset(module, "device-plugin", pod_spec)
