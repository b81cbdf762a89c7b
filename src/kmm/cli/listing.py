"""``kmm modules``: Modules with their status and the nodes where each is loaded.

"Loaded" is the operator's own answer: the nodes carrying
``kmm.node.kubernetes.io/<ns>.<name>.ready`` (the loader pod there is Ready).
The IMAGES column is per kernel what the operator last wrote in
``status.images``: whether the image exists, is being built or signed (and
by which pod), or failed (the pod; ``kmm status`` adds why).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from kmm.api import conditions, labels
from kmm.api import modules as module_api
from kmm.cli import clients, tables
from kmm.kube import client, objects, resources
from kmm.operator import inspecting

__all__ = [
    "images_cell",
    "module_row",
    "modules",
    "modules_table",
    "register",
]

_MODULES = resources.Resource(module_api.GROUP, module_api.VERSION, module_api.PLURAL)


COLUMNS = ("NAMESPACE", "NAME", "READY", "AVAILABLE/DESIRED", "LOADED ON", "DAEMONSETS", "IMAGES")


def images_cell(module: dict[str, Any]) -> str:
    """Per kernel, one line: ``KERNEL: building (pod P)``; ``-`` when none written."""
    said = [f"{i.kernel}: {i.describe(message=False)}" for i in inspecting.images(module)]
    return "\n".join(said) or "-"


def module_row(
    item: dict[str, Any], nodes: list[dict[str, Any]], daemonsets: list[dict[str, Any]]
) -> list[str]:
    """One Module's row, in ``COLUMNS`` order."""
    metadata: dict[str, Any] = item["metadata"]
    ns, name = metadata["namespace"], metadata["name"]
    ready_key = labels.ready(ns, name)
    loaded = sorted(objects.name(n) for n in nodes if ready_key in objects.labels(n))
    status = item.get("status") or {}
    ready = next(
        (c for c in status.get("conditions") or () if c.get("type") == conditions.READY), None
    )
    loader = status.get("moduleLoader") or {}
    owned = [
        objects.name(d)
        for d in daemonsets
        if objects.labels(d).get(labels.MODULE_NAME) == name and objects.namespace(d) == ns
    ]
    return [
        ns,
        name,
        f"{ready['status']} ({ready['reason']})" if ready else "-",
        f"{loader.get('availableNumber', 0)}/{loader.get('desiredNumber', 0)}",
        ", ".join(loaded) or "-",
        str(len(owned)),
        images_cell(item),
    ]


async def modules_table(api: client.Client, namespace: str | None) -> list[list[str]]:
    """Rows in ``COLUMNS`` order, one per Module."""
    listing = await api.request("GET", _MODULES.path(namespace))
    nodes = (await api.request("GET", resources.NODES.path()))["items"]
    daemonsets = (
        await api.request("GET", resources.DAEMONSETS.path(), query={"labelSelector": labels.ROLE})
    )["items"]
    return [module_row(item, nodes, daemonsets) for item in listing.get("items", ())]


async def _rows(api: client.Client, namespace: str | None, wait: float) -> list[list[str]]:
    """The table; with ``wait`` > 0, once every Module is Ready (or the wait ends)."""

    async def ready(rows: list[list[str]]) -> bool:
        return bool(rows) and all(row[2].startswith("True") for row in rows)

    async with api:
        return await tables.settle(lambda: modules_table(api, namespace), ready, wait)


def modules(
    kubeconfig: clients.KubeconfigOption = None,
    context: clients.ContextOption = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Only this namespace.")
    ] = None,
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for every Module to be Ready first.")
    ] = 0.0,
) -> None:
    """Modules, their Ready condition, the nodes where each module is loaded, and per kernel
    whether its image exists, is building or signing, or failed."""
    api = clients.api_client(kubeconfig, context)
    rows = tables.fetched(_rows(api, namespace, wait))
    tables.show(COLUMNS, rows)


def register(app: typer.Typer) -> None:
    app.command("modules")(modules)
