"""``kmm sandbox status``: what runs where, as tables; and the registry's line ``up`` prints too.

``status`` shows the control plane's processes (pid, state, RSS, health
endpoint, log), then, when all of them run, the nodes (Ready, kernel) and a
table per kind of node with more to say (container nodes, VM nodes: what
their kind's ``status`` asks of them). It exits 1 when some process is not
running, 0 when none was ever launched.

Limits: rendering only; what is running is ``kmm.sandbox.cluster``'s and the
node kinds' to say.
"""

from __future__ import annotations

import asyncio

import typer
from rich.table import Table

from kmm.cli import paths, sandboxcommon
from kmm.sandbox import cluster, errors, nodekinds, state

__all__ = ["registry_line", "status"]


def status(directory: sandboxcommon.DirOption = None) -> None:
    """Say what runs where: components, ports, memory, nodes."""
    target = directory or paths.sandbox_dir()
    try:
        record = cluster.status(target)
    except (errors.SandboxError, ValueError) as err:
        raise sandboxcommon.fail(err) from err
    table = Table(title=f"kmm sandbox in {record.directory}")
    for column in ("component", "pid", "state", "RSS MiB", "health endpoint", "log"):
        table.add_column(column)
    total_rss = 0
    running = 0
    for process in record.launched:
        alive = process.alive()
        rss = process.rss_bytes() if alive else 0
        total_rss += rss
        running += alive
        table.add_row(
            process.name,
            str(process.pid),
            "[green]running[/]" if alive else "[red]stopped[/]",
            f"{rss / 2**20:.0f}" if alive else "-",
            process.health_url,
            str(process.log),
        )
    sandboxcommon.console.print(table)
    sandboxcommon.console.print(
        f"API server {record.server}; control plane RSS {total_rss / 2**20:.0f} MiB"
    )
    sandboxcommon.console.print(f"KUBECONFIG={record.kubeconfig}", soft_wrap=True)
    if record.registry is not None:
        sandboxcommon.console.print(registry_line(record), soft_wrap=True)
    if running != len(record.launched) or not record.launched:
        raise typer.Exit(0 if running == 0 and not record.launched else 1)
    node_rows = asyncio.run(cluster.node_table(record.kubeconfig))
    nodes_table = Table(title="nodes")
    for column in ("name", "Ready", "kernel"):
        nodes_table.add_column(column)
    for row in node_rows:
        nodes_table.add_row(*row)
    sandboxcommon.console.print(nodes_table)
    ready = {row[0]: row[1] for row in node_rows}
    for kind in cluster.kinds(record):
        title = _NODE_TABLES.get(kind.kind)
        if title is None:
            continue
        described = asyncio.run(kind.status())
        if described:
            sandboxcommon.console.print(_node_kind_table(title, described, ready))


# The kinds of node ``status`` shows a table of, beside the nodes table.
_NODE_TABLES = {"containerd": "container nodes", "vm": "VM nodes"}


def _node_kind_table(
    title: str, described: list[nodekinds.NodeInfo], ready: dict[str, str]
) -> Table:
    """One kind's nodes: name, what the kind says of each, node IP, Ready."""
    table = Table(title=title)
    columns = [column for column, _ in described[0].details]
    for column in ("name", *columns, "node IP", "Ready"):
        table.add_column(column)
    for node in described:
        values = dict(node.details)
        table.add_row(
            node.name,
            *(values.get(column, "") for column in columns),
            node.address,
            ready.get(node.name, "Unknown"),
        )
    return table


def registry_line(record: state.SandboxState) -> str:
    """The sandbox registry: its names, the CA it is served under, its credentials."""
    registry = record.registry
    assert registry is not None
    credentials = (
        f"credentials {registry.credentials}" if registry.credentials else "no authentication"
    )
    return (
        f"Registry {registry.reference_host} (from the host: {registry.host}; "
        f"CA {record.directory / 'pki' / 'ca.crt'}; {credentials})"
    )
