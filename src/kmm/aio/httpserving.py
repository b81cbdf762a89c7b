"""A small HTTP server of GET routes for probes and metrics, beside an event loop.

The operator serves ``/healthz``, ``/readyz`` and ``/metrics`` with it, the
kubelet emulator its ``/metrics``. The server is the standard library's
(``http.server``, already loaded by ``prometheus_client``), on a thread of
its own; each route runs on the event loop, so it reads the process's state
where the process writes it. A loop that is stuck therefore fails its probes
too, which is what a liveness probe is for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.server
import logging
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

__all__ = ["Routes", "Server"]

_log = logging.getLogger(__name__)

Routes = dict[str, Callable[[], tuple[int, bytes, str]]]

# A route waits this long for the event loop before the probe gets a 503.
_LOOP_TIMEOUT = 10.0


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
        server = http.server.ThreadingHTTPServer((self.host, self.port), _handler(self, loop))
        server.daemon_threads = True
        self.port = server.server_address[1]  # tests bind port 0: the one the OS chose
        thread = threading.Thread(
            target=server.serve_forever, name=f"http-{self.name}", daemon=True
        )
        thread.start()
        self.bound.set()
        _log.info("%s: serving %s on %s:%d", self.name, sorted(self.routes), self.host, self.port)
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
