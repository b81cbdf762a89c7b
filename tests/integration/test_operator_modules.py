"""The module loader on the sandbox: DaemonSets per (kernel, image), pods, labels.

Each test selects nodes with a label of its own (restored afterwards) and runs
the operator in process, with a write counter on its client.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import kernels, labels, modules
from kmm.sandbox import testing

manifests = support.manifests

# In `make test-compat`: kmm on each supported Kubernetes release.
pytestmark = pytest.mark.compat


def _kernel(sandbox: testing.RunningSandbox, index: int) -> str:
    return kernels.node_kernel(sandbox.kernels[index % len(sandbox.kernels)])


async def test_three_kernels_three_daemonsets_pods_and_ready_labels(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    name = "three"
    select = f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:3]  # one node per kernel; worker-3 (6.8 again) not selected
    async with (
        support.selecting(api_client, chosen, select),
        support.operator_in_process(sandbox.kubeconfig) as running,
    ):
        await support.create_module(
            api_client,
            namespace,
            support.module_body(name, {select: "yes"}),
        )
        await testing.eventually(
            lambda: support.converged(api_client, namespace, name, set(chosen)),
            "module loaded on 3 nodes",
        )
        daemonsets = await support.loader_daemonsets(api_client, namespace)
        assert len(daemonsets) == 3
        images = {
            "6.8.0-45-generic": "example.com/literal/kmm-test:6.8.0",
            "6.1.0-27-amd64": "example.com/regexp/three:6.1.0-27-amd64",
            "5.14.0-427.el9.x86_64": "example.com/default/three:5.14",
        }
        by_kernel = {d.metadata.labels[labels.KERNEL_VERSION_FULL]: d for d in daemonsets}
        assert set(by_kernel) == set(images)
        for kernel, ds in by_kernel.items():
            image = images[kernel]
            assert ds.metadata.labels == {
                labels.MODULE_NAME: name,
                labels.MODULE_NAMESPACE: namespace,
                labels.ROLE: "module-loader",
                labels.KERNEL_VERSION_FULL: kernel,
                labels.IMAGE_HASH: labels.image_hash(image),
            }
            owner = ds.metadata.owner_references[0]
            assert (owner.kind, owner.name, owner.controller, owner.block_owner_deletion) == (
                "Module",
                name,
                True,
                True,
            )
            pod = ds.spec.template.spec
            container = pod.containers[0]
            assert container.image == image
            assert pod.node_selector == {select: "yes", labels.KERNEL_VERSION_FULL: kernel}
            assert pod.priority_class_name == "system-node-critical"
            assert container.security_context.capabilities.add == ["SYS_MODULE"]
            assert container.security_context.capabilities.drop == ["ALL"]
            assert (
                "modprobe -v -d /opt kmm_test debug=1"
                in container.lifecycle.post_start._exec.command[-1]
            )
            assert "modprobe -rv -d /opt kmm_test" in container.lifecycle.pre_stop._exec.command[-1]
            assert [t.key for t in pod.tolerations] == ["kmm-test"]
            assert [s.name for s in pod.image_pull_secrets] == ["kmm-test-pull"]
            assert ds.spec.update_strategy.type == "OnDelete"

        pods = await client.CoreV1Api(api_client).list_namespaced_pod(
            namespace, label_selector=f"{labels.ROLE}=module-loader"
        )
        placed = {
            p.spec.node_name: p.metadata.labels[labels.KERNEL_VERSION_FULL] for p in pods.items
        }
        assert placed == {node: _kernel(sandbox, i) for i, node in enumerate(chosen)}
        everywhere = await support.node_labels(api_client)
        ready_key = labels.ready(namespace, name)
        assert {n for n, lbl in everywhere.items() if ready_key in lbl} == set(chosen)
        for i, node in enumerate(chosen):
            assert everywhere[node][labels.KERNEL_VERSION_FULL] == _kernel(sandbox, i)
        assert running.counter.total_writes > 0
        await support.delete_and_wait_clean(api_client, namespace, name)


async def _set_kernel(api: client.ApiClient, node: str, kernel: str) -> None:
    """What a reboot into another kernel looks like to the API (status subresource)."""
    await client.CoreV1Api(api).patch_node_status(
        node, {"status": {"nodeInfo": {"kernelVersion": kernel}}}
    )


async def _kernel_back(api: client.ApiClient, node: str, kernel: str) -> None:
    """Set ``node``'s kernel back while the operator runs, and wait for its
    kernel label to follow: a label left naming another kernel would be put
    right by the next test's operator, a write that test did not make."""
    await _set_kernel(api, node, kernel)

    async def follows() -> bool:
        found = (await support.node_labels(api))[node].get(labels.KERNEL_VERSION_FULL)
        return found == kernels.node_kernel(kernel)

    await testing.eventually(follows, f"{node}'s kernel label back to {kernel}")


