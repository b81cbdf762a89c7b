"""Who gets which privilege, field by field: the operator's own pod none
(Pod Security Standard ``restricted``, plus a read-only root filesystem), the
loader root with SYS_MODULE only, the device plugin and DRA driver
privileged and root, their init containers too (KMM's, so existing images
run, whatever user they name). No pod shares a host namespace.
tests/integration/test_pod_security.py has the API server judge the same pods.
"""

from __future__ import annotations

from typing import Any

import operator_fixtures as fixtures
import pytest

from kmm.api import examples, installation, kernels, validation
from kmm.operator.deviceplugin import builders as deviceplugin_builders
from kmm.operator.dra import builders as dra_builders
from kmm.operator.loader import builders as loader_builders

_HOST_NAMESPACES = {"hostNetwork", "hostPID", "hostIPC"}


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def test_the_operator_pod_is_restricted() -> None:
    spec = _pod_spec(installation.deployment())
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert [c["securityContext"] for c in spec["containers"]] == [
        {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
    ]
    assert not (_HOST_NAMESPACES | {"volumes", "initContainers"}) & set(spec)


def _loader() -> dict[str, Any]:
    module = fixtures.module()
    target = kernels.target(module, "6.8.0-45-generic")
    assert target is not None
    return loader_builders.daemonset(module, target)


def _device_plugin() -> dict[str, Any]:
    raw = fixtures.module_raw(
        devicePlugin={
            "container": {"image": "r.io/plugin:1"},
            "initContainer": {"image": "r.io/plugin-init:1", "command": ["mknod"]},
        }
    )
    return deviceplugin_builders.daemonset(validation.parse_module(raw))


def _dra() -> dict[str, Any]:
    raw = examples.dra_module()
    raw["spec"]["dra"]["initContainer"] = {"image": "r.io/driver-init:1"}
    return dra_builders.daemonset(validation.parse_module(raw))


# Privileged and root: an image may name a user of its own (kmm's names
# 65532), which could not write root-owned host directories even privileged.
_ROOT = {"privileged": True, "runAsUser": 0}


@pytest.mark.parametrize(
    ("build", "security", "init_security"),
    [
        (
            _loader,
            {"capabilities": {"drop": ["ALL"], "add": ["SYS_MODULE"]}, "runAsUser": 0},
            [],
        ),
        # Upstream KMM runs device-plugin and DRA init containers privileged
        # (they mknod and write under /sys); kmm does the same, as root.
        (_device_plugin, _ROOT, [_ROOT]),
        (_dra, _ROOT, [_ROOT]),
    ],
)
def test_module_pods_get_their_privilege_and_nothing_more(
    build: Any, security: dict[str, Any], init_security: list[dict[str, Any]]
) -> None:
    spec = _pod_spec(build())
    assert [c["securityContext"] for c in spec["containers"]] == [security]
    assert [c.get("securityContext") for c in spec.get("initContainers") or ()] == init_security
    assert "securityContext" not in spec
    assert not _HOST_NAMESPACES & set(spec)
