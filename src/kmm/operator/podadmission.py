"""Whether the pods of a Module's DaemonSets are let in (the I/O of one look).

The API server accepts a DaemonSet whatever its pods would be: Pod Security
enforces on pods (``baseline`` and ``restricted`` refuse the privileged
pods kmm makes), a ResourceQuota counts pods, a missing service account or
a namespace being deleted refuses them. The DaemonSet controller's creates
fail, it says so only in Events, and the Module would stay Progressing.

``PodAdmission.refusals`` looks at the Module's cached DaemonSets. One whose
pods lag (``desiredNumberScheduled`` above ``currentNumberScheduled``) with
the same numbers for ``patience`` seconds (a rollout or a node joining moves
them sooner) has its pod template (one GET of the DaemonSet) created in a
dry run: admission answers, nothing is stored. A refusal is the Module's
``PodRefused`` problem while the lag lasts. The answer is kept per
DaemonSet uid, spec hash and numbers, so it is asked again only when one of
them changes (a node joins: the quota may be full by now). A converged
Module's DaemonSets do not lag: they cost no request.

Chosen over the DaemonSet controller's ``FailedCreate`` Events: those need
the operator to list Events (it only creates them), outlive the cause by an
hour, and say nothing after a restart that a dry run would not. The dry run
needs nothing new: the operator creates pods (build and sign) and reads
DaemonSets already. What a dry run cannot see: a refusal of the pod on one
node only (the controller adds node affinity and tolerations), and quota
used up between the dry run and the controller's next try.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

from kmm.api import conditions
from kmm.operator import failures, objects, status

__all__ = ["PATIENCE", "Checked", "DryRunner", "PodAdmission", "Reader", "template_pod"]

RawObject = dict[str, Any]

# Seconds a DaemonSet's pod counts must stand still before its template is
# tried: the controller makes pods within a second of a change.
PATIENCE: Final = 5.0


class Reader(Protocol):
    async def get(self, kind: str, namespace: str, name: str) -> RawObject | None: ...


class DryRunner(Protocol):
    async def dry_run_pod(self, pod: RawObject) -> None: ...


@dataclasses.dataclass(frozen=True)
class Checked:
    """The refusals found, by DaemonSet name, and when to look again (a lag
    not yet old enough)."""

    refused: dict[str, status.Problem] = dataclasses.field(default_factory=dict)
    requeue_after: float | None = None


@dataclasses.dataclass
class _Look:
    numbers: tuple[str | None, int, int]  # spec hash, desired, current
    since: float
    asked: bool = False
    refusal: str | None = None


def template_pod(daemonset: Mapping[str, Any]) -> RawObject:
    """A pod of ``daemonset``'s template, as its controller would create it
    (less the node it binds it to), named by the server."""
    metadata = daemonset["metadata"]
    template = daemonset["spec"]["template"]
    meta = template.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{metadata['name']}-",
            "namespace": metadata["namespace"],
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": template["spec"],
    }


def _numbers(daemonset: Mapping[str, Any]) -> tuple[str | None, int, int]:
    found = daemonset.get("status") or {}
    return (
        objects.observed_hash(dict(daemonset)),
        int(found.get("desiredNumberScheduled") or 0),
        int(found.get("currentNumberScheduled") or 0),
    )


class PodAdmission:
    def __init__(
        self,
        reader: Reader,
        runner: DryRunner,
        *,
        patience: float = PATIENCE,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = reader
        self.runner = runner
        self.patience = patience
        self.monotonic = monotonic
        # Per Module key, per DaemonSet uid: the last look at its numbers.
        self._looks: dict[str, dict[str, _Look]] = {}

    def forget(self, key: str) -> None:
        self._looks.pop(key, None)

    def __len__(self) -> int:
        return sum(len(looks) for looks in self._looks.values())

    async def refusals(self, key: str, daemonsets: Iterable[Mapping[str, Any]]) -> Checked:
        """The refusals of the pods of ``daemonsets`` (the Module's, cached)."""
        before = self._looks.get(key, {})
        looks: dict[str, _Look] = {}
        found = Checked()
        wait: list[float] = []
        now = self.monotonic()
        for daemonset in daemonsets:
            metadata = daemonset.get("metadata") or {}
            uid = str(metadata.get("uid") or "")
            numbers = _numbers(daemonset)
            if not uid or metadata.get("deletionTimestamp") or numbers[1] <= numbers[2]:
                continue
            look = before.get(uid)
            if look is None or look.numbers != numbers:
                look = _Look(numbers, since=now)
            looks[uid] = look
            if not look.asked:
                left = look.since + self.patience - now
                if left > 0:
                    wait.append(left)
                    continue
                look.refusal = await self._ask(metadata)
                look.asked = True
            if look.refusal is not None:
                name = str(metadata.get("name"))
                found.refused[name] = status.Problem(
                    conditions.REASON_POD_REFUSED,
                    f"the pods of DaemonSet {name} are refused: {look.refusal}",
                )
        if looks:
            self._looks[key] = looks
        else:
            self._looks.pop(key, None)
        return dataclasses.replace(found, requeue_after=min(wait) if wait else None)

    async def _ask(self, metadata: Mapping[str, Any]) -> str | None:
        """The refusal of a dry-run pod of the DaemonSet, None if admitted
        (or if the DaemonSet is gone: its deletion comes as an event)."""
        namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
        with failures.step(f"reading DaemonSet {name}"):
            daemonset = await self.reader.get("DaemonSet", namespace, name)
        if daemonset is None:
            return None
        try:
            with failures.step(f"trying a pod of DaemonSet {name}"):
                await self.runner.dry_run_pod(template_pod(daemonset))
        except Exception as err:
            if not failures.refused(err):
                raise
            return failures.refusal(err)
        return None