def _by_kernel(daemonsets: list[Any]) -> dict[str, Any]:
    return {d.metadata.labels[labels.KERNEL_VERSION_FULL]: d for d in daemonsets}


async def test_image_change_selector_change_kernel_change_and_delete(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    name = "moving"
    select = f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:3]
    objects = client.CustomObjectsApi(api_client)
    moved, moved_from = chosen[1], sandbox.kernels[1]
    body = support.module_body(name, {select: "yes"})
    try:
        async with (
            support.selecting(api_client, chosen, select),
            support.operator_in_process(sandbox.kubeconfig),
        ):
            await support.create_module(api_client, namespace, body)
            await testing.eventually(
                lambda: support.converged(api_client, namespace, name, set(chosen)),
                "loaded on 3 nodes",
            )
            before = _by_kernel(await support.loader_daemonsets(api_client, namespace))

            # 1. One mapping's image changes: only that kernel's DaemonSet changes.
            patch = {"spec": {"moduleLoader": {"container": {"kernelMappings": [
                body["spec"]["moduleLoader"]["container"]["kernelMappings"][0],
                {"regexp": r"^6\.1\.\d+-\d+-amd64$", "containerImage": "example.com/new/x:v2"},
                body["spec"]["moduleLoader"]["container"]["kernelMappings"][2],
            ]}}}}  # fmt: skip
            await objects.patch_namespaced_custom_object(
                modules.GROUP,
                modules.VERSION,
                namespace,
                modules.PLURAL,
                name,
                patch,
                _content_type="application/merge-patch+json",
            )

            async def image_moved() -> bool:
                now = _by_kernel(await support.loader_daemonsets(api_client, namespace))
                ds = now.get("6.1.0-27-amd64")
                return (
                    len(now) == 3
                    and ds is not None
                    and ds.spec.template.spec.containers[0].image == "example.com/new/x:v2"
                    and await support.converged(api_client, namespace, name, set(chosen))
                )

            await testing.eventually(image_moved, "6.1 DaemonSet on the new image")
            after = _by_kernel(await support.loader_daemonsets(api_client, namespace))
            for kernel in ("6.8.0-45-generic", "5.14.0-427.el9.x86_64"):
                assert after[kernel].metadata.uid == before[kernel].metadata.uid
                assert after[kernel].metadata.generation == before[kernel].metadata.generation
            assert after["6.1.0-27-amd64"].metadata.uid != before["6.1.0-27-amd64"].metadata.uid

            # 2. The last node of a kernel leaves the selector: its DaemonSet goes.
            await client.CoreV1Api(api_client).patch_node(
                chosen[2], {"metadata": {"labels": {select: None}}}
            )

            async def el9_gone() -> bool:
                now = _by_kernel(await support.loader_daemonsets(api_client, namespace))
                return set(now) == {
                    "6.8.0-45-generic",
                    "6.1.0-27-amd64",
                } and await support.converged(api_client, namespace, name, set(chosen[:2]))

            await testing.eventually(el9_gone, "el9 DaemonSet deleted, its .ready label gone")

            # 3. A node's kernel changes: it moves to the right DaemonSet (and the
            # 6.1 DaemonSet, now without nodes, goes).
            await _set_kernel(api_client, moved, "6.8.0-45-generic")

            async def kernel_moved() -> bool:
                now = _by_kernel(await support.loader_daemonsets(api_client, namespace))
                if set(now) != {"6.8.0-45-generic"}:
                    return False
                pods = await client.CoreV1Api(api_client).list_namespaced_pod(
                    namespace, label_selector=f"{labels.ROLE}=module-loader"
                )
                placed = {
                    p.spec.node_name: p.metadata.labels[labels.KERNEL_VERSION_FULL]
                    for p in pods.items
                    if p.metadata.deletion_timestamp is None
                }
                return placed == {
                    chosen[0]: "6.8.0-45-generic",
                    moved: "6.8.0-45-generic",
                } and await support.converged(api_client, namespace, name, set(chosen[:2]))

            await testing.eventually(kernel_moved, "node moved to the 6.8 DaemonSet")
            labels_now = await support.node_labels(api_client)
            assert labels_now[moved][labels.KERNEL_VERSION_FULL] == "6.8.0-45-generic"

            # 4. Deleting the Module removes everything it made.
            await support.delete_and_wait_clean(api_client, namespace, name)
            await _kernel_back(api_client, moved, moved_from)
    finally:
        await _set_kernel(api_client, moved, moved_from)


