"""Raw objects for operator unit tests: Modules, nodes, DaemonSets, pods; and a view of them."""

from __future__ import annotations

from typing import Any

from kmm.api import labels, modules, validation
from kmm.operator import caches, views
from kmm.runtime import stores

Obj = dict[str, Any]

KERNELS = ("6.8.0-45-generic", "6.1.0-27-amd64", "5.14.0-427.el9.x86_64+")


def module_raw(name: str = "m", namespace: str = "ns", **spec: Any) -> Obj:
    base: Obj = {
        "selector": {"pick": "yes"},
        "moduleLoader": {
            "container": {
                "modprobe": {"moduleName": "kmod_x", "parameters": ["a=1"]},
                "containerImage": "r.io/default:${KERNEL_X}.${KERNEL_Y}",
                "kernelMappings": [
                    {"literal": "6.8.0-45-generic", "containerImage": "r.io/lit:${KERNEL_XYZ}"},
                    {"regexp": r"^6\.1\.", "containerImage": "r.io/${MOD_NAME}:v1"},
                    {"regexp": r"\.el9\.x86_64$"},
                ],
            }
        },
    }
    base.update(spec)
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": "uid-1",
            "generation": 1,
            "resourceVersion": "10",
            "finalizers": [labels.FINALIZER],
        },
        "spec": base,
    }


def module(raw: Obj | None = None) -> modules.Module:
    return validation.parse_module(raw or module_raw())


def node(
    name: str,
    kernel: str,
    *,
    pick: bool = True,
    extra: dict[str, str] | None = None,
    boot: str = "",
    **spec: Any,
) -> Obj:
    """A Node on ``kernel``; ``boot``: its ``bootID`` (KWOK's nodes report none)."""
    node_labels = {"kubernetes.io/hostname": name, **(extra or {})}
    if pick:
        node_labels["pick"] = "yes"
    info = {"kernelVersion": kernel, **({"bootID": boot} if boot else {})}
    return {
        "metadata": {"name": name, "labels": node_labels, "resourceVersion": "1"},
        "spec": spec,
        "status": {"nodeInfo": info},
    }


def pod(ds: Obj, node_name: str, *, ready: bool = True, started: str | None = None) -> Obj:
    """A pod of ``ds`` on ``node_name``, its controller ``ds`` (by uid, when
    ``ds`` has one: a desired DaemonSet has none, a cached one has);
    ``started``: when its running container started (none runs without)."""
    owner = ds["metadata"].get("uid") or f"uid-ds-{ds['metadata']['name']}"
    return {
        "metadata": {
            "name": f"{ds['metadata']['name']}-{node_name}",
            "namespace": ds["metadata"]["namespace"],
            "uid": f"uid-pod-{ds['metadata']['name']}-{node_name}",
            "labels": dict(ds["spec"]["template"]["metadata"]["labels"]),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": ds["metadata"]["name"],
                    "uid": owner,
                    "controller": True,
                }
            ],
        },
        "spec": {"nodeName": node_name},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            **({"containerStatuses": [_running(started, ready=ready)]} if started else {}),
        },
    }


def _running(started: str, *, ready: bool) -> Obj:
    return {"name": "module-loader", "ready": ready, "state": {"running": {"startedAt": started}}}


def view(
    module: Any,
    nodes: list[dict],
    daemonsets: list[dict] | tuple[()] = (),
    pods: list[dict] | tuple[()] = (),
    *,
    stale: frozenset[str] = frozenset(),
) -> views.ModuleView:
    """What a reconcile of ``module`` would see: ``nodes`` cached, the given
    DaemonSets and pods as the Module's (``stale``: the uids of those Ready
    from an earlier boot of their node)."""
    store = stores.Store()
    for node in nodes:
        store.put(node)
    key = f"{module.metadata.namespace}/{module.metadata.name}"
    labelled = [n for n in nodes if key in caches.node_module_index(n)]
    return views.build(
        module_raw(),
        module,
        nodes=store,
        daemonsets=daemonsets,
        pods=pods,
        labelled=labelled,
        stale=stale,
    )
