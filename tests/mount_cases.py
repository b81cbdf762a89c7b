"""The volume-mount rule of the device-plugin and DRA containers: a
``volumeMounts`` entry must name a volume of the pod (one of ``volumes``, or
one the builder mounts itself). Shared by the unit test (the operator's
Python validation) and the integration test (the API server's CEL rules):
each case names the field and the rule in both. Not a test module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from build_sign_cases import Case

from kmm.api import examples

Obj = dict[str, Any]

RULE: Final = "every volumeMounts entry must name a volume in volumes or one kmm mounts"
_DRA_VOLUMES = [{"name": "dri", "hostPath": {"path": "/dev/dri"}}]
_PLUGIN_VOLUMES = [{"name": "state", "hostPath": {"path": "/var/lib/plugin"}}]


def module() -> Obj:
    """The example Module: a DRA driver with a volume of its own (``dri``)."""
    obj = examples.module()
    obj["spec"]["dra"]["volumes"] = list(_DRA_VOLUMES)
    return obj


def device_plugin(obj: Obj) -> Obj:
    """``obj`` with a device plugin instead of its DRA driver, with a volume
    of its own (``state``); its ``spec.devicePlugin``."""
    del obj["spec"]["dra"]
    plugin: Obj = {
        "container": {"image": "r.io/plugin:1"},
        "initContainer": {"image": "r.io/plugin-init:1"},
        "volumes": list(_PLUGIN_VOLUMES),
    }
    obj["spec"]["devicePlugin"] = plugin
    return plugin


def _mount(where: str, container: str, name: str) -> Callable[[Obj], None]:
    def mutate(obj: Obj) -> None:
        spec = device_plugin(obj) if where == "devicePlugin" else obj["spec"]["dra"]
        spec.setdefault(container, {"image": "r.io/init:1"})["volumeMounts"] = [
            {"name": name, "mountPath": "/mnt/x", "readOnly": True}
        ]

    return mutate


def _case(name: str, where: str, container: str, reserved: str) -> Case:
    return Case(
        name,
        _mount(where, container, "nowhere"),
        f"spec.{where}",
        RULE,
        f"spec.{where}.{container}.volumeMounts",
        f"{RULE} ({reserved})",
    )


_DRA_OWN = "kubelet-plugins, kubelet-plugins-registry, cdi"
CASES: Final = (
    _case(
        "device-plugin-mount-of-no-volume", "devicePlugin", "container", "kubelet-device-plugins"
    ),
    _case(
        "device-plugin-init-mount-of-no-volume",
        "devicePlugin",
        "initContainer",
        "kubelet-device-plugins",
    ),
    _case("dra-mount-of-no-volume", "dra", "container", _DRA_OWN),
    _case("dra-init-mount-of-no-volume", "dra", "initContainer", _DRA_OWN),
)

# Admitted: a mount of a volume the spec declares, or of one kmm mounts.
ACCEPTED: Final = (
    ("device-plugin-own-volume", _mount("devicePlugin", "container", "state")),
    (
        "device-plugin-init-kmms-volume",
        _mount("devicePlugin", "initContainer", "kubelet-device-plugins"),
    ),
    ("dra-own-volume", _mount("dra", "container", "dri")),
    ("dra-init-kmms-volume", _mount("dra", "initContainer", "cdi")),
)
