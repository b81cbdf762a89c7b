"""VM nodes as a kind of node (kmm.sandbox.vmnodes.kind): their plan, their
place on the fabric, what ``down`` removes, when a rebooted Node counts."""

from __future__ import annotations

from pathlib import Path

from kmm.sandbox import addressing, state
from kmm.sandbox.vmnodes import images, kernels
from kmm.sandbox.vmnodes import kind as vmkind
from kmm.sandbox.vmnodes import nodes as vm
from kmm.sandbox.vmnodes import planning as vmplanning

CHOSEN = kernels.KernelList(versions=("6.1.0-57-amd64", "6.12.118+deb12-amd64"))


def _record(tmp_path: Path, *, kubelets: int = 2, vms: int = 2) -> state.SandboxState:
    return state.SandboxState(
        directory=tmp_path,
        server="https://127.0.0.1:1",
        kubeconfig=tmp_path / "kubeconfig",
        launched=[],
        node_names=[],
        versions={},
        kubelet_nodes=[f"kmm-kubelet-{i}" for i in range(kubelets)],
        vm_nodes=vmkind.names(vms),
    )


def _boot(tmp_path: Path) -> vmplanning.Boot:
    return vmplanning.Boot(
        image=images.NodeImage(directory=tmp_path / "image", kernels=CHOSEN, root_uuid="u"),
        kernel=CHOSEN.default,
        secure_boot=True,
        accel="tcg",
        key=vmplanning.signing_key_path(tmp_path),
        pause_archive=tmp_path / "pause.tar",
    )


def test_vm_nodes_follow_the_kubelet_nodes_on_the_fabric_and_are_found_again(
    tmp_path: Path,
) -> None:
    record = _record(tmp_path)
    planned = vmkind.plan(record, [101, 102, 103, 104, 105, 106], boot=_boot(tmp_path))
    assert planned.names == ["kmm-vm-0", "kmm-vm-1"]
    attachments = planned.attachments()
    assert [a.index for a in attachments] == [2, 3]
    assert [a.published for a in attachments] == [(101, 102, 103), (104, 105, 106)]
    assert all(a.tap and a.mount is None for a in attachments)
    found = vmkind.of(record)
    assert found is not None
    assert found.attachments() == attachments
    described = found.describe()
    assert [(n.name, n.address) for n in described] == [
        ("kmm-vm-0", str(addressing.node_address(2))),
        ("kmm-vm-1", str(addressing.node_address(3))),
    ]
    # Not started: what it runs is not known.
    assert dict(described[0].details)["kernel"] == "?"
    assert vmkind.of(_record(tmp_path, vms=0)) is None


def test_stop_removes_a_nodes_disks_and_keeps_its_records_and_console(tmp_path: Path) -> None:
    record = _record(tmp_path, kubelets=0, vms=1)
    planned = vmkind.plan(record, [1, 2, 3], boot=_boot(tmp_path))
    directory = tmp_path / "vms" / "0"
    for name in ("root.qcow2", "esp.img", "OVMF_VARS.fd", "qmp.sock", "serial.log"):
        (directory / name).write_text("x")
    planned.stop()
    assert sorted(p.name for p in directory.iterdir()) == ["serial.log", "vmnode.json"]


def test_a_rebooted_node_counts_once_ready_on_the_new_boot_and_kernel() -> None:
    booted = vm.Status(
        kernel="6.12.118+deb12-amd64", boot_id="b2", secure_boot=True, lockdown="", accel="tcg"
    )

    def node(boot_id: str, kernel: str, ready: str) -> dict[str, object]:
        return {
            "status": {
                "nodeInfo": {"bootID": boot_id, "kernelVersion": kernel},
                "conditions": [{"type": "Ready", "status": ready}],
            }
        }

    assert vmkind._booted(node("b2", "6.12.118+deb12-amd64", "True"), booted)
    # Still the old boot's status, though Ready.
    assert not vmkind._booted(node("b1", "6.1.0-57-amd64", "True"), booted)
    assert not vmkind._booted(node("b2", "6.12.118+deb12-amd64", "False"), booted)
