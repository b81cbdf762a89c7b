"""Liveness, readiness and metrics over HTTP (a runnable for the manager).

``/healthz`` answers 200 while the process serves; ``/readyz`` 200 once the
caches have synced (a replica waiting for the lease is ready: it is warm and
can take over); ``/metrics`` the Prometheus text format. One server per port:
with ``--metrics-port`` equal to ``--health-port`` all three share it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web

__all__ = ["Routes", "Server"]

_log = logging.getLogger(__name__)

Routes = dict[str, Callable[[], tuple[int, bytes, str]]]


class Server:
    """Serves ``routes`` on ``host:port`` until stopped."""

    def __init__(self, name: str, host: str, port: int, routes: Routes) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.routes = routes
        self.bound = asyncio.Event()

    async def _handle(self, request: web.Request) -> web.Response:
        route = self.routes.get(request.path)
        if route is None:
            return web.Response(status=404, text="not found\n")
        status, body, content_type = route()
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})

    async def run(self, stop: asyncio.Event) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
            if self.port == 0:  # tests: learn the port the OS chose
                server = site._server
                sockets = getattr(server, "sockets", None) or ()
                if sockets:
                    self.port = sockets[0].getsockname()[1]
            self.bound.set()
            _log.info(
                "%s: serving %s on %s:%d", self.name, sorted(self.routes), self.host, self.port
            )
            await stop.wait()
        finally:
            await runner.cleanup()
