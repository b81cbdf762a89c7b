"""Metrics rendering, the HTTP endpoints and JSON logs."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp

from kmm.aio import httpserving
from kmm.kube import counting
from kmm.operator import jsonlogs, metrics


def test_metrics_render_writes_leader_and_cache_sizes() -> None:
    counter = counting.RequestCounter()
    for _ in range(3):
        counter.record("PATCH", "/api/v1/nodes/n1")
    counter.record("GET", "/api/v1/nodes/n1")  # a read: not a write
    registry = metrics.OperatorMetrics(counter, leading=lambda: True, cached=lambda: {"nodes": 5})
    registry.controllers.reconciled("module", "success", 0.01)
    text = registry.render().decode()
    assert 'kmm_api_writes_total{resource="nodes",verb="PATCH"} 3.0' in text
    assert "kmm_leader 1.0" in text
    assert 'kmm_cached_objects{informer="nodes"} 5.0' in text
    assert 'controller_runtime_reconcile_total{controller="module",result="success"} 1.0' in text


def test_handler_errors_are_counted_per_informer_and_method() -> None:
    registry = metrics.OperatorMetrics(counting.RequestCounter(), leading=lambda: True, cached=dict)
    for _ in range(2):
        registry.handler_failed("nodes", "on_update")
    registry.handler_failed("pods", "on_add")
    text = registry.render().decode()
    assert 'kmm_handler_errors_total{informer="nodes",method="on_update"} 2.0' in text
    assert 'kmm_handler_errors_total{informer="pods",method="on_add"} 1.0' in text


def test_throttled_requests_and_relists_are_rendered() -> None:
    counter = counting.RequestCounter()
    counter.record("PATCH", "/api/v1/nodes/n1")
    counter.record_throttled("PATCH", "/api/v1/nodes/n1")
    counter.record("PATCH", "/api/v1/nodes/n1")
    registry = metrics.OperatorMetrics(
        counter,
        leading=lambda: True,
        cached=dict,
        relists=lambda: {("nodes", "start"): 1, ("nodes", "gone"): 2},
    )
    text = registry.render().decode()
    assert 'kmm_api_writes_total{resource="nodes",verb="PATCH"} 2.0' in text
    assert 'kmm_api_throttled_total{resource="nodes",verb="PATCH"} 1.0' in text
    assert 'kmm_informer_relists_total{informer="nodes",reason="gone"} 2.0' in text
    assert 'kmm_informer_relists_total{informer="nodes",reason="start"} 1.0' in text


async def test_server_serves_routes_until_stopped() -> None:
    ready = [False]
    routes: httpserving.Routes = {
        "/healthz": lambda: (200, b"ok\n", "text/plain"),
        "/readyz": lambda: (
            (200, b"ok\n", "text/plain") if ready[0] else (503, b"no\n", "text/plain")
        ),
    }
    server = httpserving.Server("test", "127.0.0.1", 0, routes)
    stop = asyncio.Event()
    task = asyncio.ensure_future(server.run(stop))
    try:
        await asyncio.wait_for(server.bound.wait(), 10)
        base = f"http://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/healthz") as response:
                assert response.status == 200
            async with session.get(f"{base}/readyz") as response:
                assert response.status == 503
            ready[0] = True
            async with session.get(f"{base}/readyz") as response:
                assert response.status == 200
            async with session.get(f"{base}/nope") as response:
                assert response.status == 404
    finally:
        stop.set()
        await task


def test_json_log_lines() -> None:
    record = logging.makeLogRecord(
        {"name": "kmm.x", "levelname": "INFO", "msg": "hello %s", "args": ("world",), "key": "ns/m"}
    )
    entry = json.loads(jsonlogs.JsonFormatter().format(record))
    assert entry["msg"] == "hello world"
    assert entry["level"] == "info"
    assert entry["key"] == "ns/m"
