"""The churn bench's baseline: the writes the spec says the churn's changes need.

``bench_churn.py`` compares the operator's API writes with this count. Its
inputs are what the churn did and what the cluster itself did, never what
the operator wrote (an operator that rewrote or recreated its own objects
would otherwise raise its own baseline):

- the churn's changes: each node and Module as the churn made it (its own
  record, ``tests/churning.py``), in the order etcd applied the writes
  (their revisions);
- the daemon pods the cluster placed on a node and made Ready (DaemonSet
  controller, scheduler, KWOK), from a watch on pods: a pod joins the
  model's view when the model wants a pod of its kind (Module, role, kernel,
  image) on that node at that moment, and leaves it when the model stops
  wanting one there. The cluster's removals are not read: those a change
  causes follow from the change (a node relabelled out of a selector, a
  kernel with another image), and the others (a DaemonSet the operator
  deleted and made again) are the operator's doing. One removal does follow
  from an ideal operator's write: a device-plugin DaemonSet whose template
  changes is rolled (it is not ``OnDelete``), so its pods in the view stop
  being Ready until the cluster reports a new one Ready.

After each input the model (``tests/expectations.py``) is evaluated and one
write is counted per change of its outputs: a node's required labels (a new
node's only when it needs any; a ``kernel-version.full`` the spec lets a
node keep is not counted as removed), a DaemonSet wanted, changed or no longer
wanted (those of a deleted Module too: the operator deletes them itself, in
seed 003's order, and keeps the finalizer until their pods are gone), plus a
finalizer write per Module created or deleted. Status patches and
Events have no baseline (how often counts are worth writing is policy).
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import expectations

from kmm.api import labels
from kmm.kube import objects
from kmm.runtime import stores

__all__ = ["Input", "baseline"]

Obj = dict[str, Any]
Kind = Literal["nodes", "modules", "pods"]


@dataclasses.dataclass(frozen=True)
class Input:
    """One thing that happened at ``revision``: a node or Module as the churn
    made it, or a pod (``name``: its namespace/name) as the cluster reported
    it; ``body`` None: deleted."""

    revision: int
    kind: Kind
    name: str
    body: Obj | None


def _identity_key(node: str, identity: Mapping[str, str]) -> str:
    return json.dumps([node, dict(identity)], sort_keys=True)


@dataclasses.dataclass
class _ViewPod:
    node: str
    identity: Mapping[str, str]
    ready: bool

    def as_pod(self) -> Obj:
        conditions = [{"type": "Ready", "status": "True"}] if self.ready else []
        return {
            "metadata": {"labels": dict(self.identity)},
            "spec": {"nodeName": self.node},
            "status": {"conditions": conditions},
        }


class _Model:
    """The nodes, Modules and pods the model reads, and its last outputs."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.nodes: dict[str, Obj] = {}
        self.modules: dict[str, Obj] = {}
        self.view: dict[str, _ViewPod] = {}
        self.expected = expectations.Expected()

    def evaluate(self) -> expectations.Expected:
        """The model's outputs, pods it no longer wants dropped from the view
        (until none is: a dropped pod may be what kept a node counted)."""
        while True:
            snapshot = expectations.Snapshot(
                namespace=self.namespace,
                modules=list(self.modules.values()),
                nodes=list(self.nodes.values()),
                daemonsets=[],
                pods=[p.as_pod() for p in self.view.values()],
            )
            expected = expectations.expect(snapshot)
            wanted = {
                _identity_key(node, identity)
                for node, identities in expected.pods.items()
                for identity in identities
            }
            unwanted = [key for key in self.view if key not in wanted]
            for key in unwanted:
                del self.view[key]
            if not unwanted:
                self.expected = expected
                return expected

    def observe_pod(self, pod: Mapping[str, Any]) -> bool:
        """A pod the cluster placed or made Ready joins the view if the model
        wants one of its kind there; True if the view changed."""
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return False
        have = objects.labels(pod)
        ready = expectations.is_ready(pod)
        for identity in self.expected.pods.get(node, ()):
            if all(have.get(k) == v for k, v in identity.items()):
                key = _identity_key(node, identity)
                known = self.view.get(key)
                if known is None:
                    self.view[key] = _ViewPod(node, identity, ready)
                    return True
                if ready and not known.ready:
                    known.ready = True
                    return True
                return False
        return False

    def roll(self, identities: Iterable[str]) -> None:
        """Pods of these (non-``OnDelete``) DaemonSets are being replaced."""
        rolled = set(identities)
        for pod in self.view.values():
            if json.dumps(dict(pod.identity), sort_keys=True) in rolled:
                pod.ready = False


