"""Which addresses the probe and metrics server answers on.

The operator's default (host ``""``) must answer on IPv6 as well as IPv4: a
kubelet on an IPv6 or dual-stack cluster probes the pod's IPv6 address.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

from kmm.aio import httpserving
from kmm.operator import running

ROUTES: httpserving.Routes = {"/healthz": lambda: (200, b"ok\n", "text/plain")}


async def _status(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status


@pytest.fixture
async def serving(request: pytest.FixtureRequest) -> AsyncIterator[httpserving.Server]:
    server = httpserving.Server("test", request.param, 0, ROUTES)
    stop = asyncio.Event()
    task = asyncio.ensure_future(server.run(stop))
    try:
        await asyncio.wait_for(server.bound.wait(), 10)
        yield server
    finally:
        stop.set()
        await task


@pytest.mark.parametrize("serving", [running.Settings("id", None).host], indirect=True)
async def test_the_operators_default_answers_on_ipv6_and_ipv4(
    serving: httpserving.Server,
) -> None:
    assert socket.has_ipv6
    assert await _status(f"http://[::1]:{serving.port}/healthz") == 200
    assert await _status(f"http://127.0.0.1:{serving.port}/healthz") == 200


@pytest.mark.parametrize("serving", ["127.0.0.1"], indirect=True)
async def test_an_explicit_ipv4_address_is_that_address_only(
    serving: httpserving.Server,
) -> None:
    assert await _status(f"http://127.0.0.1:{serving.port}/healthz") == 200
    with pytest.raises(aiohttp.ClientConnectorError):
        await _status(f"http://[::1]:{serving.port}/healthz")


@pytest.mark.parametrize("serving", ["::1"], indirect=True)
async def test_an_explicit_ipv6_address_is_served(serving: httpserving.Server) -> None:
    assert await _status(f"http://[::1]:{serving.port}/healthz") == 200
