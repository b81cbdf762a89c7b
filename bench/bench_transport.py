"""The HTTP transport under ``kmm.kube``, chosen by measurement: candidates side by side.

Run: ``.venv/bin/pip install 'httpx[http2]'`` (httpx is a candidate, not a
dependency), then ``.venv/bin/python bench/bench_transport.py [--kubeconfig PATH]
[--requests N] [--concurrency C] [--rounds R]``. Without ``--kubeconfig`` a
sandbox is started in a temporary directory (and stopped at the end).

For each candidate: the memory its import adds to an interpreter that has
already imported ``asyncio`` and ``ssl`` (a child process each), and the
rate of GETs (a small object) and LISTs (every Node) it sustains against the
same API server with ``C`` requests in flight, rounds alternating between
candidates so a noisy machine hurts all alike. Printed as requests per second
and as a ratio to the first candidate; every GET decodes its JSON answer.
``kmm.kube on aiohttp`` is the layer as chosen, to show what it costs over
the bare transport.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pathlib
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import yaml

IMPORTS = {
    "aiohttp": "import aiohttp",
    "kmm.kube on aiohttp": "import kmm.kube.client",
    "httpx (HTTP/1.1)": "import httpx",
    "httpx (HTTP/2)": "import httpx, h2.connection",
    "kubernetes_asyncio": "import kubernetes_asyncio.client, kubernetes_asyncio.config",
}

_RSS = (
    "def rss():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmRSS'):\n"
    "            return int(line.split()[1])\n"
)


def import_mib(statement: str) -> float:
    code = f"{_RSS}import asyncio, ssl\nbase = rss()\n{statement}\nprint((rss() - base) / 1024)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return float(out.stdout)


class Access:
    """Server, TLS context and paths read from a kubeconfig with certificate files."""

    def __init__(self, kubeconfig: pathlib.Path) -> None:
        document = yaml.safe_load(kubeconfig.read_text())
        cluster = document["clusters"][0]["cluster"]
        user = document["users"][0]["user"]
        self.server: str = cluster["server"]
        self.ca: str = cluster["certificate-authority"]
        self.cert: str = user["client-certificate"]
        self.key: str = user["client-key"]

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca)
        context.load_cert_chain(self.cert, self.key)
        return context


# One GET of a path, its JSON answer decoded.
Get = Callable[[str], Awaitable[Any]]


@contextlib.asynccontextmanager
async def aiohttp_get(access: Access, concurrency: int) -> AsyncIterator[Get]:
    import aiohttp

    connector = aiohttp.TCPConnector(ssl=access.ssl_context(), limit=concurrency)
    async with aiohttp.ClientSession(access.server, connector=connector) as session:

        async def get(path: str) -> Any:
            async with session.get(path) as response:
                return json.loads(await response.read())

        yield get


@contextlib.asynccontextmanager
async def httpx_get(access: Access, concurrency: int, *, http2: bool) -> AsyncIterator[Get]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=access.server, verify=access.ssl_context(), http2=http2, limits=limits
    ) as session:

        async def get(path: str) -> Any:
            response = await session.get(path)
            return json.loads(response.content)

        yield get


@contextlib.asynccontextmanager
async def kubernetes_asyncio_get(access: Access, concurrency: int) -> AsyncIterator[Get]:
    from kubernetes_asyncio import client

    configuration = client.Configuration()
    configuration.host = access.server
    configuration.ssl_ca_cert = access.ca
    configuration.cert_file = access.cert
    configuration.key_file = access.key
    configuration.connection_pool_maxsize = concurrency
    async with client.ApiClient(configuration) as api:

        async def get(path: str) -> Any:
            response = await api.call_api(path, "GET", _preload_content=False)
            body: bytes = await response.read()
            response.release()
            return json.loads(body)

        yield get


@contextlib.asynccontextmanager
async def kmm_get(access: Access, concurrency: int) -> AsyncIterator[Get]:
    from kmm.kube import client, kubeconfigs

    found = kubeconfigs.Access(
        server=access.server,
        source="bench",
        ca_file=pathlib.Path(access.ca),
        client_cert_file=pathlib.Path(access.cert),
        client_key_file=pathlib.Path(access.key),
    )
    async with client.Client(found, requests_in_flight=concurrency) as api:

        async def get(path: str) -> Any:
            return await api.request("GET", path)

        yield get


CANDIDATES: dict[str, Callable[[Access, int], contextlib.AbstractAsyncContextManager[Get]]] = {
    "aiohttp": aiohttp_get,
    "kmm.kube on aiohttp": kmm_get,
    "httpx (HTTP/1.1)": lambda a, c: httpx_get(a, c, http2=False),
    "httpx (HTTP/2)": lambda a, c: httpx_get(a, c, http2=True),
    "kubernetes_asyncio": kubernetes_asyncio_get,
}


async def rate(get: Get, path: str, requests: int, concurrency: int) -> float:
    """Requests per second for ``requests`` GETs of ``path``, ``concurrency`` at a time."""
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await get(path)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests / (time.perf_counter() - start)


async def measure(access: Access, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    found: dict[str, dict[str, list[float]]] = {
        name: {"get": [], "list": []} for name in CANDIDATES
    }
    names = list(CANDIDATES)
    for round_ in range(args.rounds):
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            async with CANDIDATES[name](access, args.concurrency) as get:
                await rate(get, "/api/v1/namespaces/default", 50, args.concurrency)  # warm up
                found[name]["get"].append(
                    await rate(get, "/api/v1/namespaces/default", args.requests, args.concurrency)
                )
                found[name]["list"].append(
                    await rate(get, "/api/v1/nodes", args.requests // 10, args.concurrency)
                )
    return found


@contextlib.contextmanager
def sandbox(kubeconfig: pathlib.Path | None, nodes: int) -> Any:
    if kubeconfig is not None:
        yield kubeconfig
        return
    with tempfile.TemporaryDirectory() as directory:
        kmm = pathlib.Path(sys.executable).parent / "kmm"
        subprocess.run(
            [str(kmm), "sandbox", "up", "--dir", directory, "--nodes", str(nodes)], check=True
        )
        try:
            yield pathlib.Path(directory) / "kubeconfig"
        finally:
            subprocess.run([str(kmm), "sandbox", "down", "--dir", directory], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=pathlib.Path)
    parser.add_argument("--nodes", type=int, default=100, help="nodes of a sandbox started here")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    memory = {name: import_mib(statement) for name, statement in IMPORTS.items()}
    with sandbox(args.kubeconfig, args.nodes) as kubeconfig:
        found = asyncio.run(measure(Access(kubeconfig), args))
    first = next(iter(CANDIDATES))
    base_get = statistics.median(found[first]["get"])
    base_list = statistics.median(found[first]["list"])
    print(
        f"{'transport':20} {'import MiB':>10} {'GET/s':>8} {'ratio':>6} {'LIST/s':>8} {'ratio':>6}"
    )
    for name in CANDIDATES:
        get = statistics.median(found[name]["get"])
        listed = statistics.median(found[name]["list"])
        print(
            f"{name:20} {memory[name]:10.1f} {get:8.0f} {get / base_get:6.2f} "
            f"{listed:8.0f} {listed / base_list:6.2f}"
        )


if __name__ == "__main__":
    main()
