"""The bases every model of kmm's APIs derives from.

``Model`` is kmm's own objects: KMM's camelCase wire names (alias
generator) with Python's snake_case names, both accepted on input
(``populate_by_name``) and aliases written on output; unknown keys are
errors; instances are frozen. ``KubeModel`` is for Kubernetes-defined
sub-objects (:mod:`kmm.api.kubeobjects`), whose fields may grow: it keeps
unknown keys. A class's ``cel_rules`` are its cross-field CEL rules, which
:mod:`kmm.api.crd` renders beside the fields' own (:mod:`kmm.api.fields`).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from kmm.api import cel

__all__ = ["KubeModel", "Model"]


class Model(BaseModel):
    """Base for kmm's own API objects: camelCase wire names, unknown keys refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
    )
    # CEL rules on the object itself (cross-field), rendered by kmm.api.crd.
    cel_rules: ClassVar[tuple[cel.Rule, ...]] = ()


class KubeModel(Model):
    """Base for Kubernetes-defined sub-objects: their fields may grow, keep extras."""

    model_config = ConfigDict(extra="allow")
