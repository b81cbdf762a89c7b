"""What a validation says of each Module, and the Modules it judges (pure).

A ``Verdict`` is one ``status.modules[]`` entry without its transition
time (``status`` adds that). ``subjects`` resolves the cached Modules for the
validation's kernel (``preflight.kernel``: one trailing ``+`` trimmed):
a Module without ``moduleLoader`` needs no image (Success), one whose
mapping matches nothing fails (``mapping not found``), one that cannot be
parsed, or whose image cannot be expanded for the kernel, fails naming why;
the rest carry a ``kernels.Target`` for ``planner`` to judge. A Module being
deleted is left out, as a deleted one is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from kmm.api import kernels, modules, preflight, validation

__all__ = ["Subject", "Verdict", "failure", "in_progress", "subjects", "success"]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One Module's entry, without its transition time."""

    status: preflight.Status
    stage: preflight.Stage
    reason: str
    image: str | None = None
    pod: str | None = None


def success(reason: str, **more: Any) -> Verdict:
    return Verdict("Success", "Done", reason, **more)


def failure(reason: str, **more: Any) -> Verdict:
    return Verdict("Failure", "Done", reason, **more)


def in_progress(reason: str = preflight.REASON_IN_PROGRESS, **more: Any) -> Verdict:
    return Verdict("InProgress", "Image", reason, **more)


@dataclasses.dataclass(frozen=True)
class Subject:
    """One Module as a validation sees it: its target for the kernel, or a
    verdict reached without the registry or a pod."""

    namespace: str
    name: str
    module: modules.Module | None = None
    target: kernels.Target | None = None
    verdict: Verdict | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def makes(self) -> bool:
        """Whether a missing image is built or signed."""
        target = self.target
        return target is not None and (target.build is not None or target.sign is not None)


def subjects(kernel: str, found: Iterable[Mapping[str, Any]]) -> list[Subject]:
    """Every Module (raw, as cached) that is not being deleted, resolved for
    ``kernel`` (trimmed), sorted by namespace and name."""
    out: list[Subject] = []
    for raw in found:
        metadata = raw.get("metadata") or {}
        if metadata.get("deletionTimestamp"):
            continue  # going: it leaves the status as a deleted one does
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        out.append(_subject(kernel, raw, namespace, name))
    return sorted(out, key=lambda s: (s.namespace, s.name))


def _subject(kernel: str, raw: Mapping[str, Any], namespace: str, name: str) -> Subject:
    try:
        module = validation.parse_module(raw)
    except validation.InvalidModuleError as err:
        return Subject(namespace, name, verdict=failure(f"the Module is invalid: {err}"))
    if module.spec.module_loader is None:
        return Subject(namespace, name, module, verdict=success(preflight.REASON_NO_IMAGE_NEEDED))
    try:
        target = kernels.target(module, kernel)
    except kernels.KernelMappingError as err:
        return Subject(namespace, name, module, verdict=failure(f"{err}"))
    if target is None:
        return Subject(namespace, name, module, verdict=failure(preflight.REASON_MAPPING_NOT_FOUND))
    return Subject(namespace, name, module, target)
