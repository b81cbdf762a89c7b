"""What an observed build, sign or preflight pod says of itself (pure).

The build planner and the preflight planner read the same few things of a
pod the cache holds (``caches.BUILD_POD_FIELDS``): its phase, whether it is
being deleted, and, once a container ended, its termination: the exit code,
the message (the log's tail under ``FallbackToLogsOnError`` when it failed,
else the script's one JSON summary line, ``scripts``) and when it finished.
Before it runs, ``waiting`` says why a pod cannot start, from what the
scheduler and the kubelet wrote: a container waiting on a failed pull or a
configuration it cannot make (``STUCK``), or no node to run on
(``Unschedulable``). Everything here takes the raw pod and never raises on
a field that is missing or of the wrong type: a pod someone else wrote
reads as one that said nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "STUCK",
    "TAIL_LINES",
    "UNSCHEDULABLE",
    "Waiting",
    "deleting",
    "ended",
    "exit_code",
    "finished",
    "meta",
    "name",
    "phase",
    "succeeded",
    "summary",
    "tail",
    "uid",
    "waiting",
]

# Lines of a failed pod's termination message a status quotes.
TAIL_LINES: Final = 6
_ENDED: Final = frozenset({"Succeeded", "Failed"})
# Container waiting reasons that do not pass by themselves: the kubelet
# retries, but the pod starts only once someone fixes the cause (an image
# name or its credentials, a Secret or ConfigMap the container needs).
# ContainerCreating and PodInitializing are on their way, and not listed.
STUCK: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
# The scheduler's reason on a PodScheduled condition that is False.
UNSCHEDULABLE: Final = "Unschedulable"


@dataclasses.dataclass(frozen=True)
class Waiting:
    """Why a pod that has not ended cannot go on: the kubelet's or the
    scheduler's reason, and their message (naming the container)."""

    reason: str
    message: str


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


def name(pod: Mapping[str, Any]) -> str:
    return str(meta(pod).get("name") or "")


def uid(pod: Mapping[str, Any]) -> str:
    """What a planner knows a pod by: its uid (its name where a test gave none)."""
    return str(meta(pod).get("uid") or meta(pod).get("name"))


def phase(pod: Mapping[str, Any]) -> str:
    """``status.phase``; "" before the kubelet (or the API server) set one."""
    value = (pod.get("status") or {}).get("phase")
    return value if isinstance(value, str) else ""


def deleting(pod: Mapping[str, Any]) -> bool:
    return bool(meta(pod).get("deletionTimestamp"))


def succeeded(pod: Mapping[str, Any]) -> bool:
    """Its phase is Succeeded, or every container of it terminated with exit
    code 0: the kubelet reports the phase only once it tore the pod's
    sandbox down (a second or more after the last container exited), and
    the pod's work (a push) is done when its container is."""
    if phase(pod) in _ENDED:
        return phase(pod) == "Succeeded"
    found = (pod.get("status") or {}).get("containerStatuses") or ()
    return bool(found) and all(
        (((status.get("state") or {}).get("terminated") or {}).get("exitCode", -1) == 0)
        for status in found
    )


def ended(pod: Mapping[str, Any]) -> bool:
    """Succeeded or Failed: nothing runs in it any more."""
    return phase(pod) in _ENDED or succeeded(pod)


def _terminations(pod: Mapping[str, Any], *fields: str) -> list[Mapping[str, Any]]:
    found: list[Mapping[str, Any]] = []
    for field in fields:
        for container in (pod.get("status") or {}).get(field) or ():
            done = (container.get("state") or {}).get("terminated")
            if isinstance(done, Mapping):
                found.append(done)
    return found


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The termination of the container that failed (an init container's
    included), else of the first that ended; {} when none did."""
    found = _terminations(pod, "initContainerStatuses", "containerStatuses")
    failed = [t for t in found if t.get("exitCode")]
    return (failed or found or [{}])[0]


def exit_code(pod: Mapping[str, Any]) -> int | None:
    """The exit code of the container ``tail`` reads; None when none ended."""
    found = _terminated(pod).get("exitCode")
    return found if isinstance(found, int) else None


def tail(pod: Mapping[str, Any]) -> str:
    """Why a failed pod failed: the last ``TAIL_LINES`` lines of its failing
    container's termination message, or its reason and exit code."""
    done = _terminated(pod)
    text = str(done.get("message") or "").strip()
    if not text:
        return f"{done.get('reason') or 'no termination message'} (exit code {done.get('exitCode', '?')})"
    return "\n".join(text.splitlines()[-TAIL_LINES:])


def finished(pod: Mapping[str, Any]) -> datetime.datetime | None:
    """When the container ``tail`` reads ended."""
    value = _terminated(pod).get("finishedAt")
    if not isinstance(value, str):
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def summary(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The JSON summary a succeeded pod's main container wrote (its
    termination message's last line, ``scripts``); {} when there is none."""
    for done in reversed(_terminations(pod, "containerStatuses")):
        lines = str(done.get("message") or "").strip().splitlines()
        try:
            found = json.loads(lines[-1]) if lines else None
        except ValueError:
            continue
        if isinstance(found, Mapping):
            return found
    return {}


def waiting(pod: Mapping[str, Any]) -> Waiting | None:
    """Why ``pod`` is stuck before it could run, if it is (init containers
    first, as the kubelet starts them); None for a pod on its way or ended."""
    if ended(pod):
        return None
    status = pod.get("status") or {}
    for field in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(field) or ():
            held = (container.get("state") or {}).get("waiting")
            if isinstance(held, Mapping) and held.get("reason") in STUCK:
                text = str(held.get("message") or "").strip()
                where = f"container {container.get('name') or '?'}"
                return Waiting(str(held["reason"]), f"{where}: {text}" if text else where)
    for condition in status.get("conditions") or ():
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == UNSCHEDULABLE
        ):
            return Waiting(UNSCHEDULABLE, str(condition.get("message") or "no node fits"))
    return None
