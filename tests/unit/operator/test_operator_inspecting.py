"""What ``kmm status`` and ``kmm upgrade`` call a node's problem: pods that cannot run.

Pod statuses are written as the kubelet reports them (``initContainerStatuses``
and ``containerStatuses`` of a DaemonSet pod, restartPolicy Always): an init
container holds its pod back as surely as the main one.
"""

from __future__ import annotations

import typing
from typing import Any

import pytest

from kmm.api import labels, modules
from kmm.operator import inspecting
from kmm.operator.upgrade import planner as upgrade_planner

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


@pytest.mark.parametrize("reason", ["PostStartHookError", "CrashLoopBackOff"])
def test_a_loader_that_did_not_load_says_why(reason: str) -> None:
    """Its failed hook's report, the container's last termination message,
    and not the kubelet's message beside it: for PostStartHookError that is
    the hook's whole command (the loader's script, seen on a VM node), then
    the same report again."""
    said = "modprobe -v -d /opt kmod_x: insmod /opt/x.ko\nmodprobe: ERROR: could not insert 'kmod_x': Key was rejected by service\n"  # fmt: skip
    kubelets = {
        "PostStartHookError": "Exec lifecycle hook ([/bin/sh -c kmm_report() {\n...]) for "
        f'Container "module-loader" failed - error: command exited with 1: , message: "{said}"',
        "CrashLoopBackOff": "back-off 10s restarting failed container=module-loader",
    }
    loader = container("module-loader", waiting(reason, kubelets[reason]))
    loader["lastState"] = {"terminated": {"exitCode": 0, "reason": "Completed", "message": said}}
    [state] = inspecting.states(MODULE, [NODE], [pod(None, loader)])
    assert state.problem == (
        f"pod m-dp-x7k2p: {reason}: modprobe -v -d /opt kmod_x: insmod /opt/x.ko; "
        "modprobe: ERROR: could not insert 'kmod_x': Key was rejected by service"
    )


def test_a_loader_that_left_no_report_shows_the_kubelets_message() -> None:
    loader = container("module-loader", waiting("CrashLoopBackOff", "back-off 10s"))
    [state] = inspecting.states(MODULE, [NODE], [pod(None, loader)])
    assert state.problem == "pod m-dp-x7k2p: CrashLoopBackOff (back-off 10s)"


def test_a_preflight_pod_is_no_problem_of_the_node_it_runs_on() -> None:
    """A PreflightValidation's pod carries the Module's labels, but builds for
    a kernel the node does not run: whatever its state, it is not the node's."""
    stuck = pod(None, container("build", waiting("ImagePullBackOff", "Back-off")))
    stuck["metadata"]["labels"][labels.ROLE] = "preflight"
    [state] = inspecting.states(MODULE, [NODE], [stuck])
    assert state.problem is None
    stuck["metadata"]["labels"][labels.ROLE] = "device-plugin"
    [state] = inspecting.states(MODULE, [NODE], [stuck])
    assert state.problem is not None


def test_the_old_kernels_loader_leaving_a_rebooted_node_is_no_problem_of_it() -> None:
    """n1 rebooted from 6.1 onto 6.8: the 6.1 loader the kubelet started again
    crash-loops there (its postStart finds no module for 6.8) until its
    DaemonSet's controller deletes it. A loader of the node's own kernel that
    crash-loops is the node's problem."""
    crashing = container("module-loader", waiting("CrashLoopBackOff", "back-off 40s"), restarts=3)
    old = pod(None, crashing)
    old["metadata"]["labels"].update(
        {labels.ROLE: "module-loader", labels.KERNEL_VERSION_FULL: "6.1.0-27-amd64"}
    )
    [state] = inspecting.states(MODULE, [NODE], [old])
    assert state.problem is None
    old["metadata"]["labels"][labels.KERNEL_VERSION_FULL] = "6.8.0-45-generic"
    [state] = inspecting.states(MODULE, [NODE], [old])
    assert state.problem is not None
    assert "CrashLoopBackOff" in state.problem


IMAGES = [
    {"kernel": "6.8.0-45-generic", "image": "r:5000/ns/m:6.8.0-45-generic", "state": "Exists"},
    {
        "kernel": "6.12.48+deb13-amd64",
        "image": "r:5000/ns/m:6.12.48-deb13-amd64",
        "state": "Building",
        "pod": "m-build-6-12-48-deb13-amd64",
    },
]


