"""The host sysctls kubelets change: one record for the host, written back
by the last running sandbox that holds them (``hostsysctls``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kmm.sandbox import hostsysctls, processes, state

# What the host had, and what a kubelet writes (its setupKernelTunables).
HOSTS = {
    "vm/overcommit_memory": "0",
    "vm/panic_on_oom": "0",
    "kernel/panic": "0",
    "kernel/panic_on_oops": "0",
    "kernel/keys/root_maxkeys": "200",
    "kernel/keys/root_maxbytes": "20000",
}
KUBELETS = {
    **HOSTS,
    "vm/overcommit_memory": "1",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


@pytest.fixture
def proc_sys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A /proc/sys of the test's own, holding the host's values, and a ledger beside it."""
    root = tmp_path / "proc-sys"
    _write(root, {**HOSTS, "kernel/random/boot_id": "boot-1"})
    monkeypatch.setattr(hostsysctls, "_PROC_SYS", root)
    monkeypatch.setattr(hostsysctls, "LEDGER", tmp_path / "run" / "sandbox-sysctls.json")
    return root


def _write(root: Path, values: dict[str, str]) -> None:
    for name, value in values.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(value + "\n")


def _values(root: Path) -> dict[str, str]:
    return {name: (root / name).read_text().strip() for name in hostsysctls.SYSCTLS}


class _Sandboxes:
    """Sandbox directories whose record names a live process (a sleeper)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.started: list[processes.Process] = []

    def running(self, name: str) -> Path:
        directory = self.base / name
        directory.mkdir()
        sleeper = processes.launch("sleep", ["/bin/sleep", "60"], log=directory / "sleep.log")
        self.started.append(sleeper)
        state.save(
            state.SandboxState(
                directory=directory,
                server="https://127.0.0.1:1",
                kubeconfig=directory / "kubeconfig",
                launched=[sleeper],
                node_names=[],
                versions={},
            )
        )
        return directory

    def kill(self, directory: Path) -> None:
        record = state.load(directory)
        assert record is not None
        for process in record.launched:
            process.kill()


@pytest.fixture
def sandboxes(tmp_path: Path) -> Iterator[_Sandboxes]:
    found = _Sandboxes(tmp_path)
    try:
        yield found
    finally:
        for process in found.started:
            process.kill()


def test_two_sandboxes_at_once_leave_the_hosts_values_when_the_last_goes(
    proc_sys: Path, sandboxes: _Sandboxes
) -> None:
    first, second = sandboxes.running("first"), sandboxes.running("second")
    hostsysctls.claim(first)
    _write(proc_sys, KUBELETS)  # the first sandbox's kubelet starts
    hostsysctls.claim(second)
    assert hostsysctls.users() == [str(first), str(second)]
    # The first goes down while the second's kubelets still run.
    sandboxes.kill(first)
    assert not hostsysctls.release(first)
    assert _values(proc_sys) == KUBELETS
    assert hostsysctls.users() == [str(second)]
    sandboxes.kill(second)
    assert hostsysctls.release(second)
    assert _values(proc_sys) == HOSTS
    assert hostsysctls.users() == []


def test_the_first_down_of_two_restores_nothing_whichever_goes_first(
    proc_sys: Path, sandboxes: _Sandboxes
) -> None:
    first, second = sandboxes.running("first"), sandboxes.running("second")
    hostsysctls.claim(first)
    _write(proc_sys, KUBELETS)
    hostsysctls.claim(second)
    sandboxes.kill(second)
    assert not hostsysctls.release(second)
    assert _values(proc_sys) == KUBELETS
    sandboxes.kill(first)
    assert hostsysctls.release(first)
    assert _values(proc_sys) == HOSTS


def test_a_sandbox_killed_before_its_down_holds_nothing(
    proc_sys: Path, sandboxes: _Sandboxes
) -> None:
    crashed = sandboxes.running("crashed")
    hostsysctls.claim(crashed)
    _write(proc_sys, KUBELETS)
    sandboxes.kill(crashed)  # and never runs `down`
    later = sandboxes.running("later")
    hostsysctls.claim(later)
    # The crashed one's kubelet values are not taken for the host's.
    assert hostsysctls.users() == [str(later)]
    sandboxes.kill(later)
    assert hostsysctls.release(later)
    assert _values(proc_sys) == HOSTS


def test_a_ledger_of_an_earlier_boot_is_forgotten(proc_sys: Path, sandboxes: _Sandboxes) -> None:
    before = sandboxes.running("before-reboot")
    hostsysctls.claim(before)
    # The host rebooted: its values are its own again, and different.
    rebooted = {**HOSTS, "kernel/panic": "5"}
    _write(proc_sys, {**rebooted, "kernel/random/boot_id": "boot-2"})
    assert hostsysctls.users() == []
    after = sandboxes.running("after-reboot")
    hostsysctls.claim(after)
    _write(proc_sys, KUBELETS)
    sandboxes.kill(after)
    assert hostsysctls.release(after)
    assert _values(proc_sys) == rebooted


def test_a_release_without_a_ledger_writes_nothing(proc_sys: Path, tmp_path: Path) -> None:
    _write(proc_sys, KUBELETS)
    assert not hostsysctls.release(tmp_path / "never-claimed")
    assert _values(proc_sys) == KUBELETS


def test_values_are_written_back_only_where_they_changed(proc_sys: Path) -> None:
    _write(proc_sys, {"vm/overcommit_memory": "1", "kernel/panic": "10"})
    hostsysctls.restore({"vm/overcommit_memory": "0", "kernel/panic": "10"})
    assert (proc_sys / "vm/overcommit_memory").read_text() == "0"
    assert (proc_sys / "kernel/panic").read_text() == "10\n"  # untouched
