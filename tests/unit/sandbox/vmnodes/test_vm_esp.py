"""A VM node's settings as its OS reads them (node.env), and their checks."""

from __future__ import annotations

import subprocess

import pytest

from kmm.sandbox.vmnodes import esp
from kmm.sandbox.vmnodes import nodes as vm


def test_node_env_is_what_the_guests_shell_reads() -> None:
    settings = esp.NodeSettings(
        name="vm-1",
        mac=vm.mac_address(1),
        address="10.253.0.11/24",
        routes=(("10.96.0.0/12", ""), ("10.245.0.0/24", "10.253.0.10")),
    )
    env = esp.node_env(settings)
    script = env + 'printf "%s|%s|%s|%s" "$KMM_NODE_NAME" "$KMM_NODE_MAC" '
    script += '"$KMM_NODE_ADDRESS" "$KMM_NODE_ROUTES"'
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout == (
        "vm-1|52:54:00:fa:00:01|10.253.0.11/24|10.96.0.0/12 10.245.0.0/24=10.253.0.10"
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "VM_1; reboot", "not a DNS label"),
        ("mac", "52:54:00:FA:00:01", "six lower-case hex pairs"),
        ("address", "10.253.0.300/24", "10.253.0.300"),
        ("routes", (("10.96.0.0/12", "$(reboot)"),), "reboot"),
        ("files", {"../etc/passwd": b""}, "not a plain file name"),
        ("files", {"node.env": b""}, "not a plain file name"),
    ],
)
def test_node_env_refuses_bad_settings(field: str, value: object, message: str) -> None:
    values: dict[str, object] = {"name": "vm-0", "mac": vm.mac_address(0), field: value}
    with pytest.raises(ValueError, match=message):
        esp.node_env(esp.NodeSettings(**values))  # type: ignore[arg-type]


def test_macs_are_distinct_and_local() -> None:
    macs = {vm.mac_address(index) for index in range(300)}
    assert len(macs) == 300
    assert all(mac.startswith("52:54:00:fa:") for mac in macs)
    with pytest.raises(ValueError, match="out of range"):
        vm.mac_address(-1)