def _daemonsets(expected: expectations.Expected) -> tuple[dict[str, str], set[str]]:
    """Each wanted DaemonSet's spec (by identity), and the identities of
    those that roll their pods."""
    wanted = {
        json.dumps(dict(w.identity), sort_keys=True): json.dumps(
            [w.image, dict(w.node_selector), list(w.tolerations)], sort_keys=True
        )
        for w in expected.daemonsets
    }
    rolling = {
        json.dumps(dict(w.identity), sort_keys=True) for w in expected.daemonsets if not w.on_delete
    }
    return wanted, rolling


def _node_labels(
    expected: expectations.Expected, before: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, str]]:
    """The operator labels each node carries once they are right: the
    required ones, and a ``kernel-version.full`` no longer required kept
    while the spec allows it (it never asks for that label to go)."""
    found = {}
    for node, required in expected.labels.items():
        now = dict(required)
        kept = before.get(node, {}).get(labels.KERNEL_VERSION_FULL)
        allowed = expected.allowed.get(node, {}).get(labels.KERNEL_VERSION_FULL)
        if labels.KERNEL_VERSION_FULL not in now and kept is not None and kept == allowed:
            now[labels.KERNEL_VERSION_FULL] = kept
        found[node] = now
    return found


def baseline(
    namespace: str,
    start: Mapping[Kind, Sequence[Obj]],
    inputs: Sequence[Input],
    *,
    finalizers: int,
) -> dict[str, int]:
    """The writes an operator owes for ``inputs`` from the state ``start``
    (nodes and Modules as the churn made them, pods as the cluster had
    them); ``finalizers``: Modules created or deleted by the churn."""
    model = _Model(namespace)
    model.nodes = {objects.name(n): n for n in start["nodes"]}
    model.modules = {objects.name(m): m for m in start["modules"]}
    model.evaluate()
    seen = {stores.key_of(pod): _placement(pod) for pod in start["pods"]}
    # A device plugin's pod is wanted only once its node's loader pod is in the view.
    while any([model.observe_pod(pod) for pod in start["pods"]]):
        model.evaluate()
    expected = model.evaluate()
    carried, (wanted, _) = _node_labels(expected, {}), _daemonsets(expected)
    found = collections.Counter[str]()
    ordered = sorted(inputs, key=lambda i: i.revision)
    for index, item in enumerate(ordered):
        if item.kind == "pods":
            placement = None if item.body is None else _placement(item.body)
            if seen.get(item.name) == placement:
                continue  # not a transition: the pod was placed, Ready or gone already
            seen[item.name] = placement
            if item.body is None or not model.observe_pod(item.body):
                continue
        else:
            into = model.nodes if item.kind == "nodes" else model.modules
            if item.body is None:
                into.pop(item.name, None)
            else:
                into[item.name] = item.body
        if index + 1 < len(ordered) and ordered[index + 1].revision == item.revision:
            continue  # one revision, one state (a relist's pods)
        expected = model.evaluate()
        carried_now, (wanted_now, rolling) = _node_labels(expected, carried), _daemonsets(expected)
        found["node label patch"] += _label_writes(carried, carried_now)
        changed = [
            key
            for key in wanted.keys() | wanted_now.keys()
            if wanted.get(key) != wanted_now.get(key)
        ]
        found["DaemonSet write"] += len(changed)
        rolled = [key for key in changed if key in rolling and key in wanted]
        if rolled:
            model.roll(rolled)
            carried = carried_now
            carried_now = _node_labels(model.evaluate(), carried)
            found["node label patch"] += _label_writes(carried, carried_now)
        carried, wanted = carried_now, wanted_now
    found["finalizer"] = finalizers
    return dict(found)


def _placement(pod: Mapping[str, Any]) -> tuple[str, bool] | None:
    """(node, Ready) of a live placed pod; None for one unplaced or going."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    return str(node), expectations.is_ready(pod)


def _label_writes(
    before: Mapping[str, Mapping[str, str]], after: Mapping[str, Mapping[str, str]]
) -> int:
    """Nodes whose labels changed (a new node's: only if it needs any)."""
    return sum(value != before.get(node, {}) for node, value in after.items())
