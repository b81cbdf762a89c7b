"""qemu's command line for a VM node."""

from __future__ import annotations

from pathlib import Path

import pytest

from kmm.sandbox.vmnodes import qemu

CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.secboot.fd")


def _machine(**changes: object) -> qemu.Machine:
    values: dict[str, object] = {
        "name": "vm-0",
        "directory": Path("/s/vm-0"),
        "accel": "tcg",
        "secure_boot": True,
        "tap": "kmmtap0",
        "mac": "52:54:00:fa:00:00",
    }
    values.update(changes)
    return qemu.Machine(**values)  # type: ignore[arg-type]


def _options(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


def test_no_network_but_the_tap_and_nothing_qemu_adds_by_itself() -> None:
    argv = qemu.argv(_machine(), code=CODE, qemu="qemu")
    assert {"-nodefaults", "-no-user-config"} <= set(argv)
    assert _options(argv, "-nic") == ["none"]
    assert _options(argv, "-display") == ["none"]
    assert _options(argv, "-netdev") == ["tap,id=net0,ifname=kmmtap0,script=no,downscript=no"]
    assert "virtio-net-pci,netdev=net0,mac=52:54:00:fa:00:00,romfile=" in _options(argv, "-device")
    assert not any("user" in word.split(",")[0] for word in _options(argv, "-netdev"))
    assert _options(argv, "-smp") == ["1"]


def test_a_machine_without_a_tap_has_no_nic() -> None:
    argv = qemu.argv(_machine(tap="", mac=""), code=CODE, qemu="qemu")
    assert "-netdev" not in argv
    assert not any(word.startswith("virtio-net") for word in argv)


def test_secure_boot_on_and_off() -> None:
    on = qemu.argv(_machine(), code=CODE, qemu="qemu")
    assert _options(on, "-machine") == ["q35,smm=on"]
    assert _options(on, "-global") == ["driver=cfi.pflash01,property=secure,value=on"]
    assert f"if=pflash,format=raw,unit=0,readonly=on,file={CODE}" in _options(on, "-drive")
    off = qemu.argv(_machine(secure_boot=False), code=CODE, qemu="qemu")
    assert _options(off, "-machine") == ["q35,smm=off"]
    assert "-global" not in off


@pytest.mark.parametrize(
    ("accel", "expected"), [("tcg", f"tcg,tb-size={qemu.TCG_CODE_CACHE_MIB}"), ("kvm", "kvm")]
)
def test_the_accelerator(accel: str, expected: str) -> None:
    assert _options(qemu.argv(_machine(accel=accel), code=CODE, qemu="qemu"), "-accel") == [
        expected
    ]


def test_disks_and_control_files_are_the_nodes_own() -> None:
    argv = qemu.argv(_machine(), code=CODE, qemu="qemu")
    drives = _options(argv, "-drive")
    assert "if=pflash,format=raw,unit=1,file=/s/vm-0/OVMF_VARS.fd" in drives
    # The guest may not write its ESP (the host does); both disks have a boot
    # index, or OVMF leaves the root disk unconnected and grub cannot find it.
    assert "if=none,id=esp,format=raw,readonly=on,file=/s/vm-0/esp.img" in drives
    assert "if=none,id=root,format=qcow2,discard=unmap,file=/s/vm-0/root.qcow2" in drives
    devices = _options(argv, "-device")
    assert "virtio-blk-pci,drive=esp,bootindex=0" in devices
    assert "virtio-blk-pci,drive=root,bootindex=1" in devices
    chardevs = _options(argv, "-chardev")
    assert "socket,id=qmp,path=/s/vm-0/qmp.sock,server=on,wait=off" in chardevs
    assert "socket,id=qga,path=/s/vm-0/qga.sock,server=on,wait=off" in chardevs
    assert "file,id=serial,path=/s/vm-0/serial.log" in chardevs
    assert "virtserialport,chardev=qga,name=org.qemu.guest_agent.0" in devices
