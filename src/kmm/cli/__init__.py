"""The ``kmm`` command line: the only place that reads flags and environment.

Each process has its own module here (``sandboxing``, ``operating``, ...) that
turns flags into plain arguments and calls into its package; this module only
assembles them into one typer application.
"""

from __future__ import annotations

import typer

from kmm.cli import driving, manifesting, operating, sandboxing

__all__ = ["app", "main"]

app = typer.Typer(
    name="kmm",
    help="Kernel module management and Dynamic Resource Allocation for Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(sandboxing.app, name="sandbox")
app.command("driver")(driving.driver)
app.command("manifests")(manifesting.manifests)
operating.register(app)


def main() -> None:
    """Console entry point."""
    app()
