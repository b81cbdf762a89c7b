"""Faults on demand, on a sandbox of this module's own: every control-plane
component stopped and started again on its data, 410 Gone from a short
compaction interval (for a list, and for a watch with the watch cache off),
429 from a low in-flight limit, a client cut off the API server and let
back. Nothing is left running.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import test_sandbox_lifecycle as lifecycle

from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import kubeconfigs, resources
from kmm.sandbox import cluster, state, testing

# Seconds between the API server's compaction requests: two of them make a
# resourceVersion from before the first one too old.
COMPACTION = 1.0
THROTTLED_USER = "kmm-test-throttled"
CONFIG_MAPS = resources.Resource("", "v1", "configmaps")


# The fault options: a compaction every COMPACTION seconds, watches from
# etcd, one write at a time (test_operator_faults uses them too).
FAULTS: dict[str, Any] = {
    "etcd_compaction_interval": COMPACTION,
    "watch_cache": False,
    "max_mutating_requests_inflight": 1,
}


@pytest.fixture(scope="module")
def faulty() -> Iterator[testing.RunningSandbox]:
    with lifecycle.own_sandbox("kf", nodes=1, **FAULTS) as sandbox:
        yield sandbox


@pytest.fixture
async def admin(faulty: testing.RunningSandbox) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(faulty.kubeconfig) as api:
        yield api


def _pids(directory: Path) -> dict[str, int]:
    record = state.load(directory)
    assert record is not None
    return {p.name: p.pid for p in record.launched}


async def _config_map(api: kube_client.Client, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await api.request(
        "GET", CONFIG_MAPS.path(namespace="default", name=name)
    )
    return found


async def test_each_component_stopped_and_started_keeps_the_data(
    faulty: testing.RunningSandbox, admin: kube_client.Client
) -> None:
    name = f"kept-{uuid.uuid4().hex[:8]}"
    created = await admin.request(
        "POST",
        CONFIG_MAPS.path(namespace="default"),
        body={"metadata": {"name": name}, "data": {"k": "v"}},
    )
    for component in ("etcd", "kube-apiserver", "controller-manager", "scheduler", "kwok"):
        before = _pids(faulty.directory)
        assert await faulty.stop(component) is True
        assert await faulty.stop(component) is False  # stopping twice is a no-op
        full = {"controller-manager": "kube-controller-manager", "scheduler": "kube-scheduler"}
        full_name = full.get(component, component)
        record = state.load(faulty.directory)
        assert record is not None
        stopped = {p.name for p in record.launched if not p.alive()}
        assert stopped == {full_name}
        if component in ("etcd", "kube-apiserver"):
            # One attempt: the client must not wait for the component to return.
            async with kube_client.Client(
                kubeconfigs.load(faulty.kubeconfig), max_attempts=1, timeout=5.0
            ) as once:
                with pytest.raises(kube_errors.Unavailable):
                    await _config_map(once, name)
        started = await faulty.start(component)
        after = _pids(faulty.directory)
        assert after[full_name] == started.pid != before[full_name]
        assert {k: v for k, v in after.items() if k != full_name} == {
            k: v for k, v in before.items() if k != full_name
        }
        kept = await _config_map(admin, name)
        assert kept["metadata"]["uid"] == created["metadata"]["uid"]
        assert kept["data"] == {"k": "v"}
    # The restarted controller-manager, scheduler and KWOK still do their jobs:
    # a new namespace gets its ServiceAccount, a pod is bound and Running.
    namespace = f"faults-{uuid.uuid4().hex[:8]}"
    await admin.request("POST", resources.NAMESPACES.path(), body={"metadata": {"name": namespace}})
    pod = {
        "metadata": {"name": "after-restarts"},
        "spec": {
            "containers": [{"name": "c", "image": "example.com/c:1"}],
            "tolerations": [{"operator": "Exists"}],
            "nodeSelector": {"type": "kwok"},
        },
    }

    await cluster.wait_default_account(admin, namespace, timeout=90)
    await admin.request("POST", resources.PODS.path(namespace=namespace), body=pod)

    async def running() -> bool:
        found = await admin.request(
            "GET", resources.PODS.path(namespace=namespace, name="after-restarts")
        )
        return bool(found.get("status", {}).get("phase") == "Running")

    await testing.eventually(running, "a pod scheduled and Running after the restarts")
    await admin.request("DELETE", resources.NAMESPACES.path(name=namespace))


def test_cli_stop_start_restart(faulty: testing.RunningSandbox) -> None:
    kmm = shutil.which("kmm", path=str(Path(sys.executable).parent))
    assert kmm is not None

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kmm, "sandbox", *args, "--dir", str(faulty.directory)],
            env=dict(os.environ, COLUMNS="200"),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    before = _pids(faulty.directory)
    stopped = run("stop", "scheduler")
    assert stopped.returncode == 0, stopped.stderr
    assert "Stopped scheduler" in stopped.stdout
    shown = run("status")
    assert shown.returncode == 1  # not everything runs
    assert "stopped" in shown.stdout
    again = run("start", "scheduler")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("Started kube-scheduler")
    twice = run("start", "scheduler")
    assert twice.returncode == 1
    assert "already running" in twice.stderr
    restarted = run("restart", "kube-apiserver")
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout.startswith("Restarted kube-apiserver")
    unknown = run("restart", "no-such-component")
    assert unknown.returncode == 1
    assert "has no no-such-component" in unknown.stderr
    after = _pids(faulty.directory)
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"kube-scheduler", "kube-apiserver"}
    assert run("status").returncode == 0


async def test_a_short_compaction_interval_makes_an_old_version_gone(
    admin: kube_client.Client,
) -> None:
    path = CONFIG_MAPS.path(namespace="default")
    name = f"gone-{uuid.uuid4().hex[:8]}"
    created = await admin.request("POST", path, body={"metadata": {"name": name}})
    old = created["metadata"]["resourceVersion"]
    query = {"resourceVersion": old, "resourceVersionMatch": "Exact"}
    # Still listable just after the write: the 410 below comes from compaction.
    await admin.request("GET", path, query=query)

    async def gone() -> bool:
        # Writes move the revision on, so each compaction has something to cut.
        await admin.request(
            "PATCH",
            CONFIG_MAPS.path(namespace="default", name=name),
            body={"data": {"tick": uuid.uuid4().hex}},
            content_type=kube_client.MERGE_PATCH,
        )
        try:
            await admin.request("GET", path, query=query)
        except kube_errors.Gone:
            return True
        return False

    await testing.eventually(gone, f"resourceVersion {old} compacted away", interval=COMPACTION)
    # A watch from it too: with the watch cache off, etcd says it is compacted.
    with pytest.raises(kube_errors.Gone) as expired:
        async for _ in admin.watch(path, query={"resourceVersion": old}, timeout_seconds=10):
            pass
    assert expired.value.status == 410


async def test_a_partition_cuts_one_client_off_and_heals(
    faulty: testing.RunningSandbox, admin: kube_client.Client
) -> None:
    path = CONFIG_MAPS.path(namespace="default")
    async with faulty.partition() as partition:
        access = partition.access(kubeconfigs.load(faulty.kubeconfig))
        async with kube_client.Client(access, max_attempts=1, timeout=10.0) as behind:
            listed = await behind.request("GET", path)
            events = behind.watch(
                path, query={"resourceVersion": listed["metadata"]["resourceVersion"]}
            )
            watching = asyncio.ensure_future(anext(events))
            await asyncio.sleep(0.5)  # the watch is open and quiet
            partition.cut()
            with pytest.raises(kube_errors.Unavailable):
                await watching  # the open watch breaks
            await events.aclose()
            with pytest.raises(kube_errors.Unavailable):
                await behind.request("GET", path)  # and nothing new gets through
            assert not behind.answering
            # Everyone else still reaches the server.
            await admin.request("GET", path)
            partition.heal()
            await behind.request("GET", path)
            assert behind.answering
    assert partition.relayed >= 2
    assert partition.refused >= 1


async def grant_edit(api: kube_client.Client, namespace: str, user: str) -> None:
    """``user`` may write in ``namespace``: a stalled write of theirs is held,
    not refused (``throttling``)."""
    await api.request(
        "POST",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        body={
            "metadata": {"name": f"edit-{uuid.uuid4().hex[:8]}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )


async def test_a_low_write_limit_answers_429_with_retry_after(
    faulty: testing.RunningSandbox, admin: kube_client.Client
) -> None:
    namespace = "default"
    await grant_edit(admin, namespace, THROTTLED_USER)
    access = kubeconfigs.load(faulty.kubeconfig)
    as_user = dataclasses.replace(access, impersonate=THROTTLED_USER)
    refused: list[kube_errors.Throttled] = []
    async with kube_client.Client(as_user, max_attempts=1) as once:
        # Another client of the sandbox may hold the one slot for a moment:
        # then the stalled write itself is refused and is tried again.
        for _ in range(20):
            async with faulty.stalled_write(namespace, user=THROTTLED_USER) as holding:
                if not holding:
                    await asyncio.sleep(1.0)
                    continue
                with pytest.raises(kube_errors.Throttled) as caught:
                    await once.request(
                        "POST",
                        CONFIG_MAPS.path(namespace=namespace),
                        body={"metadata": {"name": f"refused-{uuid.uuid4().hex[:8]}"}},
                    )
                refused.append(caught.value)
                break
    assert len(refused) == 1
    assert refused[0].retry_after == 1.0
    # The slot is free again once the stalled write is gone; the admin
    # (system:masters) was never limited.
    async with kube_client.Client(as_user) as retrying:
        made = await retrying.request(
            "POST",
            CONFIG_MAPS.path(namespace=namespace),
            body={"metadata": {"name": f"allowed-{uuid.uuid4().hex[:8]}"}},
        )
    assert made["metadata"]["name"].startswith("allowed-")
