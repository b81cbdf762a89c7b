"""Raw Kubernetes objects as the API server sends them (JSON dicts), and the few
facts read from every one of them, read in one place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["RawObject", "labels", "name", "namespace", "resource_version"]

#: An object as decoded from the wire; no model classes anywhere in kmm's API path.
RawObject = dict[str, Any]


def _metadata(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    found = (obj or {}).get("metadata")
    return found if isinstance(found, Mapping) else {}


def resource_version(obj: Mapping[str, Any] | None) -> str | None:
    """``metadata.resourceVersion``, or None (absent, empty, or not a string)."""
    value = _metadata(obj).get("resourceVersion")
    return value if isinstance(value, str) and value else None


def name(obj: Mapping[str, Any]) -> str:
    return str(_metadata(obj).get("name") or "")


def namespace(obj: Mapping[str, Any]) -> str | None:
    value = _metadata(obj).get("namespace")
    return value if isinstance(value, str) and value else None


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    found = _metadata(obj).get("labels")
    return found if isinstance(found, Mapping) else {}
