"""Integration fixtures: one real sandbox control plane for the whole session.

``sandbox`` brings it up once (building the binaries on first use, cached per
version under $KMM_CACHE_DIR or ~/.cache/kmm) and takes it down at the end;
``api_client`` is a fresh kubernetes-asyncio client per test (a client that is
not kmm's, to check what kmm wrote); ``kmm_api`` is kmm's own
``kube.client.Client``; ``namespace`` is a namespace of the test's own,
deleted afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import compatibility
import pytest
import test_operator_support as support
import vmsandbox
from kubernetes_asyncio import client

from kmm.cli import paths
from kmm.kube import client as kube_client
from kmm.sandbox import cluster, testing


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.path)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.integration)


#: Kernels the session's fake nodes are spread over (round robin).
KERNELS = ("6.8.0-45-generic", "6.1.0-27-amd64", "5.14.0-427.el9.x86_64+")
NODE_COUNT = 4


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[testing.RunningSandbox]:
    directory = tmp_path_factory.mktemp("sandbox")
    options = cluster.Options(
        directory=directory,
        cache_dir=paths.cache_dir(),
        nodes=NODE_COUNT,
        kernels=KERNELS,
        kubernetes_version=compatibility.version(),
    )
    record = asyncio.run(cluster.up(options))
    try:
        yield testing.RunningSandbox.of(record, KERNELS)
    finally:
        with contextlib.suppress(Exception):
            cluster.down(directory)


@pytest.fixture
async def api_client(sandbox: testing.RunningSandbox) -> AsyncIterator[client.ApiClient]:
    api = await support.independent_client(sandbox.kubeconfig)
    async with api:
        yield api


@pytest.fixture
async def kmm_api(sandbox: testing.RunningSandbox) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(sandbox.kubeconfig) as api:
        yield api


@pytest.fixture
async def namespace(api_client: client.ApiClient) -> AsyncIterator[str]:
    async with support.own_namespace(api_client) as name:
        yield name


@pytest.fixture(scope="session")
def vm_sandbox() -> Iterator[vmsandbox.Started]:
    """The one sandbox with a VM node (``vmsandbox``), for the tests that need a real kernel."""
    with vmsandbox.started() as found:
        yield found
