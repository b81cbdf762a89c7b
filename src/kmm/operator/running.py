"""The operator process: API client in, Operator + HTTP endpoints, until stopped.

``run`` exposes the client's write counts as ``kmm_api_writes_total``, serves ``/healthz`` ``/readyz`` ``/metrics``, and
runs the manager. ``/readyz`` is 200 once the caches synced and while the API
server answers (``kube.client.Client.answering``): during an API server
outage the operator's retries fail and it reports not ready until one of
them is answered again. It returns when ``stop`` is set and raises
``runtime.manager.LeadershipLost`` when the lease is lost (the process should
exit and be restarted, as client-go's do).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from pathlib import Path

from kmm.aio import httpserving, tasks
from kmm.kube import client
from kmm.operator import metrics, wiring
from kmm.operator.build import settings as build_settings

__all__ = ["Settings", "run"]

_TEXT = "text/plain; charset=utf-8"


@dataclasses.dataclass(frozen=True)
class Settings:
    identity: str
    election: wiring.Election | None
    metrics_port: int = 8080
    health_port: int = 8081
    # "": every address, IPv6 and IPv4 (httpserving).
    host: str = ""
    workers: int = 4
    resync_period: float = wiring.DEFAULT_RESYNC_PERIOD
    # Extra CAs for the operator's registry requests (--registry-ca, checked
    # at start): image existence checks before build and sign.
    registry_ca_files: tuple[Path, ...] = ()
    # --registry-endpoint HOST=ENDPOINT: dial ENDPOINT for registry HOST.
    registry_endpoints: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Build and sign pods: the builder image, how long a succeeded pod is
    # kept, how often a failed one's inputs are looked at.
    builder_image: str = build_settings.DEFAULT_BUILDER_IMAGE
    # --driver-toolkit-image: DTK_AUTO's template ("": none).
    driver_toolkit_image: str = ""
    build_pod_retention: float = 0.0
    build_input_poll: float = build_settings.DEFAULT_POLL
    # --no-device-taints: no DeviceTaintRule is read or written.
    device_taints: bool = True


async def run(api: client.Client, settings: Settings, stop: asyncio.Event) -> None:
    holder: list[wiring.Operator] = []
    registry = metrics.OperatorMetrics(
        api.counter,
        leading=lambda: bool(holder) and holder[0].leading(),
        cached=lambda: holder[0].cached() if holder else {},
        relists=lambda: holder[0].relists() if holder else {},
        registry_counts=lambda: holder[0].registry_requests() if holder else (0, {}),
    )
    operator = wiring.Operator(
        api,
        election=settings.election,
        metrics=registry.controllers,
        workers=settings.workers,
        instance=settings.identity,
        resync_period=settings.resync_period,
        handler_errors=registry,
        build=build_settings.Settings(
            builder_image=settings.builder_image,
            driver_toolkit_image=settings.driver_toolkit_image,
            registry_ca=build_settings.registry_ca_bundle(settings.registry_ca_files),
            retention=settings.build_pod_retention,
            poll=settings.build_input_poll,
        ),
        registry_ca_files=settings.registry_ca_files,
        registry_endpoints=settings.registry_endpoints,
        device_taints=settings.device_taints,
    )
    holder.append(operator)

    def healthz() -> tuple[int, bytes, str]:
        return 200, b"ok\n", _TEXT

    def readyz() -> tuple[int, bytes, str]:
        if not operator.manager.ready():
            return 503, b"caches not synced\n", _TEXT
        if not api.answering:
            return 503, b"the API server does not answer\n", _TEXT
        return 200, b"ok\n", _TEXT

    def scrape() -> tuple[int, bytes, str]:
        return 200, registry.render(), "text/plain; version=0.0.4; charset=utf-8"

    health: httpserving.Routes = {"/healthz": healthz, "/readyz": readyz}
    served: list[httpserving.Server] = []
    if settings.metrics_port == settings.health_port:
        served.append(
            httpserving.Server(
                "http", settings.host, settings.health_port, {**health, "/metrics": scrape}
            )
        )
    else:
        served.append(httpserving.Server("health", settings.host, settings.health_port, health))
        served.append(
            httpserving.Server(
                "metrics", settings.host, settings.metrics_port, {"/metrics": scrape}
            )
        )
    servers = tasks.TaskSet("operator")
    server_stop = asyncio.Event()
    try:
        for server in served:
            servers.spawn(server.run(server_stop), name=server.name)
        await operator.run(stop)
    finally:
        server_stop.set()
        pending = servers.tasks()
        if pending:
            await asyncio.wait(pending, timeout=5)
        await servers.close()
    servers.raise_failure()
