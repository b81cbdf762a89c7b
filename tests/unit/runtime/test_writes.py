"""Write counting on a real ApiClient, against an HTTP server that answers {}."""

from __future__ import annotations

import pytest
from aiohttp import test_utils, web
from kubernetes_asyncio import client

from kmm.runtime import writes


@pytest.mark.parametrize(
    ("url", "resource"),
    [
        ("https://h/api/v1/namespaces/ns/configmaps", "configmaps"),
        ("https://h/api/v1/namespaces/ns/configmaps/x", "configmaps"),
        ("https://h/api/v1/nodes/n1/status", "nodes/status"),
        ("https://h/api/v1/namespaces/ns", "namespaces"),
        ("https://h/apis/apps/v1/namespaces/ns/daemonsets/d?dryRun=All", "apps/daemonsets"),
        ("https://h/apis/resource.k8s.io/v1/deviceclasses/c", "resource.k8s.io/deviceclasses"),
    ],
)
def test_resource_of(url: str, resource: str) -> None:
    assert writes.resource_of(url) == resource


async def test_counts_writes_not_reads() -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    server = test_utils.TestServer(app)
    await server.start_server()
    configuration = client.Configuration()
    configuration.host = str(server.make_url("")).rstrip("/")
    api = client.ApiClient(configuration)
    try:
        counter = writes.WriteCounter().install(api)
        core = client.CoreV1Api(api)
        await core.read_namespaced_config_map("x", "ns")
        await core.list_node(_preload_content=False)
        assert counter.total == 0
        await core.create_namespaced_config_map("ns", {"metadata": {"name": "x"}})
        await core.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
        await core.patch_node_status("n1", {"status": {}})
        await core.delete_namespaced_config_map("x", "ns")
        assert counter.counts == {
            ("POST", "configmaps"): 1,
            ("PATCH", "nodes"): 1,
            ("PATCH", "nodes/status"): 1,
            ("DELETE", "configmaps"): 1,
        }
        assert counter.by_resource("configmaps") == 2
        counter.uninstall()
        await core.delete_namespaced_config_map("x", "ns")
        assert counter.total == 4
    finally:
        await api.close()
        await server.close()
