"""Namespaces held by processes: the sandbox's network (and mount) namespaces.

A namespace lives as long as a process is in it. Each of the sandbox's is
made by a *holder*, ``unshare --net [--mount --propagation private] sleep
infinity`` launched like any other component (so it is in ``sandbox.json``
and ``down`` stops it); when the holder dies, the namespace goes, and with it
every interface, address, route and mount made inside. Nothing is named in
``/run/netns`` (``ip netns add``), which would outlive a crashed sandbox.

Others join a holder's namespaces with ``nsenter`` (an argv prefix) or, in
Python, make a socket inside one with ``socket_in``: Python 3.11 has no
``os.setns``, so ``setns(2)`` is called through ctypes in a thread of its own
(a network namespace is a per-thread attribute), and the socket stays in the
namespace it was made in whichever thread uses it later.

Limits: Linux only, needs CAP_SYS_ADMIN (the sandbox runs as root).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Final, Protocol

from kmm.sandbox import errors, processes

__all__ = [
    "Holder",
    "Launcher",
    "NamespaceThread",
    "enter",
    "holder_argv",
    "nsenter",
    "run_in",
    "socket_in",
    "start_holder",
]

_CLONE_NEWNET: Final = 0x40000000  # linux/sched.h
# A holder's program once unshare has made its namespaces and exec'd it.
_HOLDER_PROGRAM: Final = "sleep"
_READY_TIMEOUT: Final = 10.0


class Launcher(Protocol):
    """What starts a holder: the sandbox's launcher, which records it."""

    def launch(self, name: str, argv: list[str], *, health_url: str) -> processes.Process: ...


@dataclasses.dataclass(frozen=True)
class Holder:
    """A process holding a network namespace (and a mount namespace when ``mount``)."""

    pid: int
    mount: bool = False

    @property
    def net_path(self) -> str:
        return f"/proc/{self.pid}/ns/net"

    @property
    def mnt_path(self) -> str:
        return f"/proc/{self.pid}/ns/mnt"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise errors.SandboxError(f"the sandbox's network namespaces need `{name}` on PATH")
    return path


def holder_argv(*, mount: bool) -> list[str]:
    """``unshare`` making a network namespace (and a private mount namespace)
    and then sleeping in it: no fork, so the launched pid is the holder."""
    argv = [_tool("unshare"), "--net"]
    if mount:
        # Private: nothing mounted inside propagates to the host.
        argv += ["--mount", "--propagation", "private"]
    return [*argv, _tool(_HOLDER_PROGRAM), "infinity"]


def _own_namespace(kind: str) -> str:
    return os.readlink(f"/proc/self/ns/{kind}")


def _ready(process: processes.Process) -> bool:
    # unshare execs the sleeper only after it made (and, for a mount
    # namespace, made private) every namespace asked for.
    try:
        program = Path(f"/proc/{process.pid}/comm").read_text().strip()
        net = os.readlink(f"/proc/{process.pid}/ns/net")
    except OSError:
        return False
    return program == _HOLDER_PROGRAM and net != _own_namespace("net")


def start_holder(launcher: Launcher, name: str, *, mount: bool = False) -> Holder:
    """Launch a holder as component ``name``; return once its namespaces
    exist, with loopback up in its network namespace."""
    process = launcher.launch(name, holder_argv(mount=mount), health_url="")
    deadline = time.monotonic() + _READY_TIMEOUT
    while not _ready(process):
        if not process.alive() or time.monotonic() > deadline:
            raise errors.ComponentFailed(
                name,
                "did not make its namespaces",
                process.log,
                processes.log_tail(process.log),
            )
        time.sleep(0.01)
    holder = Holder(pid=process.pid, mount=mount)
    run_in(holder, ["ip", "link", "set", "lo", "up"])
    return holder


def nsenter(holder: Holder, *, mount: bool) -> list[str]:
    """The argv prefix that runs a command in ``holder``'s network namespace
    (and its mount namespace when ``mount``)."""
    argv = [_tool("nsenter"), f"--target={holder.pid}", "--net"]
    if mount:
        if not holder.mount:
            raise ValueError(f"holder {holder.pid} holds no mount namespace")
        argv.append("--mount")
    return argv


def run_in(
    holder: Holder, argv: list[str], *, stdin: str | None = None, mount: bool = False
) -> str:
    """Run ``argv`` in ``holder``'s network namespace (and mount namespace
    when ``mount``); its stdout. SandboxError with the command's stderr when
    it fails."""
    command = [*nsenter(holder, mount=mount), *argv]
    result = subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise errors.SandboxError(
            f"`{' '.join(argv)}` in namespace of holder {holder.pid} failed "
            f"({result.returncode}): {result.stderr.strip()}"
        )
    return result.stdout


_libc = ctypes.CDLL(None, use_errno=True)


def enter(net_path: str) -> None:
    """Move the *calling thread* into the network namespace at ``net_path``.

    Only for a thread that does nothing else afterwards (``NamespaceThread``'s
    worker): the thread never comes back to the namespace it was in."""
    descriptor = os.open(net_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(descriptor, _CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"setns({net_path}): {os.strerror(code)}")
    finally:
        os.close(descriptor)


class NamespaceThread:
    """A thread living in one network namespace, making sockets there.

    Sockets are made in it; everything else (bind, connect, I/O) may happen
    on any thread: a socket belongs to the namespace it was created in.
    """

    def __init__(self, net_path: str) -> None:
        self.net_path = net_path
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="netns", initializer=enter, initargs=(net_path,)
        )

    def socket(
        self, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM
    ) -> concurrent.futures.Future[socket.socket]:
        return self._executor.submit(socket.socket, family, kind)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def socket_in(
    net_path: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM
) -> socket.socket:
    """A new socket in the network namespace at ``net_path``, made by a
    dedicated thread that ends right after (it cannot leave the namespace)."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def make() -> None:
        try:
            enter(net_path)
            made.append(socket.socket(family, kind))
        except BaseException as err:  # handed to the caller's thread
            failed.append(err)

    worker = threading.Thread(target=make, name="netns-socket")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return made[0]