def test_a_node_gets_the_image_of_its_own_kernel_trimmed_as_kmm_trims_it() -> None:
    module = MODULE | {"status": {"images": IMAGES}}
    other = {
        "metadata": {"name": "n2", "labels": {"gpu": "yes"}},
        # nodeInfo carries a trailing "+" that KMM drops before matching.
        "status": {"nodeInfo": {"kernelVersion": "6.12.48+deb13-amd64+"}},
    }
    stranger = {
        "metadata": {"name": "n3", "labels": {"gpu": "yes"}},
        "status": {"nodeInfo": {"kernelVersion": "5.14.0"}},
    }
    by_node = {s.node: s for s in inspecting.states(module, [NODE, other, stranger], [])}
    assert [i.state for i in by_node["n1"].images] == ["Exists"]
    assert [i.pod for i in by_node["n2"].images] == ["m-build-6-12-48-deb13-amd64"]
    assert by_node["n3"].images == ()


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"state": "Exists"}, "exists"),
        ({"state": "Missing"}, "missing"),
        ({"state": "Checking"}, "checking"),
        ({"state": "Building", "pod": "m-build-k"}, "building (pod m-build-k)"),
        ({"state": "Signing", "pod": "m-sign-k"}, "signing (pod m-sign-k)"),
        (
            {"state": "BuildFailed", "pod": "m-build-k", "message": "STEP 3/5: exit status 2"},
            "build failed (pod m-build-k): STEP 3/5: exit status 2",
        ),
        (
            {"state": "SignFailed", "pod": "m-sign-k", "message": "sign-file: bad key"},
            "sign failed (pod m-sign-k): sign-file: bad key",
        ),
        (
            {"state": "AuthenticationFailed", "message": "401 from r:5000"},
            "authentication failed: 401 from r:5000",
        ),
        # A state a newer operator writes is shown as written.
        ({"state": "Queued"}, "Queued"),
    ],
)
def test_each_image_state_is_said_with_its_pod_and_message(
    entry: dict[str, str], expected: str
) -> None:
    module = {"status": {"images": [{"kernel": "k", "image": "i:1"} | entry]}}
    [image] = inspecting.images(module)
    assert image.describe() == expected
    assert image.describe(message=False) == expected.partition(": ")[0]


def test_images_without_a_kernel_are_skipped_and_no_status_is_none() -> None:
    assert inspecting.images({"status": {"images": [{"image": "i:1", "state": "Exists"}]}}) == []
    assert inspecting.images({}) == []


@pytest.mark.parametrize("state", typing.get_args(modules.ImageState))
def test_every_state_the_api_knows_has_words_of_its_own(state: str) -> None:
    said = inspecting.ImageState(kernel="k", image="i:1", state=state).describe()
    assert said != state
    assert said == said.lower()


_DRA_MODULE: dict[str, Any] = {
    "metadata": {"name": "m", "namespace": "ns"},
    "spec": {
        "selector": {"gpu": "yes"},
        "moduleLoader": {"container": {"version": "v2"}},
        "dra": {"driverName": "gpu.example.com"},
    },
}


def _moving_node() -> dict[str, Any]:
    found: dict[str, Any] = {
        "metadata": {
            "name": "n1",
            "labels": {
                "gpu": "yes",
                labels.module_version("ns", "m"): "v2",
                labels.module_loader_version("ns", "m"): "v1",
                labels.device_plugin_version("ns", "m"): "v1",
                labels.ready("ns", "m"): "",
                labels.dra_target("ns", "m"): "",
            },
        },
        "status": {"nodeInfo": {"kernelVersion": "6.8.0-45-generic"}},
    }
    return found


def _with_taints(**entry: Any) -> dict[str, Any]:
    taints = {"apiVersion": "resource.k8s.io/v1", "nodes": [{"node": "n1", **entry}]}
    return {**_DRA_MODULE, "status": {"deviceTaints": taints}}


def test_the_step_names_the_pods_the_operator_says_hold_the_driver() -> None:
    module = _with_taints(
        effect="NoExecute",
        rules=["r"],
        rulesReady=True,
        evicted=["w/a"],
        staying=["w/b"],
        eviction="1 pod pending",
    )
    [state] = inspecting.states(module, [_moving_node()], [])
    assert state.step.action is upgrade_planner.Action.NOTHING
    assert state.step.description.startswith(
        "pod w/a evicted by the NoExecute device taint (the eviction controller: 1 pod "
        "pending); pod w/b tolerates the NoExecute device taint and keeps the unload "
        "waiting until it is deleted"
    )
    waiting_for_rules = _with_taints(effect="NoExecute", rules=["r"], rulesReady=False)
    [state] = inspecting.states(waiting_for_rules, [_moving_node()], [])
    assert state.step.description.startswith("waiting for the NoExecute DeviceTaintRules")
    # No taints written (an older server, or none needed): the step of before.
    [state] = inspecting.states(_DRA_MODULE, [_moving_node()], [])
    assert state.step.action is upgrade_planner.Action.REMOVE_PLUGIN_LABEL
    untainted = _with_taints(message="devices not tainted: ...")
    [state] = inspecting.states(untainted, [_moving_node()], [])
    assert state.step.action is upgrade_planner.Action.REMOVE_PLUGIN_LABEL


def test_the_watcher_judges_with_the_modules_latest_status() -> None:
    watcher = inspecting.Watcher(typing.cast(Any, object()), _DRA_MODULE)
    watcher._nodes.replace([_moving_node()], "1")
    watcher._pods.replace([], "1")
    [state] = watcher.states() or []
    assert state.step.action is upgrade_planner.Action.REMOVE_PLUGIN_LABEL
    updated = _with_taints(effect="NoSchedule", rules=["r"], rulesReady=True, staying=["w/a"])
    watcher._modules.replace([updated], "2")
    [state] = watcher.states() or []
    assert state.step.description.startswith("pod w/a uses the Module's devices")
