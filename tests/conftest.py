"""Test-wide rules: warnings are errors (pyproject) and no test may leave
asyncio tasks running behind it; which tests share a pytest-xdist worker.

``make test`` runs pytest on two workers (``-n 2 --dist loadscope``). Each
test module is one unit of work, so a module's fixtures (its sandbox) serve all its
tests on one worker, in order; the modules in ``KUBELET_NODE_MODULES`` are
one unit together, run one after another: their sandboxes start kubelet
nodes (on containerd or the fake runtime) or network namespaces, which set
and restore host-wide sysctls and compare the host's state around
themselves, and build images on both cores. The other worker runs the rest,
whose sandboxes touch nothing host-wide (processes and loopback ports of
their own). A module that starts kubelet nodes must be listed here.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest
from xdist.scheduler import LoadScopeScheduling

KUBELET_NODE_MODULES: Final = frozenset(
    {
        "test_build_in_containers",
        "test_build_pods_in_containers",
        "test_chart_in_containers",
        "test_container_nodes",
        "test_device_taints_in_containers",
        "test_dra_in_containers",
        "test_kubelet_differential",
        "test_kubelet_host",
        "test_kubelet_nodes",
        "test_preflight_in_containers",
        "test_preflight_pods_in_containers",
        "test_registry_auth_in_containers",
        "test_sandbox_registry",
        "test_sandbox_relay",
        "test_upgrade_in_containers",
        "test_upstream_build_sign_manifest",
        "test_vm_modules",
        "test_vm_nodes",
    }
)


class _ModuleScheduling(LoadScopeScheduling):
    """xdist's ``loadscope`` (whole modules to a worker), with the modules
    that start kubelet nodes as one unit."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return "kubelet-nodes" if Path(module).stem in KUBELET_NODE_MODULES else module


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """Our unit of work under ``--dist loadscope``; xdist's own otherwise."""
    return _ModuleScheduling(config, log) if config.getvalue("dist") == "loadscope" else None


@pytest.fixture
async def _async_leak_check() -> AsyncIterator[None]:
    yield
    # One turn of the loop lets tasks that were just cancelled or finished settle.
    await asyncio.sleep(0)
    current = asyncio.current_task()
    leaked = [task for task in asyncio.all_tasks() if task is not current and not task.done()]
    for task in leaked:
        task.cancel()
    if leaked:
        names = ", ".join(sorted(task.get_name() + ":" + repr(task.get_coro()) for task in leaked))
        pytest.fail(f"test left {len(leaked)} asyncio task(s) running: {names}")


@pytest.fixture(autouse=True)
def _no_leaked_tasks(request: pytest.FixtureRequest) -> None:
    """Fail an async test that leaves tasks running; sync tests own no loop."""
    if inspect.iscoroutinefunction(request.function):
        request.getfixturevalue("_async_leak_check")
