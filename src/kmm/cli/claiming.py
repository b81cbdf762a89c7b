"""``kmm claims``: ResourceClaims, where each was allocated and who holds it.

One row per claim: its namespace and name, its state (``pending``,
``allocated``, ``allocated,reserved``; ``deleting`` when its deletion is
pending), the node its devices are on (the allocation's node selector, as the
scheduler wrote it), each allocated device as ``driver/pool/device``, and the
pods it is reserved for. ``--wait`` waits until every claim listed is
reserved for pods that are Running (their devices prepared on the node).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import typer

from kmm.cli import clients, tables
from kmm.kube import client, errors, resources

__all__ = ["claim_row", "claims", "register"]


def _node(allocation: Mapping[str, Any]) -> str:
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or ()
    for term in terms:
        for field in term.get("matchFields") or ():
            if field.get("key") == "metadata.name" and field.get("values"):
                return ",".join(field["values"])
    return "-" if not terms else "(selector)"


def claim_row(claim: Mapping[str, Any]) -> list[str]:
    meta, status = claim["metadata"], claim.get("status") or {}
    allocation = status.get("allocation")
    reserved = [r.get("name", "?") for r in status.get("reservedFor") or ()]
    state = "allocated" if allocation else "pending"
    if reserved:
        state += ",reserved"
    if meta.get("deletionTimestamp"):
        state = "deleting"
    devices = [
        f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}"
        for r in ((allocation or {}).get("devices") or {}).get("results") or ()
    ]
    return [
        meta.get("namespace", ""),
        meta["name"],
        state,
        _node(allocation or {}),
        ", ".join(devices) or "-",
        ", ".join(reserved) or "-",
    ]


async def _settled(api: client.Client, items: list[dict[str, Any]]) -> bool:
    """Every claim reserved, and every pod holding one Running."""
    for claim in items:
        reserved = (claim.get("status") or {}).get("reservedFor") or ()
        if not reserved:
            return False
        for holder in reserved:
            if holder.get("resource") != "pods":
                continue
            try:
                pod = await api.request(
                    "GET", resources.PODS.path(claim["metadata"]["namespace"], holder["name"])
                )
            except errors.NotFound:
                return False
            if (pod.get("status") or {}).get("phase") != "Running":
                return False
    return bool(items)


async def _rows(api: client.Client, namespace: str | None, wait: float) -> list[list[str]]:
    async def fetch() -> list[dict[str, Any]]:
        listing = await api.request("GET", resources.RESOURCE_CLAIMS.path(namespace))
        return list(listing.get("items", ()))

    async with api:
        items = await tables.settle(fetch, lambda found: _settled(api, found), wait)
    return [claim_row(c) for c in items]


def claims(
    kubeconfig: clients.KubeconfigOption = None,
    context: clients.ContextOption = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Only this namespace.")
    ] = None,
    wait: Annotated[
        float,
        typer.Option(help="Seconds to wait for every claim's pods to be Running first."),
    ] = 0.0,
) -> None:
    """ResourceClaims: their state, the node and devices allocated, the pods holding them."""
    api = clients.api_client(kubeconfig, context)
    rows = tables.fetched(_rows(api, namespace, wait))
    tables.show(("NAMESPACE", "NAME", "STATE", "NODE", "DEVICES", "RESERVED FOR"), rows)


def register(app: typer.Typer) -> None:
    app.command("claims")(claims)
