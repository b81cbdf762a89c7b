"""``kmm modules``: Modules with their status and the nodes where each is loaded.

"Loaded" is the operator's own answer: the nodes carrying
``kmm.node.kubernetes.io/<ns>.<name>.ready`` (the loader pod there is Ready).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from kubernetes_asyncio import client as k8s
from rich.console import Console
from rich.table import Table

from kmm.api import conditions, labels
from kmm.api import modules as module_api
from kmm.cli import clients

__all__ = ["modules", "modules_table"]


async def modules_table(api: k8s.ApiClient, namespace: str | None) -> list[list[str]]:
    """Rows: namespace, name, Ready (reason), loaded/targeted, loaded on, DaemonSets."""
    custom = k8s.CustomObjectsApi(api)
    if namespace:
        listing = await custom.list_namespaced_custom_object(
            module_api.GROUP, module_api.VERSION, namespace, module_api.PLURAL
        )
    else:
        listing = await custom.list_cluster_custom_object(
            module_api.GROUP, module_api.VERSION, module_api.PLURAL
        )
    nodes = (await k8s.CoreV1Api(api).list_node()).items
    daemonsets = (
        await k8s.AppsV1Api(api).list_daemon_set_for_all_namespaces(label_selector=labels.ROLE)
    ).items
    rows = []
    for item in listing.get("items", ()):
        metadata: dict[str, Any] = item["metadata"]
        ns, name = metadata["namespace"], metadata["name"]
        ready_key = labels.ready(ns, name)
        loaded = sorted(n.metadata.name for n in nodes if ready_key in (n.metadata.labels or {}))
        status = item.get("status") or {}
        ready = next(
            (c for c in status.get("conditions") or () if c.get("type") == conditions.READY), None
        )
        loader = status.get("moduleLoader") or {}
        owned = [
            d.metadata.name
            for d in daemonsets
            if (d.metadata.labels or {}).get(labels.MODULE_NAME) == name
            and d.metadata.namespace == ns
        ]
        rows.append(
            [
                ns,
                name,
                f"{ready['status']} ({ready['reason']})" if ready else "-",
                f"{loader.get('availableNumber', 0)}/{loader.get('desiredNumber', 0)}",
                ", ".join(loaded) or "-",
                str(len(owned)),
            ]
        )
    return rows


async def _rows(kubeconfig: Path | None, namespace: str | None, wait: float) -> list[list[str]]:
    """The table; with ``wait`` > 0, once every Module is Ready (or the wait ends)."""
    api = await clients.api_client(kubeconfig)
    async with api:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            rows = await modules_table(api, namespace)
            settled = rows and all(row[2].startswith("True") for row in rows)
            if settled or loop.time() >= deadline:
                return rows
            await asyncio.sleep(1.0)


def modules(
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig to use.")] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Only this namespace.")
    ] = None,
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for every Module to be Ready first.")
    ] = 0.0,
) -> None:
    """Modules, their Ready condition and the nodes where each module is loaded."""
    table = Table("NAMESPACE", "NAME", "READY", "AVAILABLE/DESIRED", "LOADED ON", "DAEMONSETS")
    for row in asyncio.run(_rows(kubeconfig, namespace, wait)):
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:  # make, CI logs: no 80-column squeeze
        console = Console(width=200)
    console.print(table)
