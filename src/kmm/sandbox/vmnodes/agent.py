"""Reaching a VM node's own OS: qemu's guest agent, as root.

The agent (Debian's ``qemu-guest-agent``, started by udev when its virtio
port appears) speaks JSON over a virtio serial port whose host end is the
node's ``qga.sock``. Its commands used here: ``guest-exec`` (run a program,
its output captured; ``guest-exec-status`` says when it ended, with its exit
code and output), ``guest-file-*`` (write a file), ``guest-shutdown``
(reboot: it answers nothing when it works).

The socket takes one client at a time and accepts a connection whether the
agent runs or not: what is written before it runs stays in the port, and the
agent answers it later. So every session starts with
``guest-sync-delimited`` and a fresh id, and reads past anything until the
0xFF the agent sends before that answer; a session that gets no answer in
time (the guest still booting) is closed and may be tried again (``wait``).

Limits: the agent returns a program's output once it ended (at most 16 MiB
of each stream); no stdin.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Final

from kmm.sandbox import errors

__all__ = ["Agent", "AgentUnavailable", "ExecResult", "session", "wait"]

_DELIMITER: Final = b"\xff"
_CHUNK: Final = 48 * 1024


class AgentUnavailable(errors.SandboxError):
    """The guest agent did not answer (the guest is booting, or down)."""


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """How a program run in the guest ended."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    signal: int | None = None

    @property
    def output(self) -> str:
        """stdout and stderr as text, one after the other."""
        return (self.stdout + self.stderr).decode(errors="replace")


class Agent:
    """One synchronized session with a guest agent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def _send(self, command: str, arguments: dict[str, Any] | None) -> None:
        message: dict[str, Any] = {"execute": command}
        if arguments is not None:
            message["arguments"] = arguments
        self._writer.write(json.dumps(message).encode() + b"\n")
        await self._writer.drain()

    async def sync(self) -> None:
        """Discard whatever is pending and wait for the agent's answer to a
        fresh ``guest-sync-delimited``."""
        token = random.randrange(1, 2**31)
        # A lone 0xFF first makes the agent drop a half-read request.
        self._writer.write(_DELIMITER)
        await self._send("guest-sync-delimited", {"id": token})
        while True:
            await self._reader.readuntil(_DELIMITER)
            line = await self._reader.readline()
            with contextlib.suppress(ValueError):
                if json.loads(line).get("return") == token:
                    return

    async def call(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        await self._send(command, arguments)
        while True:
            line = await self._reader.readline()
            if not line:
                raise AgentUnavailable(f"the guest agent closed the session during {command}")
            line = line.lstrip(_DELIMITER).strip()
            if not line:
                continue
            answer = json.loads(line)
            if "error" in answer:
                raise errors.SandboxError(
                    f"guest agent {command}: {answer['error'].get('desc', answer['error'])}"
                )
            if "return" in answer:
                return answer["return"]

    async def execute(self, argv: Sequence[str], *, timeout: float) -> ExecResult:
        """Run ``argv`` as root in the guest; how it ended. TimeoutError after
        ``timeout`` seconds (the program goes on running)."""
        started = await self.call(
            "guest-exec", {"path": argv[0], "arg": list(argv[1:]), "capture-output": True}
        )
        pid = started["pid"]
        pause = 0.05
        async with asyncio.timeout(timeout):
            while True:
                status = await self.call("guest-exec-status", {"pid": pid})
                if status.get("exited"):
                    break
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.5)
        return ExecResult(
            exit_code=int(status.get("exitcode", -1)),
            stdout=base64.b64decode(status.get("out-data", "")),
            stderr=base64.b64decode(status.get("err-data", "")),
            signal=status.get("signal"),
        )

    async def write_file(self, path: str, content: bytes, *, mode: str = "w") -> None:
        """Write ``content`` to ``path`` in the guest (as root; made or truncated)."""
        handle = await self.call("guest-file-open", {"path": path, "mode": mode})
        try:
            for start in range(0, len(content), _CHUNK) or [0]:
                chunk = content[start : start + _CHUNK]
                await self.call(
                    "guest-file-write",
                    {"handle": handle, "buf-b64": base64.b64encode(chunk).decode()},
                )
        finally:
            await self.call("guest-file-close", {"handle": handle})

    async def reboot(self, *, answer_within: float = 5.0) -> None:
        """Ask the guest's OS to reboot (the agent runs ``shutdown -r +0``).
        The agent answers nothing when that works, and an error when it does
        not: SandboxError when one comes within ``answer_within`` seconds."""
        await self._send("guest-shutdown", {"mode": "reboot"})
        try:
            async with asyncio.timeout(answer_within):
                line = await self._reader.readline()
        except (TimeoutError, OSError):
            return
        with contextlib.suppress(ValueError):
            error = json.loads(line.lstrip(_DELIMITER) or b"{}").get("error")
            if error:
                raise errors.SandboxError(f"the guest refused to reboot: {error.get('desc')}")


@contextlib.asynccontextmanager
async def session(socket: Path, *, timeout: float = 5.0) -> AsyncIterator[Agent]:
    """A synchronized session, or AgentUnavailable when the agent does not
    answer within ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(str(socket))
    except (OSError, TimeoutError) as err:
        raise AgentUnavailable(f"no guest agent socket at {socket}: {err}") from err
    try:
        agent = Agent(reader, writer)
        try:
            async with asyncio.timeout(timeout):
                await agent.sync()
        except (TimeoutError, asyncio.IncompleteReadError, OSError) as err:
            raise AgentUnavailable(f"the guest agent at {socket} did not answer") from err
        yield agent
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def wait(socket: Path, *, timeout: float, alive: Callable[[], bool] | None = None) -> None:
    """Return once the agent answers; AgentUnavailable after ``timeout``
    seconds, or at once when ``alive()`` (the VM process) says False."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with session(socket, timeout=min(5.0, max(0.5, deadline - time.monotonic()))):
                return
        except AgentUnavailable:
            if alive is not None and not alive():
                raise
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)
