"""Processes: launched detached with a log, stopped exactly, never confused
with a later process that reuses the pid."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from kmm.sandbox import errors, health, ports, processes, state


def _sleep() -> str:
    found = shutil.which("sleep")
    assert found is not None
    return found


def test_launch_and_stop(tmp_path: Path) -> None:
    process = processes.launch("sleeper", [_sleep(), "60"], log=tmp_path / "logs" / "sleeper.log")
    try:
        assert process.alive()
        assert process.rss_bytes() > 0
    finally:
        process.stop(grace_seconds=5)
    assert not process.alive()
    assert process.rss_bytes() == 0


def test_a_record_with_another_start_time_is_not_our_process(tmp_path: Path) -> None:
    process = processes.launch("sleeper", [_sleep(), "60"], log=tmp_path / "sleeper.log")
    try:
        stranger = dataclasses.replace(process, start_ticks=process.start_ticks + 1)
        assert not stranger.alive()
        stranger.stop()  # must not signal the real process
        assert process.alive()
    finally:
        process.stop(grace_seconds=5)


def test_state_round_trip(tmp_path: Path) -> None:
    record = state.SandboxState(
        directory=tmp_path,
        server="https://127.0.0.1:6443",
        kubeconfig=tmp_path / "kubeconfig",
        launched=[
            processes.Process(
                "etcd", 10, 20, tmp_path / "etcd.log", ("etcd", "--x"), "http://127.0.0.1:1/health"
            ),
        ],
        node_names=["kmm-worker-0"],
        versions={"etcd": "v3.6.16"},
    )
    state.save(record)
    assert state.load(tmp_path) == record


def test_a_corrupt_record_is_reported(tmp_path: Path) -> None:
    (tmp_path / state.STATE_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="not a readable sandbox record"):
        state.load(tmp_path)


def test_a_taken_port_is_refused_with_a_clear_message() -> None:
    import socket

    with socket.socket() as holder:
        holder.bind((ports.HOST, 0))
        holder.listen()
        taken = holder.getsockname()[1]
        with pytest.raises(errors.SandboxInUse, match=f"port {taken} .* is in use"):
            ports.require_free(taken, what="kube-apiserver")


def test_free_ports_are_distinct() -> None:
    chosen = ports.free_ports(8)
    assert len(set(chosen)) == 8


async def test_a_component_that_exits_during_start_is_reported_with_its_log(
    tmp_path: Path,
) -> None:
    shell = shutil.which("sh")
    assert shell is not None
    process = processes.launch(
        "doomed",
        [shell, "-c", "echo 'listen tcp: address already in use' >&2; exit 3"],
        log=tmp_path / "doomed.log",
        health_url="http://127.0.0.1:9/healthz",
    )
    with pytest.raises(errors.ComponentFailed) as caught:
        await health.wait_healthy(process, timeout=60)
    message = str(caught.value)
    assert "doomed exited during start" in message
    assert "address already in use" in message
    assert str(tmp_path / "doomed.log") in message
