"""A VM node on its own (kmm.sandbox.vmnodes): Debian's kernels under Secure Boot.

One node for the whole module, owned by it: booted under TCG with Secure
Boot on, in a network namespace of its own with a tap as its NIC. The tests
read what its kernel says (Secure Boot, lockdown), run commands in its OS
through the guest agent, load the test module built against its kernel's
headers (``make vm-test-modules``) signed with the sandbox key and refused
unsigned, and reboot it into the other kernel line (last: the tests before
read the kernel they run on rather than assume it).

Needs ``make vm-image vm-test-modules`` first (no test downloads or builds
an image) and the host-wide lock (``/work/notes/nodes-lock``): it starts a
network namespace and keeps one core busy. Cost: one boot and one reboot
under TCG, about 1.5 to 3 minutes on a 2-core machine (more when it is busy).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kmm.cli import paths
from kmm.sandbox import namespaces, processes
from kmm.sandbox.vmnodes import agent, esp, firmware, images, kernels, qemu
from kmm.sandbox.vmnodes import nodes as vm

ROOT = Path(__file__).resolve().parents[2]
MODULES = ROOT / "build" / "vm" / "modules"
MODULE = "kmm_vm_test"
ADDRESS = "10.253.0.10"
NAMESPACE_ADDRESS = "10.253.0.1"
BOOT_TIMEOUT = 900.0
# Within pytest's 600 s per test: a reboot and a module load.
REBOOT_TIMEOUT = 420.0


class _Launcher:
    """Records what it starts, as the sandbox's launcher does, to stop it all."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.launched: list[processes.Process] = []

    def launch(self, name: str, argv: list[str], *, health_url: str) -> processes.Process:
        log = self.directory / "logs" / f"{name.replace('/', '-')}.log"
        process = processes.launch(name, argv, log=log, health_url=health_url)
        self.launched.append(process)
        return process


@pytest.fixture(scope="module")
def image() -> images.NodeImage:
    cache = paths.cache_dir()
    chosen = kernels.load(cache)
    found = images.find(cache, chosen) if chosen is not None else None
    assert found is not None, "no VM node image: run `make vm-image vm-test-modules` first"
    for kernel in found.kernels.versions:
        assert (MODULES / kernel / f"{MODULE}.ko").is_file(), "run `make vm-test-modules` first"
    return found


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Launcher]:
    # Short: the node's unix sockets live below it.
    started = _Launcher(tmp_path_factory.mktemp("vm"))
    try:
        yield started
    finally:
        for process in reversed(started.launched):
            process.stop()


@pytest.fixture(scope="module")
def key(launcher: _Launcher) -> firmware.SigningKey:
    return firmware.signing_key(launcher.directory, common_name="kmm sandbox test signing key")


@pytest.fixture(scope="module")
def holder(launcher: _Launcher) -> namespaces.Holder:
    return namespaces.start_holder(launcher, "vm-0-netns")


@pytest.fixture(scope="module")
def node(
    launcher: _Launcher,
    image: images.NodeImage,
    holder: namespaces.Holder,
    key: firmware.SigningKey,
) -> vm.VmNode:
    spec = vm.NodeSpec(
        name="vm-0",
        directory=launcher.directory / "vm-0",
        kernel=image.kernels.default,
        accel="tcg",
        settings=esp.NodeSettings(name="vm-0", mac=vm.mac_address(0), address=f"{ADDRESS}/24"),
    )

    async def started() -> vm.VmNode:
        found = await vm.start(
            launcher, spec, image=image, holder=holder, key=key, cache_dir=paths.cache_dir()
        )
        # No unit failed ("degraded" otherwise): the image boots clean.
        assert await found.wait_ready(timeout=BOOT_TIMEOUT) == "running"
        return found

    # Each test's own loop reaches it: a node holds no connection between calls.
    return asyncio.run(started())


async def _run(node: vm.VmNode, script: str) -> agent.ExecResult:
    return await node.exec(["/bin/sh", "-c", script], timeout=300)


async def test_the_node_boots_debians_signed_kernel_under_secure_boot(
    node: vm.VmNode, key: firmware.SigningKey
) -> None:
    status = await node.status()
    assert status.secure_boot
    assert "[integrity]" in status.lockdown
    assert status.accel == "tcg"
    assert status.kernel == node.saved_kernel() == node.image.kernels.default
    console = node.machine.serial_log.read_text(errors="replace")
    assert "Secure boot enabled" in console
    assert f"Linux version {status.kernel}" in console
    # The firmware gave the kernel the sandbox key, through shim's MokListRT.
    assert f"Loaded X.509 cert '{key.subject()}" in console


