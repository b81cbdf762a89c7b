"""Pure builders for what ``spec.dra`` asks for: the DRA driver DaemonSet and
the DeviceClasses.

The DaemonSet carries what DRA driver images expect of it (upstream KMM's
layout, DESIGN §5), so existing drivers run unchanged: the kubelet's plugin
and registration directories and the CDI directory from the host; in the
environment ``NODE_NAME`` and ``POD_UID`` (downward API), ``DRIVER_NAME``,
``CDI_ROOT``, ``KUBELET_REGISTRAR_DIRECTORY_PATH``,
``KUBELET_PLUGINS_DIRECTORY_PATH`` and ``HEALTHCHECK_PORT`` (the gRPC
liveness and readiness probes'), with a ``moduleLoader`` also kmm's own
``KMM_MODULE_NAME`` (its ``moduleName``: ``kmm driver`` reports every device
Unhealthy while that module is not loaded), the user's ``env`` after them, a
variable the user sets replacing the preset one (``podspecs.environment``);
privileged and root, whatever user the image names (a driver creates device
nodes and sockets on the host). It runs
where the module is loaded and the node is a DRA target (``.ready`` and
``.dra-target``, plus the device-plugin version label with a version); a
Module without ``moduleLoader`` selects ``spec.selector`` and ``.dra-target``. The name
does not depend on ``moduleLoader``, so adding or removing it updates the one
DaemonSet in place.

A DeviceClass is cluster-scoped: it carries the Module's ``module.name`` /
``module.namespace`` labels instead of an owner, and a class listed without
selectors selects the Module's driver.
"""

from __future__ import annotations

from typing import Any, Final

from kmm.api import devices, labels, modules
from kmm.kube import resources
from kmm.operator import objects, podspecs, workloadbuilders

__all__ = [
    "CDI_DIR",
    "HEALTHCHECK_PORT",
    "PLUGINS_DIR",
    "PROBE_TIMEOUT_SECONDS",
    "REGISTRY_DIR",
    "daemonset",
    "device_class",
    "node_selector",
]

RawObject = dict[str, Any]

PLUGINS_DIR: Final = "/var/lib/kubelet/plugins"
REGISTRY_DIR: Final = "/var/lib/kubelet/plugins_registry"
CDI_DIR: Final = "/var/run/cdi"
HEALTHCHECK_PORT: Final = 51515  # KMM's
#: Seconds the driver's probes wait for an answer (the kubelet's default is 1).
PROBE_TIMEOUT_SECONDS: Final = 5
_ROLE: Final[workloadbuilders.Role] = "dra"
_PLUGINS_VOLUME, _REGISTRY_VOLUME, _CDI_VOLUME = devices.DRA_VOLUMES


def _dra(module: modules.Module) -> devices.DraSpec:
    if module.spec.dra is None:
        raise ValueError("a DRA DaemonSet needs spec.dra")
    return module.spec.dra


def _ids(module: modules.Module) -> tuple[str, str]:
    return module.metadata.namespace or "", module.metadata.name


def node_selector(module: modules.Module) -> dict[str, str]:
    return workloadbuilders.node_selector(module, {labels.dra_target(*_ids(module)): ""})


def _environment(module: modules.Module) -> list[RawObject]:
    dra = _dra(module)

    def field(path: str) -> RawObject:
        return {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}

    presets = [
        {"name": "NODE_NAME", **field("spec.nodeName")},
        {"name": "POD_UID", **field("metadata.uid")},
        {"name": "DRIVER_NAME", "value": dra.driver_name},
        {"name": "CDI_ROOT", "value": CDI_DIR},
        {"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": REGISTRY_DIR},
        {"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": PLUGINS_DIR},
        {"name": "HEALTHCHECK_PORT", "value": str(HEALTHCHECK_PORT)},
    ]
    loader = module.spec.module_loader
    if loader is not None:
        # Not in upstream KMM's layout (hence the prefix): the module the
        # driver's devices need, so that it can tell when it is unloaded.
        presets.append({"name": "KMM_MODULE_NAME", "value": loader.container.modprobe.module_name})
    # Upstream KMM appends the user's list to its presets as it is, so a
    # preset the user sets too (its own CI Module sets DRIVER_NAME, which
    # upstream does not preset) is there twice: a server-side apply refuses
    # that list. Each name once, the user's value winning.
    return podspecs.environment(presets, dra.container.env)


