"""``spec.devicePlugin`` and ``spec.dra``: the pods that make a loaded
module's devices usable, and DRA's DeviceClasses.

Both run a privileged driver container (``ContainerSpec``) on the nodes
with the module loaded, with volumes passed through to the pod, except
that a hostPath must lie under ``HOST_PATH_ROOTS`` and the names of the
volumes kmm mounts itself (``DEVICE_PLUGIN_VOLUMES``, ``DRA_VOLUMES``, which
the operator's builders use) are taken. Every volume mount must name a
volume the pod has: the API server would refuse the pod, and the DaemonSet
would be accepted and never run one.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field, model_validator

from kmm.api import cel, fields, models

__all__ = [
    "DEVICE_PLUGIN_VOLUMES",
    "DRA_VOLUMES",
    "HOST_PATH_ROOTS",
    "CELDeviceSelector",
    "ContainerSpec",
    "DeviceClassConfig",
    "DeviceClassSpec",
    "DevicePluginSpec",
    "DeviceSelector",
    "DraSpec",
    "HostPathVolumeSource",
    "OpaqueDeviceConfig",
    "Volume",
    "VolumeMount",
]

# Bounds for the CEL cost estimate (see kmm.api.fields).
_MAX_CEL_EXPRESSION = 10 * 1024  # resource.k8s.io/v1 CELDeviceSelector limit
_MAX_DEVICE_CLASSES = 32
_MAX_SELECTORS = 32  # resource.k8s.io/v1 DeviceSelectorsMaxSize
_MAX_CONFIGS = 32  # resource.k8s.io/v1 DeviceConfigMaxSize
_MAX_VOLUMES = 64
_MAX_HOST_PATH = 4096  # PATH_MAX

# Host paths a Module may mount into its privileged pods: device, sysfs and
# the state/runtime trees drivers use; never ``/`` or ``/etc`` (DESIGN §5).
HOST_PATH_ROOTS = ("/dev", "/sys", "/var", "/opt", "/run")
_HOST_PATH_PATTERN = "^/(" + "|".join(r[1:] for r in HOST_PATH_ROOTS) + ")(/.*)?$"


class VolumeMount(models.KubeModel):
    """core/v1 VolumeMount, passed through to the pod; its name must be one
    of the pod's volumes (in volumes, or one kmm mounts itself)."""

    name: Annotated[str, Field(min_length=1, max_length=63)]


class ContainerSpec(models.Model):
    """A device-plugin or DRA driver container (KMM's DevicePluginContainerSpec)."""

    image: fields.PlainImage
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[fields.PassThroughObject] | None = None
    image_pull_policy: fields.PullPolicy | None = None
    resources: fields.PassThroughObject | None = None
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=_MAX_VOLUMES)] | None = None


def _host_path_error(path: str) -> str | None:
    if not re.match(_HOST_PATH_PATTERN, path):
        return f"must be under one of {', '.join(HOST_PATH_ROOTS)}, not {path!r}"
    if re.search(fields.PARENT_COMPONENT_PATTERN, path):
        return f"may not contain a '..' component: {path!r}"
    return None


HostPath = Annotated[
    str,
    Field(min_length=1, max_length=_MAX_HOST_PATH),
    fields.checked(_host_path_error),
    cel.Rule(
        f"self.matches({_HOST_PATH_PATTERN!r})",
        f"must be under one of {', '.join(HOST_PATH_ROOTS)}",
    ),
    fields.NO_PARENT_COMPONENT,
]


class HostPathVolumeSource(models.KubeModel):
    """core/v1 HostPathVolumeSource, typed because its path is limited."""

    path: HostPath
    type: str | None = None


