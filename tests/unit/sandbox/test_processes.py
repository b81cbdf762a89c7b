"""Processes: launched detached with a log, stopped exactly, never confused
with a later process that reuses the pid."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import sys
import time
from pathlib import Path

import pytest

from kmm.sandbox import errors, health, ports, processes, state, testing


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


# Traps SIGTERM, logs "termed", and exits cleanly only once the file named by
# argv[1] exists: its shutdown waits on something the stopper's loop does.
_WAITS_FOR_GO = """
import os, signal, sys, time
termed = []
signal.signal(signal.SIGTERM, lambda *_: termed.append(1))
print("ready", flush=True)
while not termed:
    time.sleep(0.01)
print("termed", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
print("clean exit", flush=True)
"""


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


async def _logged(path: Path, line: str) -> None:
    async def there() -> bool:
        return line in _lines(path)

    await testing.eventually(there, f"{line!r} in {path}", interval=0.01)


def _waits_for_go(tmp_path: Path) -> tuple[processes.Process, Path, Path]:
    log, go = tmp_path / "term.log", tmp_path / "go"
    argv = [sys.executable, "-c", _WAITS_FOR_GO, str(go)]
    return processes.launch("term", argv, log=log), log, go


async def test_an_async_stop_lets_the_loop_run_while_the_process_shuts_down(
    tmp_path: Path,
) -> None:
    """The child exits only after a coroutine on the same loop, woken by its
    "termed", creates the go file. A stop that blocked the loop would keep
    that coroutine from running until the grace ran out and SIGKILL ended
    the child: no "clean exit" in its log, and no tick during the stop."""
    process, log, go = _waits_for_go(tmp_path)
    try:
        await _logged(log, "ready")
        stopping = asyncio.ensure_future(process.stop_async(grace_seconds=30))
        ticks = 0

        async def answer_the_term() -> None:
            nonlocal ticks
            while not stopping.done():
                if "termed" in _lines(log):
                    go.touch()
                ticks += 1
                await asyncio.sleep(0.01)

        await asyncio.gather(stopping, answer_the_term())
    finally:
        process.kill()
    assert not process.alive()
    assert ticks > 0
    assert _lines(log) == ["ready", "termed", "clean exit"]


def test_a_sync_stop_kills_after_the_grace_a_process_that_does_not_exit(
    tmp_path: Path,
) -> None:
    """The CLI's blocking stop: nobody creates the go file, so the child
    outlives SIGTERM and is killed once the grace is over."""
    process, log, _ = _waits_for_go(tmp_path)
    try:
        while "ready" not in _lines(log):
            time.sleep(0.01)
        process.stop(grace_seconds=1)
        assert not process.alive()
        assert _lines(log) == ["ready", "termed"]
    finally:
        process.kill()


async def test_an_async_kill_ends_the_process_at_once(tmp_path: Path) -> None:
    process = processes.launch("sleeper", [_sleep(), "60"], log=tmp_path / "sleeper.log")
    try:
        assert process.alive()
        await process.kill_async()
        assert not process.alive()
    finally:
        process.kill()
