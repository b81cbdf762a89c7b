"""The input hash of a build, sign or preflight pod: annotation ``last-hash``.

A pod is replaced only when what it was made from changed: the rendered pod
(image, builder, build args, mounts, where it may run, the registry CA ...),
the image it pushes, the Dockerfile's text, the resourceVersion of every
Secret and ConfigMap it reads, and the Module's
``imageRebuildTriggerGeneration`` (moving it asks for a build again, so a
failed pod is retried too). A resourceVersion moves with any change of the
object, so a key fixed inside the same Secret replaces the pod although its
name did not change. Secret contents never enter the digest (only their
versions).

``made_of`` names those parts; ``stamp`` writes their digest
(``labels.LAST_HASH``) and the parts themselves (``labels.LAST_INPUTS``,
digests and versions only: nothing secret, a few hundred bytes) on the pod,
so that ``changes`` can say which of them moved when a pod is replaced.
Pure; the planners compare the digest of the desired pod with the one the
observed pod carries.

An image's hashes (``image_build_hash``, ``image_sign_hash``) are digests
too, of a narrower set: what the image's content is made of
(``images`` says which parts and why). They are written into the image's
config as labels, which anyone who can pull the image reads: Secrets enter
them by resourceVersion only, never by content, as here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from kmm.api import labels

__all__ = ["changes", "image_build_hash", "image_sign_hash", "made_of", "of_pod", "stamp"]

RawObject = dict[str, Any]

_POD: Final = "pod"
_IMAGE: Final = "image"
_DOCKERFILE: Final = "Dockerfile"
_TRIGGER: Final = "imageRebuildTriggerGeneration"
_STAMPS: Final = (labels.LAST_HASH, labels.LAST_INPUTS)


def _sha(document: object) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def made_of(
    pod: RawObject,
    *,
    pushes: str,
    dockerfile: str = "",
    versions: Mapping[str, str],
    trigger: int | None = None,
) -> dict[str, str]:
    """The parts ``pod`` is made from: a digest of the pod (its stamps left
    out), the image it ``pushes``, a digest of the Dockerfile (when it
    builds), each input's resourceVersion (``Kind/name`` -> version) and the
    ``trigger`` generation (when set)."""
    metadata = dict(pod.get("metadata") or {})
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k not in _STAMPS}
    metadata["annotations"] = annotations
    found = {_POD: _sha({**pod, "metadata": metadata}), _IMAGE: pushes}
    if dockerfile:
        found[_DOCKERFILE] = _sha(dockerfile)
    found.update(sorted(versions.items()))
    if trigger is not None:
        found[_TRIGGER] = str(trigger)
    return found


def image_build_hash(
    *, dockerfile: str, build_args: Sequence[tuple[str, str]], secrets: Mapping[str, str]
) -> str:
    """The build's hash an image carries: its Dockerfile's text, its build
    arguments in order, and each build secret's resourceVersion by name."""
    return _sha(
        {
            _DOCKERFILE: _sha(dockerfile),
            "buildArgs": [list(pair) for pair in build_args],
            "secrets": dict(sorted(secrets.items())),
        }
    )


def image_sign_hash(*, source: str, files: Sequence[str], dir_name: str) -> str:
    """The sign's hash an image carries: what it signed (the build's hash,
    or the ``unsignedImage`` someone else pushes), ``filesToSign`` and
    ``dirName`` (the certificate is a label of its own)."""
    return _sha({"source": source, "filesToSign": list(files), "dirName": dir_name})


def stamp(pod: RawObject, parts: Mapping[str, str]) -> RawObject:
    """``pod`` (a new dict) carrying the digest of ``parts`` and the parts."""
    metadata = dict(pod.get("metadata") or {})
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        labels.LAST_HASH: _sha(dict(parts)),
        labels.LAST_INPUTS: json.dumps(dict(parts), sort_keys=True, separators=(",", ":")),
    }
    return {**pod, "metadata": metadata}


def _annotation(pod: Mapping[str, Any], key: str) -> str | None:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(key)
    return value if isinstance(value, str) else None


def of_pod(pod: Mapping[str, Any]) -> str | None:
    """The ``LAST_HASH`` an observed pod carries, if any."""
    return _annotation(pod, labels.LAST_HASH)


def _parts(pod: Mapping[str, Any]) -> dict[str, str] | None:
    try:
        found = json.loads(_annotation(pod, labels.LAST_INPUTS) or "")
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    return {str(k): str(v) for k, v in found.items()}


def _phrase(part: str, before: str | None, after: str | None) -> str:
    if part == _POD:
        return "the pod's spec"
    if part == _IMAGE:
        return f"the image it pushes ({before} -> {after})"
    if part == _DOCKERFILE:
        return "the Dockerfile"
    if part == _TRIGGER:
        return "imageRebuildTriggerGeneration"
    kind, _, name = part.partition("/")
    if before is None:
        return f"{kind} {name} (new)"
    if after is None:
        return f"{kind} {name} (no longer read)"
    return f"{kind} {name}"


def changes(observed: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """What differs between what ``observed`` and ``wanted`` are made of, in
    words ("the Dockerfile", "Secret key" ...); ["its inputs"] when the
    observed pod does not say (made by an older operator)."""
    before, after = _parts(observed), _parts(wanted)
    if before is None or after is None:
        return ["its inputs"]
    moved = [p for p in dict.fromkeys([*after, *before]) if before.get(p) != after.get(p)]
    return [_phrase(p, before.get(p), after.get(p)) for p in moved] or ["its inputs"]
