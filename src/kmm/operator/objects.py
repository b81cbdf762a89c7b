"""Helpers shared by the pure object builders: owner references and the spec hash.

A builder returns the *desired* object as raw JSON. Its ``SPEC_HASH``
annotation is a digest of everything the builder set, so a reconciler tells
"unchanged" by comparing one annotation with the observed object instead of
deep-diffing server-defaulted fields (DESIGN §5: a no-op reconcile makes zero
writes). Neighbours: ``loader.builders`` and ``deviceplugin.builders`` use these.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kmm.api import labels, modules

__all__ = ["controller_reference", "observed_hash", "spec_hash", "stamped"]

RawObject = dict[str, Any]


def controller_reference(module: modules.Module) -> RawObject:
    """The Module as controller owner: the garbage collector deletes what it owns."""
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "name": module.metadata.name,
        "uid": module.metadata.uid or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def spec_hash(obj: RawObject) -> str:
    """A digest of a desired object, independent of key order."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def stamped(obj: RawObject) -> RawObject:
    """``obj`` with its ``SPEC_HASH`` annotation set to the digest of the rest."""
    metadata = obj.setdefault("metadata", {})
    annotations = metadata.setdefault("annotations", {})
    annotations.pop(labels.SPEC_HASH, None)
    annotations[labels.SPEC_HASH] = spec_hash(obj)
    return obj


def observed_hash(obj: RawObject) -> str | None:
    """The ``SPEC_HASH`` an observed object carries, if any."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(labels.SPEC_HASH)
    return value if isinstance(value, str) else None
