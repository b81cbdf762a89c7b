"""The ``kmm`` command line: the only place that reads flags and environment.

Each process has its own module here (``sandboxing``, ``operating``,
``driving``, ...) that turns flags into plain arguments, calls into its
package, and adds its commands to the application through ``register``. This
module only assembles them, importing just the module of the command asked
for: ``kmm operator`` should not pay for gRPC and the driver, nor ``kmm
driver`` for the operator.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer

__all__ = ["build", "kubectl_plugin", "main"]

# Top-level command -> the module that registers it.
_REGISTRARS = {
    "sandbox": "kmm.cli.sandboxing",
    "operator": "kmm.cli.operating",
    "apply": "kmm.cli.applying",
    "modules": "kmm.cli.listing",
    "claims": "kmm.cli.claiming",
    "upgrade": "kmm.cli.upgrading",
    "status": "kmm.cli.upgrading",
    "preflight": "kmm.cli.preflighting",
    "driver": "kmm.cli.driving",
    "kubelet": "kmm.cli.emulating",
    "manifests": "kmm.cli.manifesting",
}


def build(command: str | None = None) -> typer.Typer:
    """The application with ``command`` registered, or every command when it is
    None or unknown (help and errors then list them all)."""
    app = typer.Typer(
        name="kmm",
        help="Kernel module management and Dynamic Resource Allocation for Kubernetes.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
    )
    # A callback keeps the application a group even with one command
    # registered; typer would otherwise run that command as the root one.
    app.callback()(_root)
    if command in _REGISTRARS:
        modules = [_REGISTRARS[command]]
    else:
        modules = list(dict.fromkeys(_REGISTRARS.values()))
    for name in modules:
        importlib.import_module(name).register(app)
    return app


def _root() -> None:
    """Kernel module management and Dynamic Resource Allocation for Kubernetes."""


def __getattr__(name: str) -> Any:
    # ``kmm.cli.app``: the whole application, for CliRunner-style tests.
    if name == "app":
        return build()
    raise AttributeError(name)


def main() -> None:
    """Console entry point."""
    build(sys.argv[1] if len(sys.argv) > 1 else None)()


def kubectl_plugin() -> None:
    """``kubectl-kmm``: the same commands as a kubectl plugin (``kubectl kmm
    modules``). kubectl finds it on PATH by name and runs it with the words
    after ``kmm`` and its own environment ($KUBECONFIG); usage and errors
    name it as the user typed it."""
    build(sys.argv[1] if len(sys.argv) > 1 else None)(prog_name="kubectl kmm")
