"""What every ``kmm sandbox`` command shares: ``--dir``, its two consoles, its error exit.

``DirOption`` names the sandbox a command acts on (None: ``paths.sandbox_dir()``,
which each command resolves). ``console`` prints results on stdout,
``error_console`` progress and errors on stderr; ``fail`` prints an error as
one line on stderr and returns the exit (status 1) for the command to raise.

Limits: options and output only; what a command does is its own module's
(``sandboxing``, ``sandboxcomponents``, ``sandboxstatus``, ``sandboxnodes``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import markup
from rich.console import Console

__all__ = ["DirOption", "console", "error_console", "fail"]

DirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir", help="Sandbox directory (default: $KMM_SANDBOX_DIR or ~/.local/state/kmm/sandbox)."
    ),
]

console = Console()
error_console = Console(stderr=True)


def fail(err: Exception) -> typer.Exit:
    error_console.print(f"[bold red]error:[/] {markup.escape(str(err))}", highlight=False)
    return typer.Exit(1)
