"""Namespace holders and the fabric, on real namespaces: addresses and routes
inside, reachability across, nothing in the host's namespace, nothing left
once the holders stop."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import namespacing
import pytest

from kmm.sandbox import addressing, fabric, namespaces


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[namespacing.Launcher]:
    launcher = namespacing.Launcher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.stop_all()


def _in(holder: namespaces.Holder, *argv: str) -> str:
    return namespaces.run_in(holder, list(argv))


def _fabric_of_two(launcher: namespacing.Launcher) -> tuple[fabric.Fabric, list[namespaces.Holder]]:
    fab = fabric.create(launcher, launcher.directory)
    holders = [namespaces.start_holder(launcher, f"node/{i}", mount=True) for i in range(2)]
    for index, holder in enumerate(holders):
        fabric.attach(fab, holder, index)
    return fab, holders


def test_addresses_and_routes_inside_with_no_default_route(launcher: namespacing.Launcher) -> None:
    fab, holders = _fabric_of_two(launcher)

    assert f"inet {addressing.GATEWAY}/24" in _in(
        fab.holder, "ip", "-o", "-4", "addr", "show", "dev", fabric.BRIDGE
    )
    fabric_routes = _in(fab.holder, "ip", "-4", "route", "show", "table", "all")
    for index in range(2):
        assert (
            f"{addressing.pod_subnet(index)} via {addressing.node_address(index)} dev {fabric.BRIDGE}"
            in fabric_routes
        )
        assert f"master {fabric.BRIDGE}" in _in(
            fab.holder, "ip", "-o", "link", "show", fabric.peer_name(index)
        )
    for index, holder in enumerate(holders):
        own = _in(holder, "ip", "-o", "-4", "addr", "show", "dev", fabric.NODE_INTERFACE)
        assert f"inet {addressing.node_address(index)}/24" in own
        routes = _in(holder, "ip", "-4", "route", "show", "table", "all")
        other = 1 - index
        assert (
            f"{addressing.pod_subnet(other)} via {addressing.node_address(other)} dev fab0"
            in routes
        )
        assert f"{addressing.SERVICE_NETWORK} dev fab0" in routes
        assert "default" not in routes
        assert _in(holder, "sysctl", "-n", "net.ipv4.ip_forward").strip() == "1"
    assert "default" not in fabric_routes
    assert _in(fab.holder, "sysctl", "-n", "net.ipv4.ip_forward").strip() == "1"


def test_nodes_reach_each_other_and_the_gateway_and_nothing_outside(
    launcher: namespacing.Launcher,
) -> None:
    fab, holders = _fabric_of_two(launcher)
    listeners = {
        str(addressing.node_address(1)): namespaces.socket_in(holders[1].net_path),
        str(addressing.GATEWAY): namespaces.socket_in(fab.holder.net_path),
    }
    try:
        for address, listener in listeners.items():
            listener.bind((address, 0))
            listener.listen()
            with namespaces.socket_in(holders[0].net_path) as dialler:
                dialler.settimeout(30)
                dialler.connect(listener.getsockname())
                accepted, peer = listener.accept()
                with accepted:
                    dialler.sendall(b"ping")
                    assert accepted.recv(4) == b"ping"
                # The connection came from node 0's own fabric address.
                assert peer[0] == str(addressing.node_address(0))
        # No default route: an outside address is unreachable at once.
        with namespaces.socket_in(holders[0].net_path) as dialler:
            with pytest.raises(OSError, match="unreachable") as raised:
                dialler.connect(("192.0.2.1", 80))
            assert raised.value.errno == errno.ENETUNREACH
    finally:
        for listener in listeners.values():
            listener.close()


def test_socket_in_a_namespace_that_is_gone_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="No such file") as raised:
        namespaces.socket_in(str(tmp_path / "no-such-namespace"))
    assert raised.value.errno == errno.ENOENT


def test_the_host_gains_nothing_and_nothing_outlives_the_holders(
    launcher: namespacing.Launcher,
) -> None:
    before = namespacing.host_network()
    mounts_before = Path("/proc/self/mountinfo").read_text()
    fab, holders = _fabric_of_two(launcher)
    # A mount in a node's private mount namespace stays there.
    subprocess.run(
        [*namespaces.nsenter(holders[0], mount=True), "mount", "-t", "tmpfs", "kmm-test", "/mnt"],
        check=True,
    )
    inside = subprocess.run(
        [*namespaces.nsenter(holders[0], mount=True), "cat", "/proc/self/mountinfo"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "kmm-test" in inside
    assert namespacing.host_network() == before
    assert Path("/proc/self/mountinfo").read_text() == mounts_before
    net_ids = {os.readlink(h.net_path) for h in (fab.holder, *holders)}
    mnt_ids = {os.readlink(h.mnt_path) for h in holders}
    assert len(net_ids) == 3

    launcher.stop_all()

    assert not net_ids & namespacing.namespace_ids("net")
    assert not mnt_ids & namespacing.namespace_ids("mnt")
    assert namespacing.host_network() == before
    assert Path("/proc/self/mountinfo").read_text() == mounts_before


def test_nsenter_asks_a_mount_namespace_only_of_a_holder_that_has_one() -> None:
    holder = namespaces.Holder(pid=4242)
    assert namespaces.nsenter(holder, mount=False)[1:] == ["--target=4242", "--net"]
    with pytest.raises(ValueError, match="no mount namespace"):
        namespaces.nsenter(holder, mount=True)
    with_mount = namespaces.Holder(pid=4242, mount=True)
    assert namespaces.nsenter(with_mount, mount=True)[1:] == ["--target=4242", "--net", "--mount"]


def test_a_vm_nodes_namespace_is_a_wire_for_its_guest_and_the_others_route_to_it(
    launcher: namespacing.Launcher,
) -> None:
    before = namespacing.host_network()
    fab = fabric.create(launcher, launcher.directory)
    guest = namespaces.start_holder(launcher, "node/vm")
    fabric.attach_bridged(fab, guest, 1, tap="kmmtap0")
    # A node attached after it routes to the guest's pods via its address.
    later = namespaces.start_holder(launcher, "node/later", mount=True)
    fabric.attach(fab, later, 2)

    links = _in(guest, "ip", "-o", "link", "show")
    for link in (fabric.NODE_INTERFACE, "kmmtap0"):
        assert f"master {fabric.NODE_BRIDGE}" in _in(guest, "ip", "-o", "link", "show", link)
    assert "tun" in _in(guest, "ip", "-d", "-o", "link", "show", "kmmtap0")
    assert fabric.NODE_BRIDGE in links
    # The guest holds the address; its namespace holds none and no route.
    assert "inet " not in _in(guest, "ip", "-o", "-4", "addr", "show", "scope", "global")
    assert _in(guest, "ip", "-4", "route", "show").strip() == ""
    vm_pods = f"{addressing.pod_subnet(1)} via {addressing.node_address(1)}"
    assert vm_pods in _in(later, "ip", "-4", "route", "show")
    assert vm_pods in _in(fab.holder, "ip", "-4", "route", "show")
    with pytest.raises(ValueError, match="attached to the fabric already"):
        fabric.attach_bridged(fab, guest, 1, tap="kmmtap0")
    assert namespacing.host_network() == before
