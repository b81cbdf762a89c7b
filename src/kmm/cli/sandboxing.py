"""``kmm sandbox``: the local control plane commands."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Run a local Kubernetes control plane with fake nodes.", no_args_is_help=True
)


@app.command()
def status() -> None:
    """Say what runs where."""
    raise typer.Exit(1)
