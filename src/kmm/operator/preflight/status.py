"""A validation's status from its verdicts (pure).

Entries sorted by namespace and name, camelCase as the API has them;
``lastTransitionTime`` kept while an entry's (status, stage) pair stays and
the spec generation is the one observed, ``now`` otherwise (a reason that
changes alone keeps it; an edited spec starts every verdict over).
``observedGeneration`` says which generation the verdicts answer.
``differs`` tells whether the cached status is another, so a settled
validation is never written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kmm.api import preflight
from kmm.operator.preflight import verdicts

__all__ = ["compute", "differs"]

RawObject = dict[str, Any]


def compute(
    found: preflight.PreflightValidation, verdicts: Mapping[str, verdicts.Verdict], *, now: str
) -> RawObject:
    """The status the verdicts make (raw, camelCase), transition times kept
    where the (status, stage) pair and the spec generation stayed."""
    previous: dict[tuple[str, str], preflight.ModuleVerdict] = {}
    generation = found.metadata.generation
    current = found.status
    if current is not None and current.observed_generation == generation:
        previous = {(e.namespace, e.name): e for e in current.modules or ()}
    entries: list[RawObject] = []
    for key, verdict in sorted(verdicts.items(), key=lambda kv: tuple(kv[0].split("/", 1))):
        namespace, _, name = key.partition("/")
        before = previous.get((namespace, name))
        same = before is not None and (
            before.verification_status,
            before.verification_stage,
        ) == (verdict.status, verdict.stage)
        entry: RawObject = {
            "name": name,
            "namespace": namespace,
            "verificationStatus": verdict.status,
            "verificationStage": verdict.stage,
            "statusReason": verdict.reason,
            "lastTransitionTime": before.last_transition_time if same and before else now,
        }
        if verdict.image is not None:
            entry["image"] = verdict.image
        if verdict.pod is not None:
            entry["pod"] = verdict.pod
        entries.append(entry)
    out: RawObject = {"modules": entries}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def differs(raw: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether the cached validation's status is not ``wanted`` (the fields it sets)."""
    current = raw.get("status") or {}
    return any(current.get(k) != v for k, v in wanted.items())
