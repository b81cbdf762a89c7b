"""Where the plugin finds the ResourceClaims the kubelet asks it to prepare.

``ClaimCache`` is an informer: it lists ResourceClaims once, then watches
them, keeping the latest version of each by namespace/name. ``get`` answers
from the cache and GETs from the API server only on a miss - the claim is
not cached yet, has another UID than the kubelet asked for, or is not yet
allocated in our copy (the kubelet may ask right after the scheduler's
write, before our watch has delivered it). Go's kubeletplugin helper GETs
every claim on every call; a warm cache here makes zero API calls.

``StaticClaims`` is the in-memory implementation for tests and for users'
own tests; both satisfy the ``ClaimSource`` protocol the plugin uses.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from kmm.kubeletplugin import claims, errors, kubeapi, tasks

__all__ = ["ClaimCache", "ClaimSource", "StaticClaims"]

logger = logging.getLogger(__name__)

_CLAIMS = f"{kubeapi.RESOURCE_API}/resourceclaims"


class ClaimSource(Protocol):
    """Finds a claim by the kubelet's reference."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def get(self, ref: claims.ClaimRef) -> claims.ResourceClaim:
        """The claim, or ``ClaimNotFoundError`` if it is gone or has another UID."""
        ...


class StaticClaims:
    """A fixed, in-memory set of claims; ``gets`` counts lookups."""

    def __init__(self, initial: Iterable[claims.ResourceClaim] = ()) -> None:
        self._claims: dict[tuple[str, str], claims.ResourceClaim] = {}
        self.gets = 0
        for claim in initial:
            self.put(claim)

    def put(self, claim: claims.ResourceClaim) -> None:
        ref = claims.ref_of(claim)
        self._claims[ref.namespace, ref.name] = claim

    def delete(self, namespace: str, name: str) -> None:
        self._claims.pop((namespace, name), None)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def get(self, ref: claims.ClaimRef) -> claims.ResourceClaim:
        self.gets += 1
        claim = self._claims.get((ref.namespace, ref.name))
        if claim is None or claims.ref_of(claim).uid != ref.uid:
            raise errors.ClaimNotFoundError(
                f"claim {ref.namespace}/{ref.name} ({ref.uid}) not found"
            )
        return claim


def _rv(claim: claims.ResourceClaim) -> int:
    try:
        return int(claim.get("metadata", {}).get("resourceVersion", "0"))
    except ValueError:
        return 0


class ClaimCache:
    """A list+watch cache of every ResourceClaim, with GET on a miss."""

    def __init__(
        self,
        api: kubeapi.KubeAPI,
        *,
        on_error: Callable[[BaseException, str], None],
        backoff: Callable[[int], float] | None = None,
    ) -> None:
        self._api = api
        self._on_error = on_error
        self._backoff = backoff or _default_backoff
        self._claims: dict[tuple[str, str], claims.ResourceClaim] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.misses = 0

    @property
    def synced(self) -> asyncio.Event:
        """Set once the first list has filled the cache."""
        return self._synced

    async def start(self) -> None:
        if self._task is None:
            self._task = tasks.guard(self._run(), name="claim-informer", on_error=self._on_error)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await tasks.cancel(task)

    def cached(self, namespace: str, name: str) -> claims.ResourceClaim | None:
        return self._claims.get((namespace, name))

    async def get(self, ref: claims.ClaimRef) -> claims.ResourceClaim:
        claim = self._claims.get((ref.namespace, ref.name))
        if claim is not None and claims.ref_of(claim).uid == ref.uid and claims.is_allocated(claim):
            return claim
        self.misses += 1
        path = f"{kubeapi.RESOURCE_API}/namespaces/{ref.namespace}/resourceclaims/{ref.name}"
        try:
            fresh: claims.ResourceClaim = await self._api.request("GET", path)
        except errors.KubeAPIError as err:
            if err.status == 404:
                raise errors.ClaimNotFoundError(
                    f"claim {ref.namespace}/{ref.name} not found"
                ) from err
            raise errors.ClaimError(f"cannot get claim {ref.namespace}/{ref.name}: {err}") from err
        self._store(fresh)
        if claims.ref_of(fresh).uid != ref.uid:
            raise errors.ClaimNotFoundError(
                f"claim {ref.namespace}/{ref.name} has UID {claims.ref_of(fresh).uid}, not {ref.uid}"
            )
        return fresh

    def _store(self, claim: claims.ResourceClaim) -> None:
        ref = claims.ref_of(claim)
        key = (ref.namespace, ref.name)
        old = self._claims.get(key)
        # A GET may race the watch; keep whichever copy is newer.
        if old is None or claims.ref_of(old).uid != ref.uid or _rv(claim) >= _rv(old):
            self._claims[key] = claim

    async def _run(self) -> None:
        attempt = 0
        while True:
            try:
                version = await self._list()
                attempt = 0
                await self._watch(version)
            except errors.KubeAPIError as err:
                if not err.retriable and err.status != 410:
                    raise
                self._on_error(errors.RecoverableError(str(err)), "claim informer")
                attempt += 1
                await asyncio.sleep(self._backoff(attempt))

    async def _list(self) -> str:
        listing: dict[str, Any] = await self._api.request("GET", _CLAIMS)
        items: list[claims.ResourceClaim] = listing.get("items", [])
        self._claims = {}
        for item in items:
            self._store(item)
        self._synced.set()
        return str(listing.get("metadata", {}).get("resourceVersion", ""))

    async def _watch(self, version: str) -> None:
        while True:
            # Below the HTTP client's own timeouts, so the server ends the watch first.
            query = {"resourceVersion": version, "timeoutSeconds": "240"}
            async for event in self._api.watch(_CLAIMS, query=query):
                kind = event.get("type")
                obj = event.get("object", {})
                if kind == "ERROR":
                    raise errors.KubeAPIError(int(obj.get("code", 0)), str(obj.get("message")))
                version = str(obj.get("metadata", {}).get("resourceVersion", version))
                if kind in ("ADDED", "MODIFIED"):
                    self._store(obj)
                elif kind == "DELETED":
                    ref = claims.ref_of(obj)
                    current = self._claims.get((ref.namespace, ref.name))
                    if current is not None and claims.ref_of(current).uid == ref.uid:
                        del self._claims[ref.namespace, ref.name]


def _default_backoff(attempt: int) -> float:
    return float(min(30.0, 0.5 * 2 ** min(attempt, 6)) * (0.5 + random.random() / 2))
