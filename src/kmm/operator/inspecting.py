"""What an admin sees of one Module on each node: its labels, its pods, the upgrade step.

Read through any ``kube.client.Client`` (so against any cluster) and judged
with the planners' own rule (``upgrade.planner.step``): ``kmm status`` and
``kmm upgrade`` say what the operator does next on a node, in its words. A
pod of the Module that cannot run there (an image that does not pull, a
container that keeps crashing) is reported as the node's ``problem``: an
upgrade waiting on it would wait forever (but not a loader pod of another
kernel than the node's: ``loader.planner.leaving``). Init containers count as much as
the others (a device plugin's or DRA driver's init container whose image
does not pull holds its pod back just the same); a container's last
termination message comes with it (a loader's report of why its module did
not load, ``loader.scripts``), and the ``Watcher``
records a node again when a problem appears at a step it already reported.

A moving node's device taints come from ``status.deviceTaints``
(``upgrade.planner.holdings``: the ``Watcher`` follows the Module).

``images`` reads what the operator wrote of each kernel's image in
``status.images`` (whether it exists, is being built or signed, or failed,
and by which pod), so both commands show it without asking the registry.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from kmm.aio import tasks
from kmm.api import kernels, labels
from kmm.kube import client, listwatch, objects, reflecting, resources
from kmm.operator import writing
from kmm.operator.loader import planner as loader_planner
from kmm.operator.upgrade import planner as upgrade_planner

_PREFLIGHT_ROLE: Final = "preflight"

__all__ = [
    "STUCK_REASONS",
    "ImageState",
    "NodeState",
    "Watcher",
    "get_module",
    "images",
    "module_version",
    "node_states",
    "states",
]

RawObject = dict[str, Any]

# Container waiting reasons that do not heal by waiting (the kubelet's
# ErrImagePull, ImagePullBackOff, ... in pkg/kubelet/images and kuberuntime;
# PostStartHookError: a loader's load failed, before the back-off).
STUCK_REASONS: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "PostStartHookError",
    }
)


# status.images[].state -> what the commands call it; a pod is named after it.
_IMAGE_WORDS: Final = {
    "Exists": "exists",
    "Missing": "missing",
    "Checking": "checking",
    "Building": "building",
    "Signing": "signing",
    "BuildFailed": "build failed",
    "SignFailed": "sign failed",
    "AuthenticationFailed": "authentication failed",
}


@dataclasses.dataclass(frozen=True)
class ImageState:
    """One entry of ``status.images``: a kernel's image as the operator last saw it."""

    kernel: str
    image: str
    state: str
    pod: str | None = None
    message: str | None = None

    def describe(self, *, message: bool = True) -> str:
        """``building (pod P)``, ``build failed (pod P): last lines``, ``exists``; a
        state this version does not know is shown as written."""
        said = _IMAGE_WORDS.get(self.state, self.state or "unknown")
        if self.pod:
            said += f" (pod {self.pod})"
        if message and self.message:
            said += f": {self.message}"
        return said


def images(module: Mapping[str, Any]) -> list[ImageState]:
    """``status.images`` of a raw Module, in the order written (entries without a
    kernel are skipped: nothing could be matched to them)."""
    found = []
    for entry in (module.get("status") or {}).get("images") or ():
        kernel = entry.get("kernel")
        if not isinstance(kernel, str) or not kernel:
            continue
        found.append(
            ImageState(
                kernel=kernel,
                image=str(entry.get("image") or ""),
                state=str(entry.get("state") or ""),
                pod=entry.get("pod") or None,
                message=entry.get("message") or None,
            )
        )
    return found


@dataclasses.dataclass(frozen=True)
class NodeState:
    node: str
    kernel: str
    user: str | None
    loader: str | None
    plugin: str | None
    loaded: bool
    plugin_ready: bool
    version_ready: str | None
    step: upgrade_planner.Step
    problem: str | None
    # The image of the node's kernel, from status.images (empty: none written).
    images: tuple[ImageState, ...] = ()


async def get_module(api: client.Client, namespace: str, name: str) -> RawObject:
    """The Module (raises ``kube.errors.NotFound``)."""
    found: RawObject = await api.request("GET", writing.MODULES.path(namespace, name))
    return found