class Volume(models.KubeModel):
    """core/v1 Volume: any source passes through to the pod, except that a
    hostPath must lie under /dev, /sys, /var, /opt or /run."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    host_path: HostPathVolumeSource | None = None


def _reserved_names(names: tuple[str, ...]) -> tuple[AfterValidator, cel.Rule]:
    """Volume names the operator's builder uses itself, refused in the spec
    (the pod would carry two volumes of one name and never be created)."""

    def check(volumes: list[Volume]) -> list[Volume]:
        taken = sorted({v.name for v in volumes} & set(names))
        if taken:
            raise ValueError(f"volume names {taken} are reserved for the volumes kmm mounts")
        return volumes

    return AfterValidator(check), cel.Rule(
        f"self.all(v, !(v.name in {list(names)!r}))",
        f"volume names {', '.join(names)} are reserved for the volumes kmm mounts",
    )


# The names the device-plugin and DRA builders give their own volumes.
DEVICE_PLUGIN_VOLUMES = ("kubelet-device-plugins",)
DRA_VOLUMES = ("kubelet-plugins", "kubelet-plugins-registry", "cdi")

_MOUNTS_NAMED = "every volumeMounts entry must name a volume in volumes or one kmm mounts"


def _mounts_named(names: tuple[str, ...]) -> tuple[cel.Rule, ...]:
    """CEL: the mounts of the container and the init container name a
    volume of ``volumes`` or one of the builder's own (``names``). The pod
    of a mount naming no volume is refused by the API server, so the
    DaemonSet would be accepted and never run a pod."""

    def rule(container: str, *, optional: bool) -> cel.Rule:
        mounts = f"self.{container}.volumeMounts"
        present = f"!has(self.{container}) || " if optional else ""
        return cel.Rule(
            f"{present}!has({mounts}) || {mounts}.all(m, m.name in {list(names)!r} || "
            "(has(self.volumes) && self.volumes.exists(v, v.name == m.name)))",
            f"{_MOUNTS_NAMED} ({', '.join(names)})",
            f".{container}.volumeMounts",
        )

    return (rule("container", optional=False), rule("initContainer", optional=True))


def _unnamed_mounts(
    names: tuple[str, ...],
    volumes: list[Volume] | None,
    containers: tuple[tuple[str, ContainerSpec | None], ...],
) -> None:
    """Python: ``_mounts_named``'s rule; raises naming each stray entry."""
    known = set(names) | {v.name for v in volumes or ()}
    stray = [
        f"{field}.volumeMounts[{index}] names {mount.name!r}"
        for field, spec in containers
        if spec is not None
        for index, mount in enumerate(spec.volume_mounts or ())
        if mount.name not in known
    ]
    if stray:
        raise ValueError(f"{'; '.join(stray)}: {_MOUNTS_NAMED} ({', '.join(names)})")


_PLUGIN_NAMES_FREE, _PLUGIN_NAMES_FREE_CEL = _reserved_names(DEVICE_PLUGIN_VOLUMES)
_DRA_NAMES_FREE, _DRA_NAMES_FREE_CEL = _reserved_names(DRA_VOLUMES)
DevicePluginVolumes = Annotated[
    list[Volume], Field(max_length=_MAX_VOLUMES), _PLUGIN_NAMES_FREE, _PLUGIN_NAMES_FREE_CEL
]
DraVolumes = Annotated[
    list[Volume], Field(max_length=_MAX_VOLUMES), _DRA_NAMES_FREE, _DRA_NAMES_FREE_CEL
]


class DevicePluginSpec(models.Model):
    """``spec.devicePlugin``: a device-plugin DaemonSet on nodes with the module loaded."""

    cel_rules: ClassVar[tuple[cel.Rule, ...]] = _mounts_named(DEVICE_PLUGIN_VOLUMES)

    container: ContainerSpec
    init_container: ContainerSpec | None = None
    service_account_name: str | None = None
    volumes: DevicePluginVolumes | None = None
    # KMM's: false keeps the service account token out of the pod.
    automount_service_account_token: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> DevicePluginSpec:
        _unnamed_mounts(
            DEVICE_PLUGIN_VOLUMES,
            self.volumes,
            (("container", self.container), ("initContainer", self.init_container)),
        )
        return self


class CELDeviceSelector(models.Model):
    """resource.k8s.io/v1 CELDeviceSelector."""

    expression: Annotated[str, Field(min_length=1, max_length=_MAX_CEL_EXPRESSION)]


class DeviceSelector(models.Model):
    """resource.k8s.io/v1 DeviceSelector (CEL is its only form)."""

    cel: CELDeviceSelector


class OpaqueDeviceConfig(models.Model):
    """resource.k8s.io/v1 OpaqueDeviceConfiguration: parameters for one driver."""

    driver: fields.DriverName
    parameters: fields.PassThroughObject


class DeviceClassConfig(models.Model):
    """resource.k8s.io/v1 DeviceClassConfiguration (opaque is its only form)."""

    opaque: OpaqueDeviceConfig


class DeviceClassSpec(models.Model):
    """One cluster-scoped DeviceClass the DRA reconciler keeps for the Module."""

    name: fields.DnsSubdomain
    selectors: Annotated[list[DeviceSelector], Field(max_length=_MAX_SELECTORS)] | None = None
    config: Annotated[list[DeviceClassConfig], Field(max_length=_MAX_CONFIGS)] | None = None


class DraSpec(models.Model):
    """``spec.dra`` (seed 000): the DRA driver DaemonSet and the DeviceClasses."""

    cel_rules: ClassVar[tuple[cel.Rule, ...]] = _mounts_named(DRA_VOLUMES)

    driver_name: fields.DriverName
    container: ContainerSpec
    init_container: ContainerSpec | None = None
    service_account_name: str | None = None
    volumes: DraVolumes | None = None
    automount_service_account_token: bool | None = None
    device_classes: (
        Annotated[
            list[DeviceClassSpec],
            Field(max_length=_MAX_DEVICE_CLASSES),
            cel.SchemaExtra(
                (("x-kubernetes-list-type", "map"), ("x-kubernetes-list-map-keys", ("name",)))
            ),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _check(self) -> DraSpec:
        _unnamed_mounts(
            DRA_VOLUMES,
            self.volumes,
            (("container", self.container), ("initContainer", self.init_container)),
        )
        return self
