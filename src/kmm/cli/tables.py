"""What the listing commands share: a table on the console, and waiting for a state.

``console`` is rich's console, 200 columns wide when the output is not a
terminal (make, CI logs) so tables are not squeezed to 80. ``show`` prints
rows under their column names. ``settle`` fetches until the answer is
settled or ``wait`` seconds have passed, and returns the last answer either
way (a listing shows what there is, waited for or not). ``fetched`` runs a
listing's fetch and turns an API error into the CLI's one-line error and
exit status 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from kmm.kube import errors

__all__ = ["console", "fetched", "settle", "show"]

T = TypeVar("T")


def console() -> Console:
    found = Console()
    return found if found.is_terminal else Console(width=200)


def fetched(fetch: Coroutine[Any, Any, T]) -> T:
    """Run ``fetch``; an API error ends the command with its message."""
    try:
        return asyncio.run(fetch)
    except errors.KubeError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None


def show(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    table = Table(*columns)
    for row in rows:
        table.add_row(*row)
    console().print(table)


async def settle(
    fetch: Callable[[], Awaitable[T]],
    settled: Callable[[T], Awaitable[bool]],
    wait: float,
    *,
    interval: float = 1.0,
) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        found = await fetch()
        if loop.time() >= deadline or await settled(found):
            return found
        await asyncio.sleep(interval)
