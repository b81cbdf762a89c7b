"""The ``Module`` resource (``kmm.sigs.x-k8s.io/v1beta1``) as Pydantic models.

Wire names are KMM's camelCase (``models.Model``), so a KMM manifest
validates unchanged for every field kmm supports. Unknown fields are errors,
except inside Kubernetes sub-objects that are passed through to pods and in
k8s-defined models that allow extra keys.

Each rule is stated twice beside each other: a Python validator (for the
operator, which repeats admission and reports a Degraded condition) and a CEL
rule (``cel.Rule``) that :mod:`kmm.api.crd` renders into the CRD. Rules a
schema cannot express live in :mod:`kmm.api.admission`.

This module holds the resource's names, its root, spec and status; the spec's
sections are their own modules: :mod:`kmm.api.moduleloader` (kernel
mappings, with :mod:`kmm.api.modprobing` and :mod:`kmm.api.buildsign`),
:mod:`kmm.api.devices` (device plugin, DRA); the field types are :mod:`kmm.api.fields`', the embedded
Kubernetes objects :mod:`kmm.api.kubeobjects`'.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import model_validator

from kmm.api import cel, devices, kubeobjects, labels, models, moduleloader

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "DaemonSetStatus",
    "DeviceTaintsStatus",
    "ImageState",
    "ImageStatus",
    "Module",
    "ModuleSpec",
    "ModuleStatus",
    "NodeDeviceTaints",
    "VersionCounts",
]

GROUP = "kmm.sigs.x-k8s.io"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Module"
PLURAL = "modules"


class ModuleSpec(models.Model):
    """``Module.spec``."""

    cel_rules: ClassVar[tuple[cel.Rule, ...]] = (
        cel.Rule(
            "!(has(self.dra) && has(self.devicePlugin))",
            "dra and devicePlugin are mutually exclusive",
            ".dra",
        ),
    )

    selector: dict[str, str]
    tolerations: list[kubeobjects.Toleration] | None = None
    image_repo_secret: kubeobjects.LocalObjectReference | None = None
    module_loader: moduleloader.ModuleLoaderSpec | None = None
    device_plugin: devices.DevicePluginSpec | None = None
    dra: devices.DraSpec | None = None
    # KMM's: changing it has every image of the Module checked again and the
    # missing ones built; status.imageRebuildTriggerGeneration says when done.
    image_rebuild_trigger_generation: int | None = None

    @model_validator(mode="after")
    def _check(self) -> ModuleSpec:
        if self.dra is not None and self.device_plugin is not None:
            raise ValueError("dra and devicePlugin are mutually exclusive")
        return self


class VersionCounts(models.Model):
    """The DaemonSets of one module version (ordered upgrades): their counts."""

    version: str
    desired_number: int = 0
    available_number: int = 0


class DaemonSetStatus(models.Model):
    """Counts for one kind of DaemonSet the Module owns (KMM's field names),
    and with ``version`` set, the same per version (kmm's, not KMM's)."""

    nodes_matching_selector_number: int = 0
    desired_number: int = 0
    available_number: int = 0
    versions: (
        Annotated[
            list[VersionCounts],
            cel.SchemaExtra(
                (("x-kubernetes-list-type", "map"), ("x-kubernetes-list-map-keys", ("version",)))
            ),
        ]
        | None
    ) = None


ImageState = Literal[
    "Exists",
    "Missing",
    "Checking",
    "Building",
    "Signing",
    "BuildFailed",
    "SignFailed",
    "AuthenticationFailed",
]


class ImageStatus(models.Model):
    """The image of one kernel of a Module that builds or signs (kmm's, not
    KMM's): whether the registry has it, or which pod is making it, or why
    it cannot be had."""

    kernel: str
    image: str
    state: ImageState
    pod: str | None = None
    message: str | None = None


class NodeDeviceTaints(models.Model):
    """A node of a DRA Module's ordered upgrade whose devices are tainted
    (kmm's, not KMM's): the DeviceTaintRules and their effect, the pods
    holding claims on those devices (evicted by a NoExecute taint, or
    staying: tolerating it, or under NoSchedule), and why nothing is
    tainted when so. Where no rule can be written (a cluster serving no
    DeviceTaintRules, or an operator run with --no-device-taints): no rules
    and no effect, the pods whose claims hold the node's devices staying."""

    node: str
    effect: str | None = None
    rules: list[str] | None = None
    # Every rule is in the operator's cache with its effect.
    rules_ready: bool | None = None
    evicted: list[str] | None = None
    staying: list[str] | None = None
    # The eviction controller's word on the rules (EvictionInProgress).
    eviction: str | None = None
    message: str | None = None


class DeviceTaintsStatus(models.Model):
    """Device taints in a DRA Module's ordered upgrades (kmm's): the
    resource.k8s.io version the rules are written in, or why none is used;
    the nodes in a move whose devices are tainted."""

    api_version: str | None = None
    message: str | None = None
    nodes: (
        Annotated[
            list[NodeDeviceTaints],
            cel.SchemaExtra(
                (("x-kubernetes-list-type", "map"), ("x-kubernetes-list-map-keys", ("node",)))
            ),
        ]
        | None
    ) = None


class ModuleStatus(models.Model):
    """``Module.status``: KMM's counts plus conditions and observedGeneration."""

    module_loader: DaemonSetStatus | None = None
    device_plugin: DaemonSetStatus | None = None
    dra: DaemonSetStatus | None = None
    conditions: (
        Annotated[
            list[kubeobjects.Condition],
            cel.SchemaExtra(
                (("x-kubernetes-list-type", "map"), ("x-kubernetes-list-map-keys", ("type",)))
            ),
        ]
        | None
    ) = None
    observed_generation: int | None = None
    # KMM's: the spec.imageRebuildTriggerGeneration whose checks and builds are done.
    image_rebuild_trigger_generation: int | None = None
    images: (
        Annotated[
            list[ImageStatus],
            cel.SchemaExtra(
                (("x-kubernetes-list-type", "map"), ("x-kubernetes-list-map-keys", ("kernel",)))
            ),
        ]
        | None
    ) = None
    # kmm's: device taints in ordered upgrades of a DRA Module.
    device_taints: DeviceTaintsStatus | None = None


class Module(models.Model):
    """A ``Module``: which nodes need which kernel module, image and devices."""

    api_version: Literal["kmm.sigs.x-k8s.io/v1beta1"] = "kmm.sigs.x-k8s.io/v1beta1"
    kind: Literal["Module"] = "Module"
    metadata: kubeobjects.ObjectMeta
    spec: ModuleSpec
    status: ModuleStatus | None = None

    @model_validator(mode="after")
    def _check(self) -> Module:
        # A Module read without a namespace (a manifest file) still gets the
        # check with the shortest possible namespace; admission checks the real one.
        name = self.metadata.name
        used = len(name) + max(1, len(self.metadata.namespace or ""))
        if used > labels.MAX_NAME_AND_NAMESPACE:
            raise ValueError(
                f"metadata.name: namespace and name total {used} characters; at most "
                f"{labels.MAX_NAME_AND_NAMESPACE} fit in the derived labels "
                f"(e.g. {labels.module_loader_version('<namespace>', '<name>')})"
            )
        return self
