"""Where the plugin finds the ResourceClaims the kubelet asks it to prepare.

``ClaimCache`` is an informer (a ``kube.reflecting.Reflector`` into a dict):
it lists ResourceClaims, then watches them, keeping the latest version of
each by namespace/name. ``get`` answers
from the cache and GETs from the API server only on a miss - the claim is
not cached yet, has another UID than the kubelet asked for, or is not yet
allocated in our copy (the kubelet may ask right after the scheduler's
write, before our watch has delivered it). Go's kubeletplugin helper GETs
every claim on every call; a warm cache here makes zero API calls.

Misses share one token bucket (``lookups``: 10 a second, 20 at once, by
default), and the misses of one kubelet call share one ``LookupBudget`` of
waiting (the plugin gives each call one second): a miss that would wait past
it is answered at once with a ``ClaimError`` the kubelet retries. So a call
naming thousands of claims nobody has seen costs the API server at most
burst + rate x budget GETs and the kubelet a bounded wait (the plugin looks
claims up one at a time, before it takes its lock).

``StaticClaims`` is the in-memory implementation for tests and for users'
own tests; both satisfy the ``ClaimSource`` protocol the plugin uses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Iterable
from typing import Protocol

from kmm.aio import backoff, ratelimits, tasks
from kmm.kube import client, listwatch, objects, reflecting, resources
from kmm.kube import errors as kube_errors
from kmm.kubeletplugin import claims, errors

__all__ = ["ClaimCache", "ClaimSource", "LookupBudget", "StaticClaims"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class LookupBudget:
    """How long the lookups of one kubelet call may still wait for API tokens, in all."""

    seconds: float


class ClaimSource(Protocol):
    """Finds a claim by the kubelet's reference."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def get(
        self, ref: claims.ClaimRef, *, budget: LookupBudget | None = None
    ) -> claims.ResourceClaim:
        """The claim, or ``ClaimNotFoundError`` if it is gone or has another UID;
        a lookup the API server is asked for waits no longer than ``budget``."""
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

    async def get(
        self, ref: claims.ClaimRef, *, budget: LookupBudget | None = None
    ) -> claims.ResourceClaim:
        self.gets += 1
        claim = self._claims.get((ref.namespace, ref.name))
        if claim is None or claims.ref_of(claim).uid != ref.uid:
            raise errors.ClaimNotFoundError(
                f"claim {ref.namespace}/{ref.name} ({ref.uid}) not found"
            )
        return claim


def _rv(claim: claims.ResourceClaim) -> int:
    try:
        return int(objects.resource_version(claim) or "0")
    except ValueError:
        return 0


class ClaimCache:
    """A list+watch cache of every ResourceClaim, with GET on a miss."""

    def __init__(
        self,
        api: client.Client,
        *,
        on_error: tasks.ErrorHandler,
        delays: backoff.Backoff | None = None,
        lookups: ratelimits.TokenBucket | None = None,
    ) -> None:
        self._api = api
        self._on_error = on_error
        self._lookups = lookups or ratelimits.TokenBucket(rate=10.0, burst=20)
        self._claims: dict[tuple[str, str], claims.ResourceClaim] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.misses = 0
        self.reflector = reflecting.Reflector(
            "resourceclaims",
            listwatch.ApiListWatch(api, resources.RESOURCE_CLAIMS),
            self,
            # Below the HTTP client's own timeouts, so the server ends the watch first.
            watch_timeout=240,
            delays=delays or backoff.Backoff(initial=0.5, maximum=30.0),
            on_retry=lambda err: self._on_error(
                errors.RecoverableError(str(err)), "claim informer"
            ),
        )

    @property
    def synced(self) -> asyncio.Event:
        """Set once the first list has filled the cache."""
        return self._synced

    async def start(self) -> None:
        if self._task is None:
            self._task = tasks.guard(
                self.reflector.run(), name="claim-informer", on_error=self._on_error
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        await tasks.cancel(task)

    def cached(self, namespace: str, name: str) -> claims.ResourceClaim | None:
        return self._claims.get((namespace, name))

    async def get(
        self, ref: claims.ClaimRef, *, budget: LookupBudget | None = None
    ) -> claims.ResourceClaim:
        claim = self._claims.get((ref.namespace, ref.name))
        if claim is not None and claims.ref_of(claim).uid == ref.uid and claims.is_allocated(claim):
            return claim
        self.misses += 1
        wait = self._lookups.reserve(max_wait=math.inf if budget is None else budget.seconds)
        if wait is None:
            raise errors.ClaimError(
                f"claim {ref.namespace}/{ref.name} ({ref.uid}) is not in the cache, and lookups"
                f" are throttled (at most {self._lookups.rate:g} a second): retry later"
            )
        if budget is not None:
            budget.seconds -= wait
        if wait > 0:
            await self._lookups.sleep(wait)
        try:
            fresh: claims.ResourceClaim = await self._api.request(
                "GET", resources.RESOURCE_CLAIMS.path(ref.namespace, ref.name)
            )
        except kube_errors.NotFound as err:
            raise errors.ClaimNotFoundError(f"claim {ref.namespace}/{ref.name} not found") from err
        except kube_errors.ApiError as err:
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

    # -- the reflector's sink ---------------------------------------------

    def replace(self, items: list[objects.RawObject], resource_version: str) -> None:
        self._claims = {}
        for item in items:
            self._store(item)  # type: ignore[arg-type]
        self._synced.set()

    def apply(self, event: listwatch.WatchEvent) -> None:
        obj = event["object"]
        if event["type"] in ("ADDED", "MODIFIED"):
            self._store(obj)  # type: ignore[arg-type]
        elif event["type"] == "DELETED":
            ref = claims.ref_of(obj)  # type: ignore[arg-type]
            current = self._claims.get((ref.namespace, ref.name))
            if current is not None and claims.ref_of(current).uid == ref.uid:
                del self._claims[ref.namespace, ref.name]
