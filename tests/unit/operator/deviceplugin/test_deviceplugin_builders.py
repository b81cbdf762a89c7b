"""The device-plugin DaemonSet builder (pure, table-driven)."""

from __future__ import annotations

import operator_fixtures as fixtures
import pytest

from kmm.api import labels
from kmm.operator.deviceplugin import builders as deviceplugin_builders


@pytest.mark.parametrize(
    ("with_loader", "selector"),
    [(True, {labels.ready("ns", "m"): ""}), (False, {"pick": "yes"})],
)
def test_device_plugin_selects_ready_label_or_selector(
    with_loader: bool, selector: dict[str, str]
) -> None:
    raw = fixtures.module_raw(devicePlugin={"container": {"image": "r.io/plugin:1"}})
    if not with_loader:
        del raw["spec"]["moduleLoader"]
    ds = deviceplugin_builders.daemonset(fixtures.module(raw))
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == selector
    assert ds["metadata"]["labels"][labels.ROLE] == "device-plugin"
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "r.io/plugin:1"
