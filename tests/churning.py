"""A seeded churn of KWOK nodes and Modules, for the churn test and bench (issue 16).

``Churn`` drives one sandbox through random but reproducible changes: nodes
are added, deleted, relabelled (in and out of the Modules' selectors),
cordoned and uncordoned, tainted and untainted, and rebooted into another
kernel (``status.nodeInfo.kernelVersion``); Modules are created, deleted and
changed (selector, kernel mappings, images, device plugin on/off,
tolerations). Every decision comes from ``random.Random(seed)`` and the
churn's own record of what it made, never from what the cluster answers, so
one seed gives one sequence of changes and one final set of objects on any
machine; only the timing varies.

Everything is written through a kubernetes-asyncio client (not kmm's), so the
operator's writes and the churn's never share a counter. Names are never
reused (a Module being finalized cannot collide with a new one).

``tests/expectations.py`` says what the cluster must look like for the
objects the churn leaves; ``tests/integration/test_operator_churn.py`` and
``bench/bench_churn.py`` put the two together.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any, Final

from kubernetes_asyncio import client

from kmm.api import modules
from kmm.sandbox.kwoknodes import nodes

__all__ = [
    "KERNELS",
    "KINDS",
    "NODE_KINDS",
    "TAINT_KEY",
    "Change",
    "Churn",
    "Settings",
]

Obj = dict[str, Any]
MERGE: Final = "application/merge-patch+json"

#: Node kernels: two regexps share images across kernels (6.1.x), one kernel
#: no mapping matches (el8), one with the trailing ``+`` KMM trims.
KERNELS: Final = (
    "6.8.0-45-generic",
    "6.8.0-50-generic",
    "6.1.0-27-amd64",
    "6.1.0-28-amd64",
    "5.14.0-427.el9.x86_64+",
    "6.11.0-1009-aws",
    "4.18.0-553.el8_10.x86_64",
)
POOL: Final = "churn.kmm.test/pool"
GPU: Final = "churn.kmm.test/gpu"
POOLS: Final = ("a", "b", "c")
TAINT_KEY: Final = "kmm-churn"
_TAINT: Final = {"key": TAINT_KEY, "value": "x", "effect": "NoSchedule"}
_TOLERATION: Final = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}

# Selectors a Module picks from: every churn node, one pool, the gpu nodes, both.
SELECTORS: Final[tuple[dict[str, str], ...]] = (
    {"type": "kwok"},
    {POOL: "a"},
    {POOL: "b"},
    {POOL: "c"},
    {GPU: "yes"},
    {POOL: "a", GPU: "yes"},
)
# Kernel mappings a Module picks an ordered subset of ("{tag}" is the
# Module's image generation; without containerImage the container's applies).
MAPPINGS: Final[tuple[Obj, ...]] = (
    {"literal": "6.8.0-45-generic", "containerImage": "example.com/churn/literal:${KERNEL_XYZ}-{tag}"},
    {"regexp": r"^6\.8\."},
    {"regexp": r"^6\.1\.\d+-\d+-amd64$", "containerImage": "example.com/churn/debian:${KERNEL_X}.${KERNEL_Y}-{tag}"},
    {"regexp": r"\.el9\.x86_64$"},
    {"regexp": r"-aws$", "containerImage": "example.com/churn/aws:$KERNEL_FULL_VERSION-{tag}"},
    {"regexp": r"^[56]\."},
)  # fmt: skip
_DEFAULT_IMAGE: Final = "example.com/churn/${MOD_NAME}:${KERNEL_FULL_VERSION}-{tag}"
_PLUGIN_IMAGE: Final = "example.com/churn/plugin:v1"

# How often each change is drawn, relative to the others.
_WEIGHTS: Final = {
    "node-add": 1.0,
    "node-delete": 1.0,
    "node-relabel": 3.0,
    "node-cordon": 1.5,
    "node-taint": 1.5,
    "node-kernel": 2.0,
    "module-create": 0.4,
    "module-delete": 0.3,
    "module-selector": 0.6,
    "module-mappings": 0.6,
    "module-image": 0.6,
    "module-plugin": 0.6,
    "module-tolerations": 0.5,
}
KINDS: Final = frozenset(_WEIGHTS)
NODE_KINDS: Final = frozenset(k for k in KINDS if k.startswith("node-"))


@dataclasses.dataclass(frozen=True)
class Settings:
    """Bounds of the churn: nodes and Modules never leave them."""

    seed: int
    namespace: str
    min_nodes: int = 30
    max_nodes: int = 50
    max_modules: int = 5
    # Seconds between two changes, drawn uniformly.
    pause: tuple[float, float] = (0.2, 0.6)


@dataclasses.dataclass(frozen=True)
class Change:
    """One write of the churn: what (``kind``), to which node or Module
    (``target``), when it returned (event-loop time) and the
    ``resourceVersion`` it produced ("" for a delete)."""

    kind: str
    target: str
    at: float
    resource_version: str


@dataclasses.dataclass
class _Node:
    kernel: str
    pool: str
    gpu: bool
    cordoned: bool = False
    tainted: bool = False


@dataclasses.dataclass
class _Module:
    selector: dict[str, str]
    mappings: list[int]
    tag: int = 1
    plugin: bool = False
    tolerate: bool = False


class Churn:
    """The churn's own record of the nodes and Modules it made, and its changes."""

    def __init__(self, api: client.ApiClient, settings: Settings) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.nodes: dict[str, _Node] = {}
        self.modules: dict[str, _Module] = {}
        self.changes: list[Change] = []
        self._serial = collections.Counter[str]()

    def _name(self, prefix: str) -> str:
        self._serial[prefix] += 1
        return f"{prefix}{self._serial[prefix]}"

    # -- bodies ---------------------------------------------------------

    def module_body(self, name: str) -> Obj:
        state = self.modules[name]
        tag = f"v{state.tag}"
        mappings = []
        for index in state.mappings:
            mapping = dict(MAPPINGS[index])
            if "containerImage" in mapping:
                mapping["containerImage"] = mapping["containerImage"].replace("{tag}", tag)
            mappings.append(mapping)
        return {
            "apiVersion": modules.API_VERSION,
            "kind": modules.KIND,
            "metadata": {"name": name, "namespace": self.settings.namespace},
            "spec": {
                "selector": dict(state.selector),
                "moduleLoader": {
                    "container": {
                        "modprobe": {"moduleName": "churn_mod"},
                        "containerImage": _DEFAULT_IMAGE.replace("{tag}", tag),
                        "kernelMappings": mappings,
                    }
                },
                **({"tolerations": [dict(_TOLERATION)]} if state.tolerate else {}),
                **(
                    {"devicePlugin": {"container": {"image": _PLUGIN_IMAGE}}}
                    if state.plugin
                    else {}
                ),
            },
        }

    def _node_body(self, name: str) -> Obj:
        state = self.nodes[name]
        body = nodes.node_body(name, state.kernel)
        body["metadata"]["labels"][POOL] = state.pool
        if state.gpu:
            body["metadata"]["labels"][GPU] = "yes"
        return body

    def node_object(self, name: str) -> Obj:
        """The node as the churn has made it: labels, kernel, cordon and taint."""
        state = self.nodes[name]
        body = self._node_body(name)
        body["spec"] = {
            "unschedulable": state.cordoned,
            "taints": [dict(_TAINT)] if state.tainted else [],
        }
        return body

    def _random_module(self) -> _Module:
        count = self.rng.randint(1, 3)
        return _Module(
            selector=dict(self.rng.choice(SELECTORS)),
            mappings=self.rng.sample(range(len(MAPPINGS)), count),
            plugin=self.rng.random() < 0.5,
            tolerate=self.rng.random() < 0.5,
        )

    # -- writes ---------------------------------------------------------

    def _record(self, kind: str, target: str, answer: Any) -> Change:
        if isinstance(answer, dict):
            version = str((answer.get("metadata") or {}).get("resourceVersion") or "")
        else:
            version = str(getattr(getattr(answer, "metadata", None), "resource_version", "") or "")
        change = Change(kind, target, asyncio.get_running_loop().time(), version)
        self.changes.append(change)
        return change

    async def add_node(self, *, record: bool = True) -> Change | None:
        name = self._name("churn-node-")
        self.nodes[name] = _Node(
            kernel=self.rng.choice(KERNELS),
            pool=self.rng.choice(POOLS),
            gpu=self.rng.random() < 0.4,
        )
        answer = await self.core.create_node(self._node_body(name))
        return self._record("node-add", name, answer) if record else None

    async def create_module(self, *, record: bool = True) -> Change | None:
        name = self._name("m")
        self.modules[name] = self._random_module()
        answer = await self.custom.create_namespaced_custom_object(
            modules.GROUP,
            modules.VERSION,
            self.settings.namespace,
            modules.PLURAL,
            self.module_body(name),
        )
        return self._record("module-create", name, answer) if record else None

    async def _patch_node(self, kind: str, name: str, body: Obj) -> Change:
        return self._record(kind, name, await self.core.patch_node(name, body))

    async def _set_taint(self, name: str, tainted: bool) -> Change:
        """Replace the churn's taint and keep the others (the node lifecycle
        controller's ``unschedulable`` taint): ``spec.taints`` is replaced
        whole by any patch, so read, change, and write under the
        resourceVersion read."""
        while True:
            node = await self.core.read_node(name)
            kept = [
                {"key": t.key, "value": t.value, "effect": t.effect}
                for t in node.spec.taints or ()
                if t.key != TAINT_KEY
            ]
            body = {
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": [*kept, dict(_TAINT)] if tainted else kept},
            }
            try:
                return await self._patch_node("node-taint", name, body)
            except client.ApiException as err:
                if err.status != 409:
                    raise

    async def _patch_module(self, kind: str, name: str, spec: Obj) -> Change:
        answer = await self.custom.patch_namespaced_custom_object(
            modules.GROUP,
            modules.VERSION,
            self.settings.namespace,
            modules.PLURAL,
            name,
            {"spec": spec},
            _content_type=MERGE,
        )
        return self._record(kind, name, answer)

    def _possible(self, kind: str) -> bool:
        node_count, module_count = len(self.nodes), len(self.modules)
        if kind == "node-add":
            return node_count < self.settings.max_nodes
        if kind == "node-delete":
            return node_count > self.settings.min_nodes
        if kind.startswith("node-"):
            return node_count > 0
        if kind == "module-create":
            return module_count < self.settings.max_modules
        if kind == "module-delete":
            return module_count > 1
        return module_count > 0

    async def step(self) -> Change:
        """One change, drawn by weight among those the bounds allow."""
        kinds = [k for k in _WEIGHTS if self._possible(k)]
        kind = self.rng.choices(kinds, weights=[_WEIGHTS[k] for k in kinds])[0]
        if kind == "node-add":
            change = await self.add_node()
            assert change is not None
            return change
        if kind == "module-create":
            change = await self.create_module()
            assert change is not None
            return change
        if kind.startswith("node-"):
            name = self.rng.choice(sorted(self.nodes))
            return await self._node_change(kind, name)
        name = self.rng.choice(sorted(self.modules))
        return await self._module_change(kind, name)

    async def _node_change(self, kind: str, name: str) -> Change:
        state = self.nodes[name]
        if kind == "node-delete":
            del self.nodes[name]
            await self.core.delete_node(name)
            return self._record(kind, name, None)
        if kind == "node-relabel":
            if self.rng.random() < 0.5:
                state.pool = self.rng.choice([p for p in POOLS if p != state.pool])
                labels: dict[str, str | None] = {POOL: state.pool}
            else:
                state.gpu = not state.gpu
                labels = {GPU: "yes" if state.gpu else None}
            return await self._patch_node(kind, name, {"metadata": {"labels": labels}})
        if kind == "node-cordon":
            state.cordoned = not state.cordoned
            body = {"spec": {"unschedulable": True if state.cordoned else None}}
            return await self._patch_node(kind, name, body)
        if kind == "node-taint":
            state.tainted = not state.tainted
            return await self._set_taint(name, state.tainted)
        # node-kernel: a reboot into another kernel, as the kubelet reports it.
        state.kernel = self.rng.choice([k for k in KERNELS if k != state.kernel])
        answer = await self.core.patch_node_status(
            name, {"status": {"nodeInfo": {"kernelVersion": state.kernel}}}
        )
        return self._record(kind, name, answer)

    async def _module_change(self, kind: str, name: str) -> Change:
        state = self.modules[name]
        if kind == "module-delete":
            del self.modules[name]
            await self.custom.delete_namespaced_custom_object(
                modules.GROUP, modules.VERSION, self.settings.namespace, modules.PLURAL, name
            )
            return self._record(kind, name, None)
        if kind == "module-selector":
            dropped = dict.fromkeys(state.selector)
            state.selector = dict(self.rng.choice([s for s in SELECTORS if s != state.selector]))
            # A merge patch merges maps: a key the new selector lacks goes only as null.
            selector = {**dropped, **state.selector}
            return await self._patch_module(kind, name, {"selector": selector})
        if kind in ("module-mappings", "module-image"):
            if kind == "module-mappings":
                state.mappings = self.rng.sample(range(len(MAPPINGS)), self.rng.randint(1, 3))
            else:
                state.tag += 1
            loader = self.module_body(name)["spec"]["moduleLoader"]
            return await self._patch_module(kind, name, {"moduleLoader": loader})
        if kind == "module-plugin":
            state.plugin = not state.plugin
            plugin = {"container": {"image": _PLUGIN_IMAGE}} if state.plugin else None
            return await self._patch_module(kind, name, {"devicePlugin": plugin})
        state.tolerate = not state.tolerate
        tolerations = [dict(_TOLERATION)] if state.tolerate else None
        return await self._patch_module(kind, name, {"tolerations": tolerations})

    # -- runs -----------------------------------------------------------

    async def populate(self, node_count: int, module_count: int) -> None:
        """The starting cluster (not counted as changes)."""
        for _ in range(node_count):
            await self.add_node(record=False)
        for _ in range(module_count):
            await self.create_module(record=False)

    async def run(
        self, count: int, *, on_change: Callable[[Change], None] = lambda _c: None
    ) -> Sequence[Change]:
        """``count`` changes, one after another with a drawn pause between
        two: a fixed number, so one seed leaves the same objects on any
        machine (the pauses, about 0.4 s each, make the run's length)."""
        done: list[Change] = []
        for _ in range(count):
            change = await self.step()
            done.append(change)
            on_change(change)
            await asyncio.sleep(self.rng.uniform(*self.settings.pause))
        return done