def _stuck(status: Mapping[str, Any], *, init: bool) -> str | None:
    """Why one container status cannot get on, or None."""
    state = status.get("state") or {}
    waiting = state.get("waiting") or {}
    waiting_reason = waiting.get("reason")
    if isinstance(waiting_reason, str) and waiting_reason in STUCK_REASONS:
        message = waiting.get("message") or ""
        # What the container said as it last ended: a loader's report of
        # why its module did not load (``loader.scripts``).
        said = ((status.get("lastState") or {}).get("terminated") or {}).get("message") or ""
        said = "; ".join(line.strip() for line in said.splitlines() if line.strip())
        if said:
            # The container's own words say it all: the kubelet's message
            # repeats them after the hook's whole command (a loader's script,
            # for PostStartHookError) or names the back-off.
            return f"{waiting_reason}: {said}"
        return waiting_reason + (f" ({message})" if message else "")
    # An init container that failed is run again (a DaemonSet's pods restart
    # always) and the pod waits on it; failing again after a restart, it is
    # crash-looping even in the moment before the kubelet says CrashLoopBackOff.
    terminated = state.get("terminated") or {}
    code = terminated.get("exitCode") or 0
    if init and code != 0 and (status.get("restartCount") or 0) > 0:
        reason = terminated.get("reason") or "Error"
        return f"{reason}: exit code {code}, restarted {status['restartCount']} time(s)"
    return None


def _problem(pods: Iterable[Mapping[str, Any]]) -> str | None:
    for pod in pods:
        pod_status = pod.get("status") or {}
        for status in pod_status.get("initContainerStatuses") or ():
            if (why := _stuck(status, init=True)) is not None:
                return f"pod {objects.name(pod)}: init container {status.get('name')}: {why}"
        for status in pod_status.get("containerStatuses") or ():
            if (why := _stuck(status, init=False)) is not None:
                return f"pod {objects.name(pod)}: {why}"
    return None


def states(
    module: Mapping[str, Any],
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    only: Iterable[str] | None = None,
) -> list[NodeState]:
    """Per node the Module selects or has labelled (or just ``only`` these), by name."""
    namespace, name = objects.namespace(module) or "", objects.name(module)
    spec = module.get("spec") or {}
    selector: Mapping[str, str] = spec.get("selector") or {}
    has_plugin = bool(spec.get("devicePlugin") or spec.get("dra"))
    noun = "DRA driver" if spec.get("dra") else "device-plugin"
    target_key = labels.dra_target(namespace, name)
    keys = {
        "user": labels.module_version(namespace, name),
        "loader": labels.module_loader_version(namespace, name),
        "plugin": labels.device_plugin_version(namespace, name),
        "ready": labels.ready(namespace, name),
        "plugin_ready": labels.device_plugin_ready(namespace, name),
        "dra_ready": labels.dra_ready(namespace, name),
        "version_ready": labels.version_ready(namespace, name),
    }
    # A PreflightValidation's pods carry the Module's labels but run for no
    # node's kernel: neither a step nor a problem of the node's.
    pods = [p for p in pods if objects.labels(p).get(labels.ROLE) != _PREFLIGHT_ROLE]
    holding = upgrade_planner.holdings(module)
    by_kernel: dict[str, list[ImageState]] = collections.defaultdict(list)
    for image in images(module):
        by_kernel[image.kernel].append(image)
    wanted = set(only) if only is not None else None
    found: list[NodeState] = []
    for node in sorted(nodes, key=objects.name):
        node_name, node_labels = objects.name(node), objects.labels(node)
        selected = all(node_labels.get(k) == v for k, v in selector.items())
        mine = any(labels.module_of_node_label(k) == (namespace, name) for k in node_labels)
        if wanted is not None and node_name not in wanted:
            continue
        if wanted is None and not (selected or mine):
            continue
        on_node = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node_name]
        blocking = [
            objects.name(p)
            for p in on_node
            if objects.labels(p).get(labels.ROLE) in ("device-plugin", "dra")
        ]
        plugin_ready = keys["plugin_ready"] in node_labels or keys["dra_ready"] in node_labels
        user = node_labels.get(keys["user"]) if selected else None
        kernel = kernels.node_kernel(
            ((node.get("status") or {}).get("nodeInfo") or {}).get("kernelVersion", "")
        )
        found.append(
            NodeState(
                node=node_name,
                kernel=kernel,
                user=user,
                loader=node_labels.get(keys["loader"]),
                plugin=node_labels.get(keys["plugin"]),
                loaded=keys["ready"] in node_labels,
                plugin_ready=plugin_ready,
                version_ready=node_labels.get(keys["version_ready"]),
                step=upgrade_planner.step(
                    user=user,
                    loader=node_labels.get(keys["loader"]),
                    plugin=node_labels.get(keys["plugin"]),
                    ready=keys["ready"] in node_labels,
                    loaded=keys["ready"] in node_labels,
                    plugin_ready=plugin_ready,
                    # A DRA node that is no target (cordoned) runs no driver.
                    has_plugin=has_plugin and (not spec.get("dra") or target_key in node_labels),
                    blocking_pods=blocking,
                    noun=noun,
                    holding=holding.get(node_name),
                ),
                # The old kernel's loader on a node that rebooted into
                # another fails there on its way out: not the node's problem.
                problem=_problem(p for p in on_node if not loader_planner.leaving(p, node)),
                images=tuple(by_kernel.get(kernel, ())),
            )
        )
    return found


