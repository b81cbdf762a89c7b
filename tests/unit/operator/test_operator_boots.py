"""Reboots: ``.ready`` never claims a module before this boot's load (``kmm.operator.boots``).

The informers, stores and boot memory of the real wiring (``wiring.Operator``,
never run: no request leaves), fed watch events as the reflector feeds them
(projected); the Module reconciler over those caches with the recording
writer. A node reboots: the kubelet posts the Node's new ``bootID`` first,
and the loader pod's Ready condition of the earlier boot is still shown
until the kubelet reports the container it started again.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import operator_fixtures as fixtures
import pytest
from test_operator_reconciler import RecordingWriter

from kmm.api import conditions, labels
from kmm.kube import client, kubeconfigs
from kmm.operator import boots, caches, reconciler, views, wiring
from kmm.runtime import informers, stores

K68, K61, _ = fixtures.KERNELS
READY = labels.ready("ns", "m")
T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z", "2026-01-01T00:05:09Z"


class World:
    def __init__(self, operator: wiring.Operator, writer: RecordingWriter) -> None:
        self.operator = operator
        self.writer = writer
        self.reconciler = reconciler.ModuleReconciler(
            operator.caches,
            writer,  # type: ignore[arg-type]
            now=lambda: "2026-01-01T00:00:00Z",
        )
        self.clock = [0.0]
        operator.boots.monotonic = lambda: self.clock[0]

    @property
    def cached(self) -> views.Caches:
        return self.operator.caches

    def node(self, name: str, kernel: str, boot: str) -> None:
        """The kubelet's Node status (its labels as the API server holds them)."""
        found = self.cached.nodes.get(name)
        extra = dict((found or {}).get("metadata", {}).get("labels") or {})
        whole = fixtures.node(name, kernel, extra=extra, boot=boot)
        _watched(self.operator.nodes, caches.project_node(whole))

    def pod(self, pod: dict[str, Any]) -> None:
        _watched(self.operator.pods, caches.project_pod(copy.deepcopy(pod)))

    def loader(self, node: str) -> dict[str, Any]:
        """The cached loader DaemonSet of ``node``'s kernel, as its pods' template."""
        kernel = self.cached.nodes.get(node)["metadata"]["labels"][labels.KERNEL_VERSION_FULL]  # type: ignore[index]
        (ds,) = [
            d
            for d in self.cached.daemonsets.objects()
            if d["metadata"]["labels"][labels.KERNEL_VERSION_FULL] == kernel
        ]
        return {**ds, "spec": {"template": {"metadata": {"labels": ds["metadata"]["labels"]}}}}

    def ready_nodes(self) -> set[str]:
        return {
            n["metadata"]["name"]
            for n in self.cached.nodes.objects()
            if READY in n["metadata"]["labels"]
        }

    def condition(self, type_: str) -> dict[str, Any]:
        module = self.cached.modules.get("ns/m")
        assert module is not None
        return next(c for c in module["status"]["conditions"] if c["type"] == type_)

    async def reconcile(self) -> None:
        await self.reconciler.reconcile("ns/m")


def _watched(informer: informers.Informer, obj: stores.RawObject) -> None:
    kind = "MODIFIED" if informer.store.get(stores.key_of(obj)) is not None else "ADDED"
    informer.apply({"type": kind, "object": obj})


@pytest.fixture
async def world() -> AsyncIterator[World]:
    api = client.Client(kubeconfigs.Access(server="https://127.0.0.1:9", source="test"))
    operator = wiring.Operator(api)
    found = World(operator, RecordingWriter(operator.caches))
    found.node("n0", K68, "boot-a")
    found.node("n1", K61, "boot-x")
    found.cached.modules.put(fixtures.module_raw())
    await found.reconcile()  # the DaemonSets
    for node in ("n0", "n1"):
        found.pod(fixtures.pod(found.loader(node), node, started=T0))
    await found.reconcile()
    assert found.ready_nodes() == {"n0", "n1"}
    yield found
    await api.close()