async def test_a_node_no_module_selects_keeps_a_true_kernel_label(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    """The churn test's stale label: a node leaves the selector, then reboots
    into another kernel. Its ``kernel-version.full`` must follow, or the old
    kernel's DaemonSet would start a wrong loader the moment a selector took
    the node in again."""
    name = "left"
    select = f"kmm-test/{namespace}"
    node, kernel_from = sandbox.node_names[0], sandbox.kernels[0]
    kernel_to = sandbox.kernels[1]
    try:
        async with support.operator_in_process(sandbox.kubeconfig):
            async with support.selecting(api_client, [node], select):
                await support.create_module(
                    api_client,
                    namespace,
                    support.module_body(name, {select: "yes"}),
                )
                await testing.eventually(
                    lambda: support.converged(api_client, namespace, name, {node}), "loaded"
                )

            async def labelled(key: str, value: str | None) -> bool:
                return (await support.node_labels(api_client))[node].get(key) == value

            await testing.eventually(
                lambda: labelled(labels.ready(namespace, name), None), "unloaded"
            )
            await _set_kernel(api_client, node, kernel_to)
            await testing.eventually(
                lambda: labelled(labels.KERNEL_VERSION_FULL, kernels.node_kernel(kernel_to)),
                "the kernel label of a node no Module selects",
            )
            await support.delete_and_wait_clean(api_client, namespace, name)
            await _kernel_back(api_client, node, kernel_from)
    finally:
        await _set_kernel(api_client, node, kernel_from)


async def test_noop_resync_and_restart_make_zero_writes(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    name = "still"
    select = f"kmm-test/{namespace}"
    chosen = sandbox.node_names
    async with support.selecting(api_client, chosen, select):
        async with support.operator_in_process(sandbox.kubeconfig) as first:
            await support.create_module(
                api_client,
                namespace,
                support.module_body(name, {select: "yes"}),
            )
            await testing.eventually(
                lambda: support.converged(api_client, namespace, name, set(chosen)),
                "loaded on 4 nodes",
            )
            await first.wait_idle("converged")
            assert first.counter.total_writes > 0
            first.counter.reset()
            first.op.resync()
            await first.wait_idle("resync done")
            assert dict(first.counter.writes) == {}

        # A restart on the converged cluster: fresh caches, every Module
        # reconciled from scratch, still nothing to write.
        async with support.operator_in_process(sandbox.kubeconfig) as second:
            await second.wait_idle("restart reconciled")
            assert second.op.counting.done >= 1
            assert dict(second.counter.writes) == {}
        async with support.operator_in_process(sandbox.kubeconfig):
            await support.delete_and_wait_clean(api_client, namespace, name)


async def test_kernel_that_cannot_expand_is_degraded_others_still_load(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    name = "partial"
    select = f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:2]
    odd, odd_from = chosen[1], sandbox.kernels[1]
    body = support.module_body(name, {select: "yes"})
    body["spec"]["moduleLoader"]["container"]["kernelMappings"].insert(
        0, {"regexp": "^weird$", "containerImage": "example.com/x:${KERNEL_Z}"}
    )
    try:
        await _set_kernel(api_client, odd, "weird")
        async with (
            support.selecting(api_client, chosen, select),
            support.operator_in_process(sandbox.kubeconfig),
        ):
            await support.create_module(api_client, namespace, body)

            async def settled() -> bool:
                module = await support.get_module(api_client, namespace, name)
                degraded = support.condition(module, "Degraded")
                return (
                    degraded is not None
                    and degraded["status"] == "True"
                    and await support.converged(api_client, namespace, name, {chosen[0]})
                )

            await testing.eventually(settled, "degraded for 'weird', loaded elsewhere")
            module = await support.get_module(api_client, namespace, name)
            degraded = support.condition(module, "Degraded")
            assert degraded is not None
            assert degraded["reason"] == "KernelMappingFailed"
            assert "weird" in degraded["message"]
            assert len(await support.loader_daemonsets(api_client, namespace)) == 1
            await support.delete_and_wait_clean(api_client, namespace, name)
            await _kernel_back(api_client, odd, odd_from)
    finally:
        await _set_kernel(api_client, odd, odd_from)


async def test_a_fresh_converge_patches_each_node_exactly_twice(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    """Kernel label, then ``.ready``: the two label changes a new node needs, and
    no more, however the watch events interleave with the reconciles."""
    import uuid

    from kmm.sandbox import cluster
    from kmm.sandbox.kwoknodes import nodes

    count = 20
    names = [f"kmm-fresh-{uuid.uuid4().hex[:6]}-{i}" for i in range(count)]
    select = f"kmm-test/{namespace}"
    async with cluster.api_client(sandbox.kubeconfig) as kmm_api:
        await nodes.create(kmm_api, [(n, "6.8.0-45-generic") for n in names])
    try:
        async with (
            support.selecting(api_client, names, select),
            support.operator_in_process(sandbox.kubeconfig) as running,
        ):
            # What the start writes is not this test's (a label another
            # test left behind on a shared node, put right).
            await running.wait_idle("started")
            running.counter.reset()
            await support.create_module(
                api_client,
                namespace,
                support.module_body("fresh", {select: "yes"}),
            )
            await testing.eventually(
                lambda: support.converged(api_client, namespace, "fresh", set(names)),
                "fresh converged",
            )
            await running.wait_idle("settled")
            assert running.counter.writes_to("nodes") == 2 * count
            await support.delete_and_wait_clean(api_client, namespace, "fresh")
    finally:
        for name in names:
            with contextlib.suppress(client.ApiException):
                await client.CoreV1Api(api_client).delete_node(name)


async def test_loading_order_pods_carry_the_softdep_file_and_resync_writes_nothing(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    """The apiserver takes the softdep file's downward-API volume as built, the
    pods the DaemonSet controller makes carry it, and the stored DaemonSet
    still matches the desired one (a resync writes nothing)."""
    name = "ordered"
    select = f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:1]
    body = support.module_body(name, {select: "yes"})
    body["spec"]["moduleLoader"]["container"]["modprobe"]["modulesLoadingOrder"] = [
        "kmm_test",
        "kmm_dep_b",
        "kmm_dep_c",
    ]
    softdeps = "softdep kmm_test pre: kmm_dep_b\nsoftdep kmm_dep_b pre: kmm_dep_c\n"
    async with (
        support.selecting(api_client, chosen, select),
        support.operator_in_process(sandbox.kubeconfig) as running,
    ):
        await support.create_module(api_client, namespace, body)
        await testing.eventually(
            lambda: support.converged(api_client, namespace, name, set(chosen)),
            "ordered module loaded",
        )
        [ds] = await support.loader_daemonsets(api_client, namespace)
        assert ds.spec.template.metadata.annotations == {labels.MODULES_ORDER: softdeps}
        pods = await client.CoreV1Api(api_client).list_namespaced_pod(
            namespace, label_selector=f"{labels.ROLE}=module-loader"
        )
        [pod] = pods.items
        assert pod.metadata.annotations[labels.MODULES_ORDER] == softdeps
        [volume] = [v for v in pod.spec.volumes if v.name == "modules-order"]
        [item] = volume.downward_api.items
        assert (item.path, item.field_ref.field_path) == (
            "softdep.conf",
            f"metadata.annotations['{labels.MODULES_ORDER}']",
        )
        container = pod.spec.containers[0]
        [mount] = [m for m in container.volume_mounts if m.name == "modules-order"]
        assert (mount.mount_path, mount.sub_path, mount.read_only) == (
            "/etc/modprobe.d/softdep.conf",
            "softdep.conf",
            True,
        )
        # The hooks' scripts (loader.scripts) end with the load, checked,
        # and the unloads in order.
        assert container.lifecycle.post_start._exec.command[-1].splitlines()[-2:] == [
            "kmm_run 'modprobe -v -d /opt kmm_test debug=1' modprobe -v -d /opt kmm_test debug=1",
            "kmm_verify",
        ]
        assert container.lifecycle.pre_stop._exec.command[-1].splitlines()[-3:] == [
            f"kmm_run 'modprobe -rv -d /opt {entry}' modprobe -rv -d /opt {entry}"
            for entry in ("kmm_test", "kmm_dep_b", "kmm_dep_c")
        ]
        await running.wait_idle("converged")
        running.counter.reset()
        running.op.resync()
        await running.wait_idle("resync done")
        assert dict(running.counter.writes) == {}
        await support.delete_and_wait_clean(api_client, namespace, name)
