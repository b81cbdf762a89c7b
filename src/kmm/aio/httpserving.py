"""A small HTTP server of GET routes for probes and metrics, beside an event loop.

The operator serves ``/healthz``, ``/readyz`` and ``/metrics`` with it, the
kubelet emulator its ``/metrics``. The server is the standard library's
(``http.server``, already loaded by ``prometheus_client``), on a thread of
its own; each route runs on the event loop, so it reads the process's state
where the process writes it. A loop that is stuck therefore fails its probes
too, which is what a liveness probe is for.

Host ``""`` (the operator's default) is every address of both families: one
IPv6 socket on ``::`` that takes IPv4 too (IPV6_V6ONLY off), as Go's
``:8081`` does, so the kubelet's probes and a Prometheus scrape reach the
pod on an IPv6 or dual-stack cluster, whose probes dial the pod's IPv6
address, as well as on an IPv4 one. Where the network namespace has no IPv6,
``0.0.0.0``. An explicit address binds that address only, in its family.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.server
import logging
import socket
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

__all__ = ["Routes", "Server"]

_log = logging.getLogger(__name__)

Routes = dict[str, Callable[[], tuple[int, bytes, str]]]

# A route waits this long for the event loop before the probe gets a 503.
_LOOP_TIMEOUT = 10.0


class _IPv6Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


class _DualStackServer(_IPv6Server):
    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def _listen(
    host: str, port: int, handler: type[http.server.BaseHTTPRequestHandler]
) -> http.server.ThreadingHTTPServer:
    if host == "":
        try:
            return _DualStackServer(("::", port), handler)
        except OSError:  # no IPv6 in this network namespace (or kernel)
            return http.server.ThreadingHTTPServer(("0.0.0.0", port), handler)
    if ":" in host:
        return _IPv6Server((host, port), handler)
    return http.server.ThreadingHTTPServer((host, port), handler)


class Server:
    """Serves ``routes`` on ``host:port`` until stopped."""

    def __init__(self, name: str, host: str, port: int, routes: Routes) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.routes = routes
        self.bound = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        server = _listen(self.host, self.port, _handler(self, loop))
        server.daemon_threads = True
        self.port = server.server_address[1]  # tests bind port 0: the one the OS chose
        thread = threading.Thread(
            target=server.serve_forever, name=f"http-{self.name}", daemon=True
        )
        thread.start()
        self.bound.set()
        bound = str(server.server_address[0])
        _log.info(
            "%s: serving %s on %s:%d",
            self.name,
            sorted(self.routes),
            f"[{bound}]" if ":" in bound else bound,
            self.port,
        )
        try:
            await stop.wait()
        finally:
            await asyncio.to_thread(server.shutdown)
            server.server_close()
            thread.join()

    def answer(self, path: str) -> tuple[int, bytes, str]:
        """The route's answer for ``path``; run on the event loop."""
        route = self.routes.get(path)
        if route is None:
            return 404, b"not found\n", "text/plain; charset=utf-8"
        return route()


def _handler(
    server: Server, loop: asyncio.AbstractEventLoop
) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = urllib.parse.urlsplit(self.path).path
            answered: concurrent.futures.Future[tuple[int, bytes, str]] = (
                concurrent.futures.Future()
            )

            def on_loop() -> None:
                try:
                    answered.set_result(server.answer(path))
                except Exception as err:  # a route's bug: a 500, not a dead server
                    answered.set_exception(err)

            loop.call_soon_threadsafe(on_loop)
            try:
                status, body, content_type = answered.result(timeout=_LOOP_TIMEOUT)
            except concurrent.futures.TimeoutError:
                status, body, content_type = 503, b"event loop not responding\n", "text/plain"
            except Exception:
                _log.exception("%s: route %s failed", server.name, path)
                status, body, content_type = 500, b"internal error\n", "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # probes every few seconds: no access log

    return Handler
