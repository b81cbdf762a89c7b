"""Markers that tie a model field to its CRD rendering.

The API's models (:mod:`kmm.api.modules` and its sections, :mod:`kmm.api.preflight`)
and field types (:mod:`kmm.api.fields`) attach these in ``Annotated`` metadata or as
class-level rules; :mod:`kmm.api.crd` reads them. Pydantic ignores them, so
each marker's Python-side twin is a validator beside it: one place states a
rule in both languages.
"""

from __future__ import annotations

import dataclasses

__all__ = ["PassThrough", "Rule", "SchemaExtra"]


@dataclasses.dataclass(frozen=True)
class Rule:
    """One ``x-kubernetes-validations`` entry (CEL, evaluated by the apiserver)."""

    rule: str
    message: str
    field_path: str | None = None


@dataclasses.dataclass(frozen=True)
class PassThrough:
    """A Kubernetes sub-object passed to pods unchanged: rendered as a
    ``x-kubernetes-preserve-unknown-fields`` object (or list of them), left to
    the pod's own validation."""


@dataclasses.dataclass(frozen=True)
class SchemaExtra:
    """Schema keywords merged verbatim into the field's rendering (e.g. list types)."""

    keywords: tuple[tuple[str, object], ...]
