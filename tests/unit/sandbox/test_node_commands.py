"""``kmm sandbox node exec|reboot`` as a user types them: the command after
``--`` verbatim, its output and exit code; a node that is not a VM's named
for what it is."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kmm import cli
from kmm.cli import sandboxnodes
from kmm.sandbox import state
from kmm.sandbox.vmnodes import agent
from kmm.sandbox.vmnodes import nodes as vmnodes


class _FakeVmNodes:
    """Stands in for a running sandbox's VM nodes: records what it is asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[str]]] = []

    async def exec(self, name: str, argv: Sequence[str], *, timeout: float) -> agent.ExecResult:
        self.asked.append((name, list(argv)))
        return agent.ExecResult(exit_code=3, stdout=b"out\n", stderr=b"err\n")

    async def reboot(self, name: str, *, kernel: str | None, timeout: float) -> vmnodes.Status:
        self.asked.append((name, ["reboot", kernel or ""]))
        return vmnodes.Status(
            kernel=kernel or "6.1.0-57-amd64",
            boot_id="b00t",
            secure_boot=True,
            lockdown="none [integrity] confidentiality",
            accel="tcg",
        )


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(cli.build("sandbox"), ["sandbox", *args], env={"COLUMNS": "200"})


def _said(result: Any) -> str:
    """The output on one line: an error naming a long temporary path wraps
    wherever the console's width falls."""
    return " ".join(result.output.split())


def test_exec_runs_what_follows_the_double_dash_and_exits_with_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakeVmNodes()
    monkeypatch.setattr(sandboxnodes, "_vm_nodes", lambda directory, node: fake)
    result = _invoke(
        ["node", "exec", "--dir", str(tmp_path), "kmm-vm-0", "--", "sh", "-c", "exit 3", "-x"]
    )
    assert fake.asked == [("kmm-vm-0", ["sh", "-c", "exit 3", "-x"])]
    assert result.exit_code == 3
    assert "out" in result.stdout


def test_reboot_prints_what_the_node_runs_as_its_kernel_says_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lockdown mode in force is bracketed by the kernel: printed as
    text, not taken for rich markup (which printed "none  confidentiality")."""
    fake = _FakeVmNodes()
    monkeypatch.setattr(sandboxnodes, "_vm_nodes", lambda directory, node: fake)
    result = _invoke(["node", "reboot", "--dir", str(tmp_path), "kmm-vm-0", "--kernel", "6.12.1"])
    assert result.exit_code == 0, result.output
    assert fake.asked == [("kmm-vm-0", ["reboot", "6.12.1"])]
    said = _said(result)
    assert "kmm-vm-0 Ready on kernel 6.12.1 after" in said
    assert "(boot b00t; Secure Boot on, lockdown none [integrity] confidentiality; tcg)" in said


def test_an_error_is_printed_as_it_was_said(tmp_path: Path) -> None:
    result = _invoke(["node", "reboot", "--dir", str(tmp_path / "[none]"), "kmm-vm-0"])
    assert result.exit_code == 1
    assert "[none]" in _said(result)


def test_a_container_node_is_named_for_what_it_is(tmp_path: Path) -> None:
    state.save(
        state.SandboxState(
            directory=tmp_path,
            server="https://127.0.0.1:1",
            kubeconfig=tmp_path / "kubeconfig",
            launched=[],
            node_names=["kmm-worker-0"],
            versions={},
            kubelet_nodes=["kmm-kubelet-0"],
            container_nodes=["kmm-kubelet-0"],
        )
    )
    result = _invoke(["node", "exec", "--dir", str(tmp_path), "kmm-kubelet-0", "--", "true"])
    assert result.exit_code == 1
    assert "kmm-kubelet-0 is a containerd node" in _said(result)
    result = _invoke(["node", "reboot", "--dir", str(tmp_path), "kmm-worker-0"])
    assert "kmm-worker-0 is a kwok node" in _said(result)
    result = _invoke(["node", "reboot", "--dir", str(tmp_path), "kmm-vm-0"])
    assert result.exit_code == 1
    assert "has no VM node" in _said(result)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node-kernel", "6.1.0-57-amd64"], "--node-kernel needs --vm-nodes 1 or more"),
        (["--no-secure-boot"], "--no-secure-boot needs --vm-nodes 1 or more"),
        (["--vm-nodes", "1", "--accel", "hvf"], "--accel must be one of auto, kvm, tcg"),
    ],
)
def test_up_refuses_vm_options_before_starting_anything(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = _invoke(["up", "--dir", str(tmp_path / "s"), "--nodes", "0", *args])
    assert result.exit_code == 1
    assert message in result.output
    assert not (tmp_path / "s").exists()
