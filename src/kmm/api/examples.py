"""A valid example Module (``deploy/examples/module.yaml``), in KMM's own style.

It exercises a literal and a regexp kernel mapping with image variables, a
module loading order and a DRA driver with one DeviceClass, so it doubles as
a fixture for tests and a starting point for users.
"""

from __future__ import annotations

from typing import Any

from kmm.api import installation, modules

__all__ = [
    "DRA_MODULE",
    "demo_module",
    "dra_module",
    "dra_module_objects",
    "dra_workload",
    "module",
]

# What dra_module() offers: the devices a loaded kernel module "kmmdemo"
# exposes as /sys/class/kmmdemo/* with /dev nodes.
DRA_MODULE = "kmmdemo"


def module(name: str = "kmm-ci-a", namespace: str = "default") -> dict[str, Any]:
    """The example Module as a raw object (what ``kubectl apply`` would send)."""
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"node-role.kubernetes.io/worker": ""},
            "tolerations": [
                {"key": "example.com/accelerator", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "imageRepoSecret": {"name": "example-pull-secret"},
            "moduleLoader": {
                "serviceAccountName": "kmm-module-loader",
                "container": {
                    "modprobe": {
                        "moduleName": "kmm_ci_a",
                        "dirName": "/opt",
                        "parameters": ["debug=1"],
                        "firmwarePath": "/firmware",
                        "modulesLoadingOrder": ["kmm_ci_a", "kmm_ci_b"],
                    },
                    "imagePullPolicy": "IfNotPresent",
                    "kernelMappings": [
                        {
                            "literal": "6.8.0-45-generic",
                            "containerImage": "quay.io/example/kmm-ci-a:6.8.0-45-generic",
                        },
                        {
                            "regexp": r"^.+\.el9(_\d+)?\.x86_64$",
                            "containerImage": (
                                "quay.io/example/${MOD_NAME}:${KERNEL_FULL_VERSION}"
                            ),
                            "inTreeModulesToRemove": ["kmm_ci_a_intree"],
                        },
                    ],
                },
            },
            "dra": {
                "driverName": "kmm-ci-a.example.com",
                "container": {
                    "image": "quay.io/example/kmm:0.1.0",
                    "args": ["driver"],
                    "imagePullPolicy": "IfNotPresent",
                },
                "deviceClasses": [
                    {
                        "name": "kmm-ci-a.example.com",
                        "selectors": [
                            {"cel": {"expression": "device.driver == 'kmm-ci-a.example.com'"}}
                        ],
                    }
                ],
            },
        },
    }


def demo_module() -> dict[str, Any]:
    """The Module ``make demo`` applies to the sandbox: its three kernels (one
    literal and two regexp mappings, images with variables, one falling back
    to ``containerImage``) and a device plugin where the module is loaded."""
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": "kmm-demo", "namespace": "default"},
        "spec": {
            "selector": {"kubernetes.io/os": "linux"},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "kmm_demo", "parameters": ["debug=1"]},
                    "containerImage": "quay.io/example/default-${MOD_NAME}:${KERNEL_X}.${KERNEL_Y}",
                    "kernelMappings": [
                        {
                            "literal": "6.8.0-45-generic",
                            "containerImage": "quay.io/example/kmm-demo:${KERNEL_FULL_VERSION}",
                        },
                        {
                            "regexp": r"^6\.1\.\d+-\d+-amd64$",
                            "containerImage": "quay.io/example/${MOD_NAME}-debian:${KERNEL_XYZ}",
                        },
                        {"regexp": r"^5\.14\..*\.el9\.x86_64$"},
                    ],
                }
            },
            "devicePlugin": {"container": {"image": "quay.io/example/kmm-demo-device-plugin:1.0"}},
        },
    }


def dra_module(
    name: str = "kmm-dra-demo",
    namespace: str = "default",
    *,
    module_name: str = DRA_MODULE,
    selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Module whose devices ``kmm driver`` offers through DRA: the operator's
    DRA DaemonSet runs kmm's own image with the command below, on the nodes
    of ``selector`` where the module is loaded; the DaemonSet sets the rest
    (node, driver name, kubelet and CDI directories, health port). The host's
    /sys and /dev are mounted where the driver is told to look."""
    body: dict[str, Any] = {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": selector or {"node-role.kubernetes.io/worker": ""},
            "dra": {
                "driverName": f"{name}.kmm.io",
                "serviceAccountName": installation.DRA_DRIVER_ACCOUNT,
                "container": {
                    "image": installation.IMAGE,
                    "command": ["kmm", "driver"],
                    "args": [
                        f"--module={module_name}",
                        f"--device-class={module_name}",
                        "--sys-dir=/host/sys",
                        "--dev-dir=/host/dev",
                    ],
                    "volumeMounts": [
                        {"name": "host-sys", "mountPath": "/host/sys", "readOnly": True},
                        {"name": "host-dev", "mountPath": "/host/dev"},
                    ],
                },
                "volumes": [
                    {"name": "host-sys", "hostPath": {"path": "/sys", "type": "Directory"}},
                    {"name": "host-dev", "hostPath": {"path": "/dev", "type": "Directory"}},
                ],
                "deviceClasses": [{"name": f"{name}.kmm.io"}],
            },
        },
    }
    return body


def dra_module_objects(namespace: str = "default") -> list[dict[str, Any]]:
    """``deploy/examples/dra-module.yaml``: the driver's account and RBAC, then the Module."""
    return [*installation.dra_driver_rbac(namespace), dra_module(namespace=namespace)]


def dra_workload(
    namespace: str = "default", device_class: str = "kmm-dra-demo.kmm.io"
) -> list[dict[str, Any]]:
    """``deploy/examples/dra-workload.yaml``: a pod whose claim, made from a
    template, asks for one device of the DRA Module's class."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-kmmdemo-device", "namespace": namespace},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "device", "exactly": {"deviceClassName": device_class}}
                        ]
                    }
                }
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "kmmdemo-workload", "namespace": namespace},
            "spec": {
                "resourceClaims": [
                    {"name": "device", "resourceClaimTemplateName": "one-kmmdemo-device"}
                ],
                "containers": [
                    {
                        "name": "app",
                        "image": "registry.example/app:1",
                        "resources": {"claims": [{"name": "device"}]},
                    }
                ],
            },
        },
    ]
