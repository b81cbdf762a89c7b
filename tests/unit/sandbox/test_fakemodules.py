"""A container node's fake kernel-module devices (``--fake-module``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kmm.sandbox.containernodes import fakemodules
from kmm.sandbox.containernodes import nodes as containernodes
from kmm.sandbox.kubeletnodes import nodes as kubeletnodes


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("foo", "NAME=COUNT"),
        ("Foo=1", "lowercase"),
        ("foo=0", "COUNT must be 1 to 64"),
        ("foo=x", "COUNT must be 1 to 64"),
    ],
)
def test_a_bad_option_names_the_flag_and_the_rule(text: str, rule: str) -> None:
    with pytest.raises(ValueError, match=f"--fake-module '{text}'.*{rule}"):
        fakemodules.parse(text)


def test_parse() -> None:
    assert fakemodules.parse("kmm_demo=2") == ("kmm_demo", 2)


def test_the_node_shows_each_module_with_real_device_numbers(tmp_path: Path) -> None:
    # mknod: as root, as container nodes need anyway.
    fakemodules.lay_out(tmp_path, [("foo", 2), ("bar", 1)])
    fake = tmp_path / "fake"
    assert (fake / "sys-class/foo/foo1/dev").read_text() == "240:1\n"
    assert (fake / "sys-class/bar/bar0/dev").read_text() == "241:0\n"
    assert (fake / "sys-module/foo/version").read_text() == "1.0\n"
    st = (fake / "dev/foo1").stat()
    assert stat.S_ISCHR(st.st_mode)
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (240, 1)
    assert stat.S_IMODE(st.st_mode) == fakemodules.DEVICE_MODE
    fakemodules.lay_out(tmp_path, [("foo", 2), ("bar", 1)])  # again: a restart


def test_the_overlays_come_before_the_root_is_shared(tmp_path: Path) -> None:
    node = containernodes.ContainerNode(
        kubelet=kubeletnodes.KubeletNode("n", tmp_path / "kubelets/0", 1, 2, 0),
        index=0,
        proxy_healthz_port=3,
        cgroup_root="/kmm-sandbox-abcd/n",
        fake_modules=(("foo", 1),),
    )
    script = containernodes.mount_script(node, containernodes.mount_plan(node)).splitlines()
    overlays = [line.split()[-1] for line in script if line.startswith("mount -t overlay")]
    assert overlays[-3:] == ["/sys/class", "/sys/module", "/dev"]
    assert script[-1] == "mount --make-rshared /"
    # Saved and loaded with the node.
    node.make_dirs()
    containernodes.save(node)
    assert containernodes.load(node.directory) == node
