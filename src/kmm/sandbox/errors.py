"""Errors of the sandbox, grouped by what the user can do about them.

::

    SandboxError                    anything the sandbox reports to its user
    ├── ToolchainMissing            install Go (or put it on PATH)
    ├── BuildFailed                 read the build log it names
    ├── CHeadersMissing             install the Debian packages it names
    ├── SandboxInUse                stop the other sandbox, or pick another dir/port
    ├── ComponentFailed             a component exited or never became healthy;
    │                               the message carries the tail of its log
    └── NotRunning                  nothing to stop or show in that dir

Every message ends with what to do next, because these surface verbatim in
``kmm sandbox`` output.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BuildFailed",
    "CHeadersMissing",
    "ComponentFailed",
    "NotRunning",
    "SandboxError",
    "SandboxInUse",
    "ToolchainMissing",
]


class SandboxError(Exception):
    """Base of every error the sandbox reports."""


class ToolchainMissing(SandboxError):
    def __init__(self, detail: str) -> None:
        super().__init__(
            f"{detail}. kmm sandbox builds its control plane from Go modules: install "
            "Go >= 1.26 and put `go` on PATH, then run the command again."
        )


class BuildFailed(SandboxError):
    def __init__(self, component: str, log_path: Path) -> None:
        self.log_path = log_path
        super().__init__(
            f"building {component} failed; the build log is {log_path}. "
            "Fix what it reports (often a network or disk problem) and run the command again."
        )


class CHeadersMissing(SandboxError):
    """A tool built with cgo lacks a C library's headers (or the tools to
    find them)."""

    def __init__(self, component: str, what: str, packages: tuple[str, ...]) -> None:
        self.packages = packages
        super().__init__(
            f"building {component} needs {what} (cgo), which this machine lacks. "
            f"Install it: apt-get install {' '.join(packages)} "
            "(`make sandbox-binaries` does, as root), then run the command again."
        )


class SandboxInUse(SandboxError):
    """The directory already holds a running sandbox, or a port is taken."""


class ComponentFailed(SandboxError):
    def __init__(self, component: str, reason: str, log_path: Path, log_tail: str) -> None:
        self.component = component
        self.log_path = log_path
        super().__init__(
            f"{component} {reason}. Last lines of {log_path}:\n{log_tail}\n"
            "Everything this start launched has been stopped."
        )


class NotRunning(SandboxError):
    """No sandbox state in the given directory."""
