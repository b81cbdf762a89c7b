"""``kmm upgrade`` and ``kmm status``: ordered upgrades for admins (seed 003).

``kmm upgrade NS/NAME --to V NODE...`` moves nodes to module version ``V``
the way seed 003 has the admin do it: it sets each node's user label
``version-module.<ns>.<name>=V`` (``--batch N`` nodes at a time), then waits
while the operator walks the node through unload-old / load-new, printing
each step as the node reaches it, until the node carries
``<ns>.<name>.version.ready=V``. It stops at the first node that cannot get
there (a pod of the module that cannot run, or ``--timeout`` passed),
naming the step it is stuck on and why, and exits 1.

``kmm status NS/NAME`` prints the same steps as a table, one row per node,
with the image of the node's kernel as the operator last wrote it in
``status.images`` (exists, building or signing in which pod, failed and why).
Both read the cluster only through ``kube.client`` and judge with the
operator's own rule (``operator.inspecting``), so they work against any
cluster the kubeconfig reaches, whichever replica of the operator runs.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from kmm.api import labels
from kmm.cli import clients, tables
from kmm.kube import client, errors, resources
from kmm.operator import inspecting

__all__ = ["register", "say", "status", "status_table", "upgrade"]


class UpgradeFailed(Exception):
    """A node did not reach the version; the message names it and its step."""


def _split(target: str) -> tuple[str, str]:
    namespace, slash, name = target.partition("/")
    if not slash or not namespace or not name:
        raise typer.BadParameter(f"{target!r}: expected NAMESPACE/NAME", param_hint="MODULE")
    return namespace, name


async def _move(
    api: client.Client,
    namespace: str,
    name: str,
    version: str,
    nodes: list[str],
    *,
    batch: int,
    timeout: float,
    console: Console,
) -> None:
    module = await inspecting.get_module(api, namespace, name)
    running = inspecting.module_version(module)
    if running is None:
        raise UpgradeFailed(
            f"Module {namespace}/{name} has no version: ordered upgrades need "
            "spec.moduleLoader.container.version"
        )
    if running != version:
        raise UpgradeFailed(
            f"Module {namespace}/{name} is at version {running}: set "
            f"spec.moduleLoader.container.version (and its image) to {version} first"
        )
    known = {s.node for s in await inspecting.node_states(api, module, only=nodes)}
    missing = [n for n in nodes if n not in known]
    if missing:
        raise UpgradeFailed(f"no such node: {', '.join(missing)}")
    user_key = labels.module_version(namespace, name)
    loop = asyncio.get_running_loop()
    async with inspecting.Watcher(api, module) as watcher:
        while watcher.states() is None:
            await watcher.wait()
        for start in range(0, len(nodes), batch):
            group = nodes[start : start + batch]
            watcher.follow(group)
            for node in group:
                await api.request(
                    "PATCH",
                    resources.NODES.path(name=node),
                    body={"metadata": {"labels": {user_key: version}}},
                    content_type=client.MERGE_PATCH,
                )
                say(console, f"{node}: {user_key}={version}")
            with console.status(f"moving {', '.join(group)} to {version}"):
                await _follow(watcher, group, version, loop.time() + timeout, timeout, console)
            for node in group:
                say(console, f"{node}: on {version}")


def say(console: Console, line: str) -> None:
    """One line of progress, never wrapped (a step naming pods runs past
    any width; logs are grepped by line) and printed as it is (no markup:
    ``[`` in a pod's message is text)."""
    console.print(line, soft_wrap=True, markup=False, highlight=False)


async def _follow(
    watcher: inspecting.Watcher,
    group: list[str],
    version: str,
    deadline: float,
    timeout: float,
    console: Console,
) -> None:
    """Print each step of the nodes in ``group`` as they reach it, until all are on ``version``."""
    loop = asyncio.get_running_loop()
    while True:
        while watcher.steps:
            state = watcher.steps.popleft()
            say(console, f"{state.node}: {state.step.description}")
            if state.problem is not None:
                raise UpgradeFailed(
                    f"{state.node} is stuck at: {state.step.description}; {state.problem}"
                )
        states = watcher.states(only=group) or []
        unfinished = [s for s in states if not (s.step.done and s.version_ready == version)]
        if not unfinished:
            return
        try:
            await asyncio.wait_for(watcher.wait(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise UpgradeFailed(
                "; ".join(
                    f"{s.node} did not reach {version} within {timeout:.0f} s, "
                    f"stuck at: {s.step.description}"
                    for s in unfinished
                )
            ) from None


def upgrade(
    module: Annotated[str, typer.Argument(help="The Module, as NAMESPACE/NAME.")],
    nodes: Annotated[list[str], typer.Argument(help="Nodes to move, in order.")],
    to: Annotated[str, typer.Option("--to", help="The module version to move them to.")],
    batch: Annotated[int, typer.Option(min=1, help="Nodes moved at a time.")] = 1,
    timeout: Annotated[
        float, typer.Option(min=1, help="Seconds one batch may take before it counts as stuck.")
    ] = 600.0,
    kubeconfig: clients.KubeconfigOption = None,
    context: clients.ContextOption = None,
) -> None:
    """Move nodes to a module version, one (or --batch N) at a time, waiting for each."""
    namespace, name = _split(module)
    console = tables.console()
    api = clients.api_client(kubeconfig, context)

    async def run() -> None:
        async with api:
            await _move(
                api, namespace, name, to, nodes, batch=batch, timeout=timeout, console=console
            )

    try:
        asyncio.run(run())
    except (UpgradeFailed, errors.KubeError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    say(console, f"{len(nodes)} node(s) on {to}")


def _mark(value: bool) -> str:
    return "yes" if value else "-"


async def _states(api: client.Client, namespace: str, name: str) -> list[inspecting.NodeState]:
    async with api:
        return await inspecting.node_states(api, await inspecting.get_module(api, namespace, name))


def _image(state: inspecting.NodeState) -> str:
    """The node's kernel's image: its state, pod and message (a kernel with
    several images, one line each); ``-`` when the operator wrote none."""
    return "\n".join(image.describe() for image in state.images) or "-"


def status_table(states: list[inspecting.NodeState]) -> Table:
    """One row per node."""
    table = Table(
        "NODE", "KERNEL", "IMAGE", "VERSION", "LOADER", "PLUGIN", "LOADED", "PLUGIN READY", "STEP"
    )
    for s in states:
        table.add_row(
            s.node,
            s.kernel,
            _image(s),
            s.user or "-",
            s.loader or "-",
            s.plugin or "-",
            _mark(s.loaded),
            _mark(s.plugin_ready),
            s.step.description + (f" ({s.problem})" if s.problem else ""),
        )
    return table


def status(
    module: Annotated[str, typer.Argument(help="The Module, as NAMESPACE/NAME.")],
    kubeconfig: clients.KubeconfigOption = None,
    context: clients.ContextOption = None,
) -> None:
    """Per node: kernel, its image, the three version labels, loaded, plugin ready, and the
    upgrade step."""
    namespace, name = _split(module)
    api = clients.api_client(kubeconfig, context)
    tables.console().print(status_table(tables.fetched(_states(api, namespace, name))))


def register(app: typer.Typer) -> None:
    app.command("upgrade")(upgrade)
    app.command("status")(status)
