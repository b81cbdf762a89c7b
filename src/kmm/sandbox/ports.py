"""Ports on 127.0.0.1: find free ones, check a requested one is free."""

from __future__ import annotations

import contextlib
import socket

from kmm.sandbox import errors

__all__ = ["free_ports", "require_free"]

HOST = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free a moment ago.

    All sockets stay open until every port is chosen so no two coincide. Another
    process may still take one before we bind it; the component then exits and
    the start fails with its log, which names the port.
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def require_free(port: int, *, what: str) -> None:
    """Raise ``SandboxInUse`` naming ``what`` if ``port`` cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError as err:
            raise errors.SandboxInUse(
                f"port {port} on {HOST} (asked for the {what}) is in use: {err.strerror}. "
                "Choose another port, or leave the option out to pick a free one."
            ) from err
