"""What the API server serves: discovery of one API version, and the two
questions the operator asks at start (``wiring.Operator.run``): DRA's
resource.k8s.io/v1 DeviceClasses and ResourceClaims, and PreflightValidations.

Each is retried with backoff until the server answers or the operator stops:
a server still starting must not read as one without the API (the watch on
an absent resource would fail forever, and one on a present resource never
started would leave Modules waiting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from kmm.aio import backoff
from kmm.api import preflight
from kmm.kube import client, errors, resources

__all__ = ["serves", "serves_preflight", "serves_resource_api"]

_log = logging.getLogger(__name__)

_DRA_RESOURCES = frozenset({resources.DEVICE_CLASSES.plural, resources.RESOURCE_CLAIMS.plural})


async def serves(api: client.Client, api_version: str, stop: asyncio.Event) -> set[str]:
    """The resources the cluster serves in ``api_version`` (discovery; none
    when it serves no such version). Retried until it answers or ``stop`` is set."""
    delay = backoff.Backoff(initial=0.5, maximum=10.0)
    while not stop.is_set():
        try:
            found = await api.request("GET", resources.base_path(api_version))
        except errors.NotFound:
            return set()
        except errors.ApiError as err:
            if not err.retriable and err.status != 0:
                raise
            _log.warning("discovery of %s failed, retrying: %s", api_version, err)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay.next())
            continue
        return {str(r.get("name")) for r in (found or {}).get("resources") or ()}
    return set()


async def serves_resource_api(api: client.Client, stop: asyncio.Event) -> bool:
    """Whether the cluster serves resource.k8s.io/v1 DeviceClasses and
    ResourceClaims (discovery). Retried until it answers or ``stop`` is set."""
    return await serves(api, resources.DEVICE_CLASSES.api_version, stop) >= _DRA_RESOURCES


async def serves_preflight(api: client.Client, stop: asyncio.Event) -> bool:
    """Whether the cluster serves PreflightValidations (its CRD installed)."""
    return preflight.PLURAL in await serves(api, preflight.API_VERSION, stop)
