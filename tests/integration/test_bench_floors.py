"""The benchmarks' floors give the operator's guarantee (issue 23).

A floor is the least work the same guarantee needs, so a floor run must end
where the operator's run ends. ``bench_upgrade`` runs the same v1 -> v2
transition both ways from the same start; ``bench_operator`` converges the
same Module both ways. Here both run on a few nodes of a sandbox of their
own, and the two end states are compared: each node's labels of the
Module, where its pods run and are Ready, its DaemonSets (and, for the
convergence, the Module's finalizer and status).
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterator

import pytest
import test_sandbox_lifecycle as lifecycle

from kmm.api import labels
from kmm.sandbox import cluster, testing

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import bench_operator
import bench_upgrade


@pytest.fixture(scope="module")
def small() -> Iterator[testing.RunningSandbox]:
    with lifecycle.own_sandbox("bf", nodes=4, kernels=(bench_upgrade.KERNEL,)) as sandbox:
        yield sandbox


async def test_the_upgrade_floor_ends_where_the_operator_does(
    small: testing.RunningSandbox,
) -> None:
    async with cluster.api_client(small.kubeconfig) as api:
        await bench_upgrade.install(api)
    found = await bench_upgrade.measure(small.kubeconfig, small.node_names, batch=2)

    done = labels.version_ready(bench_upgrade.NAMESPACE, bench_upgrade.NAME)
    ends = {node: have.get(done) for node, have in found.operator_end["nodes"].items()}
    assert ends == dict.fromkeys(small.node_names, "v2")
    assert found.floor_end == found.operator_end


@pytest.fixture(scope="module")
def five() -> Iterator[testing.RunningSandbox]:
    kernels = bench_operator.KERNELS
    with lifecycle.own_sandbox("bo", nodes=len(kernels), kernels=kernels) as sandbox:
        yield sandbox


async def test_the_convergence_floor_ends_where_the_operator_does(
    five: testing.RunningSandbox,
) -> None:
    independent = await bench_operator.independent_client(five.kubeconfig)
    async with cluster.api_client(five.kubeconfig) as kmm_api, independent as api:
        await bench_operator.install(kmm_api, api)
        found = await bench_operator.measure(kmm_api, api, five.kubeconfig, five.node_names)

    assert len(found.operator_end["daemonsets"]) == len(bench_operator.KERNELS)
    assert [ready for *_, ready in found.operator_end["pods"]] == [True] * len(five.node_names)
    assert found.floor_end == found.operator_end
