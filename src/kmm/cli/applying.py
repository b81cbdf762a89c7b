"""``kmm apply -f FILE|-``: server-side apply of multi-document YAML, like kubectl's.

Each document is sent as a server-side apply patch (field manager ``kmm``,
conflicts forced) to the path found by discovery of its ``apiVersion``, so
any kind the API server serves works (CRDs included, once established).
Documents are applied in file order; a CRD followed by its objects needs the
objects retried until the CRD serves (``wait_for_kinds``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from kmm.cli import clients

__all__ = ["ApplyError", "apply", "apply_documents", "load_documents"]

FIELD_MANAGER = "kmm"

Obj = dict[str, Any]


class ApplyError(Exception):
    """A document the API server refused, or whose kind it does not serve."""


def load_documents(text: str) -> list[Obj]:
    """The non-empty YAML documents of ``text``; a ``List`` is flattened."""
    found: list[Obj] = []
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        if not isinstance(doc, dict):
            raise ApplyError(f"not an object: {doc!r:.80}")
        if doc.get("kind", "").endswith("List") and isinstance(doc.get("items"), list):
            found.extend(doc["items"])
        else:
            found.append(doc)
    return found


async def _call(
    api: k8s.ApiClient,
    method: str,
    path: str,
    *,
    body: Obj | None = None,
    query: list[tuple[str, str]] | None = None,
    content_type: str = "application/json",
) -> tuple[int, Obj]:
    response = await api.call_api(
        path,
        method,
        query_params=query or [],
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
    )
    try:
        data = await response.read()
        status: int = response.status
    finally:
        response.release()
    try:
        parsed: Obj = json.loads(data) if data else {}
    except ValueError:
        parsed = {"message": data[:300].decode("utf-8", "replace")}
    return status, parsed


class _Discovery:
    """apiVersion + kind -> (plural, namespaced), one GET per apiVersion."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api
        self._groups: dict[str, dict[str, tuple[str, bool]]] = {}

    async def resource(self, api_version: str, kind: str) -> tuple[str, bool] | None:
        known = self._groups.get(api_version)
        if known is None or kind not in known:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            status, body = await _call(self.api, "GET", base)
            if status == 404:
                return None
            if status != 200:
                raise ApplyError(f"discovery of {api_version}: {body.get('message')}")
            known = {
                entry["kind"]: (entry["name"], bool(entry.get("namespaced")))
                for entry in body.get("resources", ())
                if "/" not in entry["name"]
            }
            self._groups[api_version] = known
        return known.get(kind)


def _path(api_version: str, plural: str, namespace: str | None, name: str) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{scope}/{plural}/{name}"


async def apply_documents(
    api: k8s.ApiClient,
    docs: Iterable[Obj],
    *,
    namespace: str = "default",
    wait_for_kinds: float = 30.0,
    dry_run: bool = False,
) -> list[str]:
    """Apply each document; return one ``kind/name created|configured`` line each.

    With ``dry_run`` the API server validates and admits each document
    (schema, admission) and persists nothing.
    """
    discovery = _Discovery(api)
    lines = []
    for doc in docs:
        api_version, kind = doc.get("apiVersion"), doc.get("kind")
        name = (doc.get("metadata") or {}).get("name")
        if not (api_version and kind and name):
            raise ApplyError(f"a document needs apiVersion, kind and metadata.name: {doc!r:.120}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_for_kinds
        while (found := await discovery.resource(api_version, kind)) is None:
            if loop.time() > deadline:
                raise ApplyError(f"the API server does not serve {kind} in {api_version}")
            discovery = _Discovery(api)
            await asyncio.sleep(0.5)
        plural, namespaced = found
        ns = ((doc.get("metadata") or {}).get("namespace") or namespace) if namespaced else None
        if namespaced:
            doc = {**doc, "metadata": {**doc["metadata"], "namespace": ns}}
        status, body = await _call(
            api,
            "PATCH",
            _path(api_version, plural, ns, name),
            body=doc,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")]
            + ([("dryRun", "All")] if dry_run else []),
            content_type="application/apply-patch+yaml",
        )
        if not 200 <= status <= 299:
            raise ApplyError(f"{kind}/{name}: {body.get('message', status)}")
        verb = "created" if status == 201 else "configured"
        lines.append(f"{kind.lower()}/{name} {verb}{' (dry run)' if dry_run else ''}")
    return lines


async def _apply(kubeconfig: Path | None, text: str, namespace: str, dry_run: bool) -> list[str]:
    api = await clients.api_client(kubeconfig)
    async with api:
        return await apply_documents(
            api, load_documents(text), namespace=namespace, dry_run=dry_run
        )


def apply(
    filename: Annotated[
        list[str], typer.Option("--filename", "-f", help="YAML file, or - for stdin; repeatable.")
    ],
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig to use.")] = None,
    namespace: Annotated[
        str, typer.Option("--namespace", "-n", help="Namespace for documents without one.")
    ] = "default",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate and admit on the server; persist nothing.")
    ] = False,
) -> None:
    """Server-side apply every document of a YAML file (field manager "kmm")."""
    text = "\n---\n".join(
        sys.stdin.read() if name == "-" else Path(name).read_text() for name in filename
    )
    try:
        lines = asyncio.run(_apply(kubeconfig, text, namespace, dry_run))
    except (ApplyError, ApiException, yaml.YAMLError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    for line in lines:
        typer.echo(line)