async def test_exec_runs_as_root_with_output_and_exit_code(node: vm.VmNode) -> None:
    result = await _run(node, "id -u; hostname; echo to-stderr >&2; exit 3")
    assert result.exit_code == 3
    assert result.stdout.decode().split() == ["0", "vm-0"]
    assert result.stderr == b"to-stderr\n"


async def test_the_guests_one_nic_is_the_tap_in_the_nodes_namespace(
    node: vm.VmNode, holder: namespaces.Holder
) -> None:
    async with qemu.monitor(node.machine.qmp_socket) as monitor:
        network = await monitor.human("info network")
    assert "type=user" not in network
    assert network.count("type=tap") == 1
    assert f"ifname={node.machine.tap}" in network
    # The tap's end in the namespace answers the guest on the guest's subnet.
    namespaces.run_in(
        holder, ["ip", "addr", "add", f"{NAMESPACE_ADDRESS}/24", "dev", node.machine.tap]
    )
    result = await _run(node, f"ping -c 1 -W 10 {NAMESPACE_ADDRESS}")
    assert result.exit_code == 0, result.output
    addresses = (await _run(node, "ip -o -4 addr show")).stdout.decode()
    assert f"{ADDRESS}/24" in addresses
    # Nothing of it in the host's namespace: no tap, no address of the guest's.
    host = _host_addresses()
    assert node.machine.tap not in host
    assert NAMESPACE_ADDRESS not in host


def _host_addresses() -> str:
    """Every interface and address of the host's own network namespace."""
    return subprocess.run(
        ["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout


def _sign(kernel: str, key: firmware.SigningKey, target: Path) -> None:
    """The test module for ``kernel``, signed with ``key`` by the kernel's own
    sign-file, at ``target``."""
    built = MODULES / kernel
    target.write_bytes((built / f"{MODULE}.ko").read_bytes())
    subprocess.run(
        [str(built / "sign-file"), "sha256", str(key.key), str(key.certificate), str(target)],
        check=True,
    )


async def _load_and_unload(
    node: vm.VmNode, key: firmware.SigningKey, scratch: Path, token: str
) -> None:
    """Refused unsigned, loaded signed with the sandbox key, then unloaded."""
    kernel = (await node.status()).kernel
    unsigned = (MODULES / kernel / f"{MODULE}.ko").read_bytes()
    await node.write_file(f"/root/{MODULE}-unsigned.ko", unsigned)
    refused = await _run(node, f"insmod /root/{MODULE}-unsigned.ko greeting={token}")
    assert refused.exit_code != 0
    assert "Key was rejected by service" in refused.output
    log = (await _run(node, "dmesg")).stdout.decode()
    assert "Loading of unsigned module is rejected" in log
    assert f"greeting {token}" not in log

    signed = scratch / f"{MODULE}-{kernel}.ko"
    _sign(kernel, key, signed)
    await node.write_file(f"/root/{MODULE}.ko", signed.read_bytes())
    signer = await _run(node, f"modinfo -F signer /root/{MODULE}.ko")
    assert signer.stdout.decode().strip() == key.subject()
    loaded = await _run(node, f"insmod /root/{MODULE}.ko greeting={token}")
    assert loaded.exit_code == 0, loaded.output
    modules = (await _run(node, "cat /proc/modules")).stdout.decode()
    assert any(line.split()[0] == MODULE for line in modules.splitlines())
    # Trusted, not merely tolerated: no 'E' (unsigned module) taint.
    taint = await _run(node, f"cat /sys/module/{MODULE}/taint")
    assert "E" not in taint.stdout.decode()
    assert f"greeting {token}" in (await _run(node, "dmesg")).stdout.decode()
    unloaded = await _run(node, f"rmmod {MODULE} && ! grep -q '^{MODULE} ' /proc/modules")
    assert unloaded.exit_code == 0, unloaded.output


async def test_a_module_signed_with_the_sandbox_key_loads_an_unsigned_one_is_refused(
    node: vm.VmNode, key: firmware.SigningKey, tmp_path: Path
) -> None:
    await _load_and_unload(node, key, tmp_path, "first-boot")


async def test_a_reboot_onto_the_other_kernel_line(
    node: vm.VmNode, key: firmware.SigningKey, tmp_path: Path
) -> None:
    before = await node.status()
    other = node.image.kernels.other(before.kernel)
    after = await node.reboot(kernel=other, timeout=REBOOT_TIMEOUT)
    assert after.kernel == other != before.kernel
    assert after.boot_id != before.boot_id
    assert after.secure_boot
    assert "[integrity]" in after.lockdown
    assert node.saved_kernel() == other
    # The sandbox key is trusted on this kernel too (its module built for it).
    await _load_and_unload(node, key, tmp_path, "after-reboot")
