"""The Kubernetes-defined objects kmm's APIs embed, typed for what kmm reads.

``ObjectMeta`` and ``Condition`` (meta/v1) serve both the Module and the
PreflightValidation; ``Toleration`` and ``LocalObjectReference`` (core/v1)
are a Module's scheduling and pull secret. Each keeps the keys kmm does not
type (``models.KubeModel``), so a newer Kubernetes field passes through.
Objects whose fields kmm limits (volumes, host paths) live with the spec
that limits them (:mod:`kmm.api.devices`).
"""

from __future__ import annotations

from typing import Literal

from kmm.api import models

__all__ = ["Condition", "LocalObjectReference", "ObjectMeta", "Toleration"]


class Toleration(models.KubeModel):
    """core/v1 Toleration, typed because the operator decides schedulability with it."""

    # Plain strings: "" is meaningful (an empty effect tolerates every effect)
    # and the pod's own validation judges the rest.
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


class LocalObjectReference(models.KubeModel):
    """core/v1 LocalObjectReference (the image pull secret)."""

    name: str


class Condition(models.KubeModel):
    """meta/v1 Condition: Ready / Progressing / Degraded with reasons."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class ObjectMeta(models.KubeModel):
    """meta/v1 ObjectMeta: the few fields kmm reads; the rest kept as extras."""

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    finalizers: list[str] | None = None
    deletion_timestamp: str | None = None