def daemonset(module: modules.Module) -> RawObject:
    """The desired DRA driver DaemonSet, hash-stamped. Needs ``spec.dra``."""
    dra = _dra(module)
    container = podspecs.container(dra.container, "dra-driver")
    container["env"] = _environment(module)
    container["securityContext"] = dict(podspecs.ROOT)
    container["volumeMounts"] = [
        {"name": _PLUGINS_VOLUME, "mountPath": PLUGINS_DIR},
        {"name": _REGISTRY_VOLUME, "mountPath": REGISTRY_DIR},
        {"name": _CDI_VOLUME, "mountPath": CDI_DIR},
        *podspecs.mounts(dra.container.volume_mounts),
    ]
    # Both probes allow PROBE_TIMEOUT_SECONDS for an answer, not the
    # kubelet's default second: on a busy node (a VM node under TCG) a
    # driver's health check took longer, and three liveness timeouts in a row
    # would restart a driver that is serving claims.
    container["livenessProbe"] = {
        "grpc": {"port": HEALTHCHECK_PORT, "service": "liveness"},
        "failureThreshold": 3,
        "periodSeconds": 10,
        "timeoutSeconds": PROBE_TIMEOUT_SECONDS,
    }
    # Upstream KMM's DaemonSet has the liveness probe only, so a driver is
    # Ready (and counted, and its node labelled) before the kubelet has
    # registered it. The readiness probe asks the empty service, the server
    # as a whole: kmm's driver serves it once the kubelet's registration
    # status said registered (``kmm.driver.owning``); gRPC's own health
    # servers and the dra-example-driver serve it as they serve liveness, so
    # drivers written for upstream's layout are not held unready.
    container["readinessProbe"] = {
        "grpc": {"port": HEALTHCHECK_PORT},
        "failureThreshold": 3,
        "periodSeconds": 5,
        "timeoutSeconds": PROBE_TIMEOUT_SECONDS,
    }
    pod_spec: RawObject = {
        **podspecs.base(
            module,
            service_account=dra.service_account_name,
            automount_token=dra.automount_service_account_token,
        ),
        "containers": [container],
        "nodeSelector": node_selector(module),
        "volumes": [
            {
                "name": _PLUGINS_VOLUME,
                "hostPath": {"path": PLUGINS_DIR, "type": "DirectoryOrCreate"},
            },
            {"name": _REGISTRY_VOLUME, "hostPath": {"path": REGISTRY_DIR, "type": "Directory"}},
            {"name": _CDI_VOLUME, "hostPath": {"path": CDI_DIR, "type": "DirectoryOrCreate"}},
            *podspecs.volumes(dra.volumes),
        ],
    }
    if dra.init_container is not None:
        pod_spec["initContainers"] = [
            workloadbuilders.init_container(dra.init_container, "dra-driver-init")
        ]
    return workloadbuilders.daemonset(module, _ROLE, pod_spec)


def device_class(module: modules.Module, declared: devices.DeviceClassSpec) -> RawObject:
    """The desired DeviceClass for one ``spec.dra.deviceClasses`` entry, hash-stamped."""
    dra = _dra(module)
    selectors = (
        [s.model_dump(by_alias=True, exclude_none=True) for s in declared.selectors]
        if declared.selectors
        else [{"cel": {"expression": f'device.driver == "{dra.driver_name}"'}}]
    )
    spec: RawObject = {"selectors": selectors}
    if declared.config:
        spec["config"] = [c.model_dump(by_alias=True, exclude_none=True) for c in declared.config]
    return objects.stamped(
        {
            "apiVersion": resources.DEVICE_CLASSES.api_version,
            "kind": "DeviceClass",
            "metadata": {
                "name": declared.name,
                "labels": {
                    **labels.module_labels(*_ids(module), _ROLE),
                    labels.MODULE_UID: module.metadata.uid or "",
                },
            },
            "spec": spec,
        }
    )
