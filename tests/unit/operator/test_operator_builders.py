"""What the two device-workload builders (device plugin, DRA driver) share."""

from __future__ import annotations

from typing import Any

import operator_fixtures as fixtures
import pytest

from kmm.api import examples, validation
from kmm.operator.deviceplugin import builders as deviceplugin_builders
from kmm.operator.dra import builders as dra_builders


def _device_plugin_pod(**plugin: Any) -> dict[str, Any]:
    raw = fixtures.module_raw(devicePlugin={"container": {"image": "r.io/plugin:1"}, **plugin})
    spec: dict[str, Any] = deviceplugin_builders.daemonset(fixtures.module(raw))["spec"][
        "template"
    ]["spec"]
    return spec


def _dra_pod(**dra: Any) -> dict[str, Any]:
    raw = examples.dra_module()
    raw["spec"]["dra"].update(dra)
    spec: dict[str, Any] = dra_builders.daemonset(validation.parse_module(raw))["spec"]["template"][
        "spec"
    ]
    return spec


@pytest.mark.parametrize("build", [_device_plugin_pod, _dra_pod], ids=["device-plugin", "dra"])
@pytest.mark.parametrize(("automount", "expected"), [(False, False), (True, True), (None, None)])
def test_automount_service_account_token_reaches_the_pod(
    build: Any, automount: bool | None, expected: bool | None
) -> None:
    """KMM's field, carried as is; unset, the pod spec leaves it to the service account."""
    fields = {} if automount is None else {"automountServiceAccountToken": automount}
    spec = build(**fields)
    assert spec.get("automountServiceAccountToken") == expected
    assert ("automountServiceAccountToken" in spec) is (expected is not None)
