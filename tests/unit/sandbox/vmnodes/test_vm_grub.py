"""grub's files on a VM node's ESP: configuration and environment block."""

from __future__ import annotations

import pytest

from kmm.sandbox.vmnodes import grub

KERNELS = ("6.1.0-57-amd64", "6.12.118+deb12-amd64")
UUID = "7d39f111-7b9a-53dd-765b-cf37fce0d564"


def test_config_boots_the_saved_default_with_the_arguments_in_grub_cfg() -> None:
    text = grub.config(KERNELS, root_uuid=UUID, extra_arguments=("audit=0",))
    lines = text.splitlines()
    assert lines[0] == "set timeout=0"
    # The saved default is read before the entries and wins when set.
    assert lines.index("load_env --file $prefix/grubenv") < lines.index(
        'if [ -n "${saved_entry}" ]; then set default="${saved_entry}"; fi'
    )
    assert f"search --no-floppy --fs-uuid --set=root {UUID}" in lines
    for kernel in KERNELS:
        assert f"menuentry 'Debian GNU/Linux, Linux {kernel}' --id 'linux-{kernel}' {{" in lines
        assert (
            f"    linux /boot/vmlinuz-{kernel} root=UUID={UUID} rw console=ttyS0,115200 audit=0"
            in lines
        )
        assert f"    initrd /boot/initrd.img-{kernel}" in lines
    # The first listed kernel is grub's fallback default (no saved entry).
    assert text.index(KERNELS[0]) < text.index(KERNELS[1])


@pytest.mark.parametrize("bad", ["6.1'; reboot; '", "a b", "x\ny", "$(id)"])
def test_config_refuses_what_would_escape_its_quotes(bad: str) -> None:
    with pytest.raises(ValueError, match="may not carry"):
        grub.config((bad,), root_uuid=UUID)
    with pytest.raises(ValueError, match="may not carry"):
        grub.config(KERNELS, root_uuid=UUID, extra_arguments=(bad,))


def test_entry_ids_start_with_a_letter() -> None:
    # grub 2.06 reads a default starting with a digit as an entry number:
    # saved_entry=6.12.118+deb12-amd64 booted entry 0 (6.1) on a real node.
    for kernel in KERNELS:
        entry = grub.entry_id(kernel)
        assert entry[0].isalpha()
        assert f"--id '{entry}'" in grub.config(KERNELS, root_uuid=UUID)
        assert grub.entry_kernel(entry) == kernel
    assert grub.entry_kernel("gnulinux-advanced") == ""


def test_environment_is_grubs_1024_byte_block() -> None:
    block = grub.environment({"saved_entry": grub.entry_id(KERNELS[1])})
    assert len(block) == grub.ENV_SIZE
    assert block.startswith(b"# GRUB Environment Block\nsaved_entry=linux-6.12.118+deb12-amd64\n#")
    assert block.endswith(b"#" * 100)
    assert grub.read_environment(block) == {"saved_entry": "linux-6.12.118+deb12-amd64"}


def test_environment_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="more than 1024"):
        grub.environment({f"n{i}": "x" * 60 for i in range(20)})
    with pytest.raises(ValueError, match="not a grub environment block"):
        grub.read_environment(b"saved_entry=x\n")
