"""``kmm apply -f FILE|-``: server-side apply of multi-document YAML, like kubectl's.

Each document is sent as a server-side apply patch (field manager ``kmm``,
conflicts forced) to the path found by discovery of its ``apiVersion``, so
any kind the API server serves works (CRDs included, once established).
Documents are applied in file order; a CRD followed by its objects needs the
objects retried until the CRD serves (``wait_for_kinds``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from kmm.cli import clients
from kmm.kube import client, errors, resources

__all__ = [
    "ApplyError",
    "apply",
    "apply_documents",
    "load_documents",
    "register",
]

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


class _Discovery:
    """apiVersion + kind -> (plural, namespaced), one GET per apiVersion."""

    def __init__(self, api: client.Client) -> None:
        self.api = api
        self._groups: dict[str, dict[str, tuple[str, bool]]] = {}

    async def resource(self, api_version: str, kind: str) -> tuple[str, bool] | None:
        known = self._groups.get(api_version)
        if known is None or kind not in known:
            try:
                body = await self.api.request("GET", resources.base_path(api_version))
            except errors.NotFound:
                return None
            except errors.ApiError as err:
                raise ApplyError(f"discovery of {api_version}: {err.message}") from err
            known = {
                entry["kind"]: (entry["name"], bool(entry.get("namespaced")))
                for entry in body.get("resources", ())
                if "/" not in entry["name"]
            }
            self._groups[api_version] = known
        return known.get(kind)


async def apply_documents(
    api: client.Client,
    docs: Iterable[Obj],
    *,
    namespace: str | None = None,
    wait_for_kinds: float = 30.0,
    dry_run: bool = False,
    warn: Callable[[str], None] | None = None,
) -> list[str]:
    """Apply each document; return one ``kind/name created|configured`` line each.

    The API server's warnings for a document (an admission policy's Warn
    action names a field that has no effect, say) go to ``warn`` as they
    come, prefixed with the document's ``kind/name``. With ``dry_run`` the API server validates and admits each document
    (schema, admission) and persists nothing. Documents without a namespace
    go to ``namespace``, else to the kubeconfig context's (as with kubectl).
    """
    namespace = namespace or api.namespace
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
        scope = f"/namespaces/{ns}" if ns else ""
        try:
            reply = await api.send(
                "PATCH",
                f"{resources.base_path(api_version)}{scope}/{plural}/{name}",
                body=doc,
                query={
                    "fieldManager": FIELD_MANAGER,
                    "force": True,
                    "dryRun": "All" if dry_run else None,
                },
                content_type=client.APPLY_PATCH,
            )
        except errors.ApiError as err:
            raise ApplyError(f"{kind}/{name}: {err.message or err}") from err
        if warn is not None:
            for text in reply.warnings:
                warn(f"{kind.lower()}/{name}: {text}")
        verb = "created" if reply.status == 201 else "configured"
        lines.append(f"{kind.lower()}/{name} {verb}{' (dry run)' if dry_run else ''}")
    return lines


def _warn(text: str) -> None:
    # On stderr with kubectl's prefix, so scripts reading stdout see only results.
    typer.echo(f"Warning: {text}", err=True)


async def _apply(api: client.Client, text: str, namespace: str | None, dry_run: bool) -> list[str]:
    async with api:
        return await apply_documents(
            api, load_documents(text), namespace=namespace, dry_run=dry_run, warn=_warn
        )


def apply(
    filename: Annotated[
        list[str], typer.Option("--filename", "-f", help="YAML file, or - for stdin; repeatable.")
    ],
    kubeconfig: clients.KubeconfigOption = None,
    context: clients.ContextOption = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            "-n",
            help="Namespace for documents without one; default: the context's, else default.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate and admit on the server; persist nothing.")
    ] = False,
) -> None:
    """Server-side apply every document of a YAML file (field manager "kmm").

    The API server's warnings (an admission policy naming a field with no
    effect, say) are printed on stderr as "Warning: kind/name: text".
    """
    text = "\n---\n".join(
        sys.stdin.read() if name == "-" else Path(name).read_text() for name in filename
    )
    api = clients.api_client(kubeconfig, context)
    try:
        lines = asyncio.run(_apply(api, text, namespace, dry_run))
    except (ApplyError, errors.KubeError, yaml.YAMLError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    for line in lines:
        typer.echo(line)


def register(app: typer.Typer) -> None:
    app.command("apply")(apply)
