"""What ``kmm status`` and ``kmm upgrade`` call a node's problem: pods that cannot run.

Pod statuses are written as the kubelet reports them (``initContainerStatuses``
and ``containerStatuses`` of a DaemonSet pod, restartPolicy Always): an init
container holds its pod back as surely as the main one.
"""

from __future__ import annotations

from typing import Any

import pytest

from kmm.api import labels
from kmm.operator import inspecting

IMAGE = "example.com/plugin-init:v2"
PULL_MESSAGE = f'Back-off pulling image "{IMAGE}"'
MODULE = {
    "metadata": {"name": "m", "namespace": "ns"},
    "spec": {"selector": {"gpu": "yes"}, "devicePlugin": {"container": {"image": "p"}}},
}
NODE = {
    "metadata": {"name": "n1", "labels": {"gpu": "yes"}},
    "status": {"nodeInfo": {"kernelVersion": "6.8.0-45-generic"}},
}


def waiting(reason: str, message: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"waiting": {"reason": reason}}
    if message is not None:
        found["waiting"]["message"] = message
    return found


def terminated(code: int, reason: str) -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": code,
            "reason": reason,
            "startedAt": "2026-12-02T04:00:00Z",
            "finishedAt": "2026-12-02T04:00:01Z",
            "containerID": "containerd://0123",
        }
    }


def container(name: str, state: dict[str, Any], *, restarts: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "image": IMAGE if name.endswith("init") else "example.com/plugin:v2",
        "imageID": "",
        "ready": False,
        "restartCount": restarts,
        "started": False,
        "state": state,
        "lastState": {},
    }


def pod(init: dict[str, Any] | None, main: dict[str, Any]) -> dict[str, Any]:
    """A device-plugin pod on n1; ``init`` None for a pod without an init container."""
    status: dict[str, Any] = {
        "phase": "Pending" if init is not None else "Running",
        "containerStatuses": [main],
        "qosClass": "BestEffort",
    }
    if init is not None:
        status["initContainerStatuses"] = [init]
    return {
        "metadata": {
            "name": "m-dp-x7k2p",
            "namespace": "ns",
            "labels": {
                labels.MODULE_NAME: "m",
                labels.MODULE_NAMESPACE: "ns",
                labels.ROLE: "device-plugin",
            },
        },
        "spec": {"nodeName": "n1"},
        "status": status,
    }


INITIALIZING = container("device-plugin", waiting("PodInitializing"))
RUNNING = container("device-plugin", {"running": {"startedAt": "2026-12-02T04:00:02Z"}})


@pytest.mark.parametrize(
    ("init", "main", "expected"),
    [
        (
            container("device-plugin-init", waiting("ImagePullBackOff", PULL_MESSAGE)),
            INITIALIZING,
            f"init container device-plugin-init: ImagePullBackOff ({PULL_MESSAGE})",
        ),
        (
            container(
                "device-plugin-init",
                waiting("ErrImagePull", f'failed to pull and unpack image "{IMAGE}": not found'),
            ),
            INITIALIZING,
            "init container device-plugin-init: ErrImagePull (failed to pull",
        ),
        (
            container("device-plugin-init", waiting("InvalidImageName", "couldn't parse")),
            INITIALIZING,
            "init container device-plugin-init: InvalidImageName (couldn't parse)",
        ),
        (
            container(
                "device-plugin-init",
                waiting("CreateContainerConfigError", 'secret "keys" not found'),
            ),
            INITIALIZING,
            "init container device-plugin-init: CreateContainerConfigError",
        ),
        (
            container(
                "device-plugin-init",
                waiting("CrashLoopBackOff", "back-off 20s restarting failed container"),
                restarts=2,
            ),
            INITIALIZING,
            "init container device-plugin-init: CrashLoopBackOff (back-off 20s",
        ),
        # Failed again after a restart, before the kubelet says CrashLoopBackOff.
        (
            container("device-plugin-init", terminated(1, "Error"), restarts=1),
            INITIALIZING,
            "init container device-plugin-init: Error: exit code 1, restarted 1 time(s)",
        ),
        # The main container as before.
        (
            None,
            container("device-plugin", waiting("ImagePullBackOff", "Back-off")),
            "ImagePullBackOff (Back-off)",
        ),
        # Nothing stuck: a first failure may heal, a pull in progress, a finished init.
        (container("device-plugin-init", terminated(1, "Error")), INITIALIZING, None),
        (container("device-plugin-init", waiting("ContainerCreating")), INITIALIZING, None),
        (container("device-plugin-init", terminated(0, "Completed")), RUNNING, None),
        (None, RUNNING, None),
    ],
    ids=[
        "init-image-pull-backoff",
        "init-err-image-pull",
        "init-invalid-image-name",
        "init-config-error",
        "init-crash-loop",
        "init-failed-again",
        "main-image-pull-backoff",
        "init-first-failure",
        "init-creating",
        "init-done",
        "no-init",
    ],
)
def test_a_pod_that_cannot_run_is_the_nodes_problem(
    init: dict[str, Any] | None, main: dict[str, Any], expected: str | None
) -> None:
    [state] = inspecting.states(MODULE, [NODE], [pod(init, main)])
    if expected is None:
        assert state.problem is None
    else:
        assert state.problem is not None
        assert state.problem.startswith(f"pod m-dp-x7k2p: {expected}"), state.problem
