"""The input hash of a build or sign pod: annotation ``kmm.node.kubernetes.io/last-hash``.

A failed pod is kept, and made again only when what it was made from
changed: the rendered pod (image, builder, build args, mounts ...), the
Dockerfile's text, the resourceVersion of every Secret and ConfigMap it
reads, and the Module's ``imageRebuildTriggerGeneration`` (moving it asks
for a build again, so a failed pod is retried too). A resourceVersion moves
with any change of the object, so a key fixed inside the same Secret retries
the pod although its name did not change. Secret contents never enter the
digest (only their versions).

Pure; ``planner`` compares the digest of the desired pod with the
annotation of the pod it finds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["LAST_HASH", "digest", "of_pod", "stamped"]

LAST_HASH: Final = "kmm.node.kubernetes.io/last-hash"

RawObject = dict[str, Any]


def digest(
    pod: RawObject, *, dockerfile: str = "", versions: Mapping[str, str], trigger: int | None = None
) -> str:
    """The digest of ``pod`` (its own hash annotation left out), the
    Dockerfile text, ``versions`` (``Kind/name`` -> resourceVersion) and the
    ``trigger`` generation (left out when None, so a Module without one, and
    a preflight pod, keeps the digest it had)."""
    metadata = dict(pod.get("metadata") or {})
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k != LAST_HASH}
    metadata["annotations"] = annotations
    document = {
        "pod": {**pod, "metadata": metadata},
        "dockerfile": dockerfile,
        "versions": dict(sorted(versions.items())),
        **({} if trigger is None else {"trigger": trigger}),
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def stamped(pod: RawObject, value: str) -> RawObject:
    """``pod`` with its ``LAST_HASH`` annotation set to ``value`` (a new dict)."""
    metadata = dict(pod.get("metadata") or {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), LAST_HASH: value}
    return {**pod, "metadata": metadata}


def of_pod(pod: Mapping[str, Any]) -> str | None:
    """The ``LAST_HASH`` an observed pod carries, if any."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(LAST_HASH)
    return value if isinstance(value, str) else None