def _pods_of(module: Mapping[str, Any]) -> tuple[resources.Resource, str, str]:
    namespace, name = objects.namespace(module) or "", objects.name(module)
    return (
        resources.PODS,
        namespace,
        # Preflight pods are left out (``states``) before they are fetched.
        f"{labels.MODULE_NAME}={name},{labels.MODULE_NAMESPACE}={namespace},"
        f"{labels.ROLE}!={_PREFLIGHT_ROLE}",
    )


async def node_states(
    api: client.Client, module: Mapping[str, Any], *, only: Iterable[str] | None = None
) -> list[NodeState]:
    """``states`` of the cluster as it is now (two lists)."""
    pod_resource, namespace, owned = _pods_of(module)
    nodes = (await api.request("GET", resources.NODES.path()))["items"]
    pods = (await api.request("GET", pod_resource.path(namespace), query={"labelSelector": owned}))[
        "items"
    ]
    return states(module, nodes, pods, only=only)


class _Objects:
    """A reflector's sink: objects by name; ``on_change`` hears of every change."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.by_name: dict[str, RawObject] = {}
        self.synced = False
        self._on_change = on_change

    def replace(self, items: list[RawObject], resource_version: str) -> None:
        self.by_name = {objects.name(item): item for item in items}
        self.synced = True
        self._on_change()

    def apply(self, event: listwatch.WatchEvent) -> None:
        if event["type"] == "DELETED":
            self.by_name.pop(objects.name(event["object"]), None)
        elif event["type"] != "BOOKMARK":
            self.by_name[objects.name(event["object"])] = event["object"]
        self._on_change()


class Watcher:
    """Nodes and the Module's pods kept current by watches. The nodes
    ``follow`` names are judged after every single event, so ``steps`` holds
    each step they pass through, however quickly the operator moves them
    (several events may arrive before the caller looks)."""

    def __init__(self, api: client.Client, module: Mapping[str, Any]) -> None:
        self.module = module
        self.changed = asyncio.Event()
        self.steps: collections.deque[NodeState] = collections.deque()
        self._followed: set[str] = set()
        self._said: dict[str, tuple[str, str | None]] = {}
        self._nodes, self._pods = _Objects(self._changed), _Objects(self._changed)
        self._modules = _Objects(self._changed)
        pod_resource, namespace, owned = _pods_of(module)
        self._reflectors = [
            # The Module itself: its status names the pods a move waits on.
            reflecting.Reflector(
                "module",
                listwatch.ApiListWatch(api, writing.MODULES, namespace=namespace),
                self._modules,
                field_selector=f"metadata.name={objects.name(module)}",
            ),
            reflecting.Reflector(
                "nodes", listwatch.ApiListWatch(api, resources.NODES), self._nodes
            ),
            reflecting.Reflector(
                "pods",
                listwatch.ApiListWatch(api, pod_resource, namespace=namespace),
                self._pods,
                label_selector=owned,
            ),
        ]
        self._tasks = tasks.TaskSet("watcher")

    async def __aenter__(self) -> Watcher:
        for reflector in self._reflectors:
            self._tasks.spawn(reflector.run(), name=reflector.name)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._tasks.close()

    def follow(self, nodes: Iterable[str]) -> None:
        """Record the steps of ``nodes`` from now on (and only theirs)."""
        self._followed = set(nodes)
        self._said.clear()
        self.steps.clear()
        self._changed()

    def _changed(self) -> None:
        found = self.states(only=self._followed) if self._followed else None
        for state in found or ():
            # A problem may come at a step already said (the pod's image
            # stops pulling while the node waits for it): that is news too.
            said = (state.step.description, state.problem)
            if self._said.get(state.node) != said:
                self._said[state.node] = said
                self.steps.append(state)
        self.changed.set()

    async def wait(self) -> None:
        """Until the next change (or a failure of a watch, raised)."""
        failed = asyncio.ensure_future(self._tasks.failed.wait())
        changed = asyncio.ensure_future(self.changed.wait())
        try:
            await asyncio.wait({failed, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
            changed.cancel()
        self.changed.clear()
        self._tasks.raise_failure()

    def states(self, *, only: Iterable[str] | None = None) -> list[NodeState] | None:
        """The states now, or None until both lists are in."""
        if not (self._nodes.synced and self._pods.synced):
            return None
        module = self._modules.by_name.get(objects.name(self.module), self.module)
        return states(module, self._nodes.by_name.values(), self._pods.by_name.values(), only=only)


def module_version(module: Mapping[str, Any]) -> str | None:
    """``spec.moduleLoader.container.version`` of a raw Module."""
    loader = (module.get("spec") or {}).get("moduleLoader") or {}
    value = (loader.get("container") or {}).get("version")
    return value if isinstance(value, str) else None