async def test_a_reboot_takes_ready_away_until_the_loader_of_this_boot_is_ready(
    world: World,
) -> None:
    world.node("n0", K68, "boot-b")  # the kubelet of the new boot reported
    assert len(world.operator.boots) == 1  # n0's loader pod, not n1's
    world.writer.calls.clear()
    await world.reconcile()
    # Its pod still shows the earlier boot's container, Ready: not loaded.
    assert world.ready_nodes() == {"n1"}
    assert ("labels", ("n0", {READY: None})) in world.writer.calls
    assert world.condition(conditions.READY)["status"] == "False"
    assert world.condition(conditions.DEGRADED)["status"] == "False"
    # The kubelet restarted its container (postStart loaded again): loaded.
    world.pod(fixtures.pod(world.loader("n0"), "n0", started=T1))
    assert len(world.operator.boots) == 0
    await world.reconcile()
    assert world.ready_nodes() == {"n0", "n1"}
    assert world.condition(conditions.READY)["status"] == "True"


async def test_the_old_container_reported_gone_then_the_new_one_ready(world: World) -> None:
    world.node("n0", K68, "boot-b")
    await world.reconcile()
    world.pod(fixtures.pod(world.loader("n0"), "n0", ready=False))  # no container runs
    assert len(world.operator.boots) == 0
    await world.reconcile()
    assert world.ready_nodes() == {"n1"}
    world.pod(fixtures.pod(world.loader("n0"), "n0", started=T1))
    await world.reconcile()
    assert world.ready_nodes() == {"n0", "n1"}


async def test_the_same_boot_reported_again_or_a_first_boot_id_marks_nothing(
    world: World,
) -> None:
    world.node("n0", K68, "boot-a")  # a heartbeat, a label: the same boot
    assert len(world.operator.boots) == 0
    world.node("n2", K68, "boot-q")  # first seen: nothing to compare with
    assert len(world.operator.boots) == 0
    await world.reconcile()
    assert {"n0", "n1"} <= world.ready_nodes()


async def test_a_mark_lapses_after_patience(world: World) -> None:
    """The fallback for a node watch that lagged behind the pod watch (the
    new container marked too): the node is loaded again past ``PATIENCE``."""
    world.node("n0", K68, "boot-b")
    await world.reconcile()
    assert world.ready_nodes() == {"n1"}
    world.clock[0] += boots.PATIENCE - 1
    await world.reconcile()
    assert world.ready_nodes() == {"n1"}
    world.clock[0] += 1
    await world.reconcile()
    assert world.ready_nodes() == {"n0", "n1"}
    assert len(world.operator.boots) == 0


async def test_a_deleted_pod_leaves_no_mark(world: World) -> None:
    world.node("n0", K68, "boot-b")
    (pod,) = [p for p in world.cached.pods.objects() if p["spec"]["nodeName"] == "n0"]
    world.operator.pods.apply({"type": "DELETED", "object": pod})
    assert len(world.operator.boots) == 0


async def test_a_kernel_upgrade_by_reboot_moves_the_node_and_reports_no_failure_of_the_old_loader(
    world: World,
) -> None:
    old = world.loader("n0")
    world.node("n0", K61, "boot-b")  # back on the other kernel
    # The kubelet started the old kernel's loader again; its postStart fails
    # there (no module for this kernel in its image) and it crash-loops.
    failing = fixtures.pod(old, "n0", ready=False)
    failing["status"]["containerStatuses"] = [
        {
            "name": "module-loader",
            "ready": False,
            "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {
                "terminated": {
                    "exitCode": 1,
                    "message": f"modprobe: FATAL: Module kmod_x not found in directory "
                    f"/opt/lib/modules/{K61}",
                }
            },
        }
    ]
    world.pod(failing)
    world.writer.calls.clear()
    await world.reconcile()
    assert world.ready_nodes() == {"n1"}
    n0 = world.cached.nodes.get("n0")
    assert n0 is not None
    assert n0["metadata"]["labels"][labels.KERNEL_VERSION_FULL] == K61
    # No node runs the old kernel: its DaemonSet goes, and its pod with it.
    assert ("delete", old["metadata"]["name"]) in world.writer.calls
    assert world.condition(conditions.DEGRADED)["status"] == "False"
    assert world.condition(conditions.PROGRESSING)["status"] == "True"
    assert not [c for c in world.writer.calls if c[0] == "event" and "Failed" in c[1][0]]
    # The other kernel's loader starts there in this boot: loaded.
    world.operator.pods.apply({"type": "DELETED", "object": caches.project_pod(failing)})
    world.pod(fixtures.pod(world.loader("n0"), "n0", started=T2))
    await world.reconcile()
    assert world.ready_nodes() == {"n0", "n1"}
    assert world.condition(conditions.READY)["status"] == "True"
