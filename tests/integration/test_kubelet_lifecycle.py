"""Pods on a ``kmm kubelet`` node from start to end: processes, phases, grace, RBAC.

Containers of kmm's image run as local processes; the phase follows their
exits and ``restartPolicy``; deletion waits for SIGTERM and the grace period;
claims are unprepared before a finished pod's final phase is written; the
process has exactly its ServiceAccount's access.
"""

from __future__ import annotations

import uuid
from typing import Any

import test_kubelet_emulator as emulating
import test_kubelet_nodes as real

from kmm.api import installation
from kmm.kube import client as kube_client
from kmm.kube import resources
from kmm.sandbox import testing

NAMESPACE = real.NAMESPACE


def _pod(
    name: str, node: emulating.EmulatedNode, command: list[str], **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": installation.IMAGE, "command": command}],
            **spec,
        },
    }


async def _phase_is(api: kube_client.Client, name: str, phase: str) -> bool:
    pod = await real._pod_state(api, name)
    return pod is not None and (pod.get("status") or {}).get("phase") == phase


def _log(node: emulating.EmulatedNode, pod: dict[str, Any], restart: int = 0) -> str:
    meta = pod["metadata"]
    path = (
        node.root
        / "var/log/pods"
        / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        / "main"
        / f"{restart}.log"
    )
    return path.read_text() if path.exists() else ""


async def test_kmm_image_containers_run_and_their_exit_sets_the_phase(
    kmm_api: kube_client.Client,
) -> None:
    async with emulating.emulated(kmm_api) as (node, _):
        run = uuid.uuid4().hex[:6]
        ok, bad = f"ok-{run}", f"bad-{run}"
        await real._create(
            kmm_api, resources.PODS.path(NAMESPACE), _pod(ok, node, ["kmm", "--help"])
        )
        await real._create(
            kmm_api, resources.PODS.path(NAMESPACE), _pod(bad, node, ["kmm", "no-such-command"])
        )
        await testing.eventually(lambda: _phase_is(kmm_api, ok, "Succeeded"), f"{ok} Succeeded")
        await testing.eventually(lambda: _phase_is(kmm_api, bad, "Failed"), f"{bad} Failed")
        done = await real._pod_state(kmm_api, ok)
        failed = await real._pod_state(kmm_api, bad)
        assert done is not None
        assert failed is not None
        assert "Usage" in _log(node, done)
        (state,) = failed["status"]["containerStatuses"]
        assert state["state"]["terminated"]["exitCode"] == 2
        assert state["state"]["terminated"]["reason"] == "Error"
        for name in (ok, bad):
            await real._delete_pod(kmm_api, name)


async def test_a_crashing_container_is_restarted_per_policy(kmm_api: kube_client.Client) -> None:
    async with emulating.emulated(kmm_api, restart_backoff=0.2) as (node, _):
        name = f"crash-{uuid.uuid4().hex[:6]}"
        body = _pod(name, node, ["sh", "-c", "echo once; exit 3"], restartPolicy="OnFailure")
        await real._create(kmm_api, resources.PODS.path(NAMESPACE), body)

        async def restarted() -> bool:
            pod = await real._pod_state(kmm_api, name)
            statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
            return int(statuses[0].get("restartCount", 0)) >= 2

        await testing.eventually(restarted, "restarted twice")
        pod = await real._pod_state(kmm_api, name)
        assert pod is not None
        assert pod["status"]["phase"] == "Running"  # OnFailure: it will be restarted again
        (state,) = pod["status"]["containerStatuses"]
        assert state["lastState"]["terminated"]["exitCode"] == 3
        assert "once" in _log(node, pod, 1)
        await real._delete_pod(kmm_api, name)


async def test_deletion_waits_for_the_grace_period_after_sigterm(
    kmm_api: kube_client.Client,
) -> None:
    async with emulating.emulated(kmm_api) as (node, _):
        name = f"grace-{uuid.uuid4().hex[:6]}"
        # Ignores SIGTERM, says so, and keeps running until SIGKILL.
        script = "trap 'echo got TERM' TERM; echo started; while true; do sleep 0.1; done"
        body = _pod(name, node, ["sh", "-c", script], terminationGracePeriodSeconds=4)
        await real._create(kmm_api, resources.PODS.path(NAMESPACE), body)
        await testing.eventually(lambda: _phase_is(kmm_api, name, "Running"), "Running")
        pod = await real._pod_state(kmm_api, name)
        assert pod is not None
        await testing.eventually(lambda: _said(node, pod, "started"), "the process started")
        await kmm_api.request("DELETE", resources.PODS.path(NAMESPACE, name))
        await testing.eventually(lambda: _said(node, pod, "got TERM"), "SIGTERM delivered")
        # TERM was ignored: the pod is still there, waiting out its grace period.
        assert await real._pod_state(kmm_api, name) is not None

        async def gone() -> bool:
            return await real._pod_state(kmm_api, name) is None

        await testing.eventually(gone, "gone after the grace period")


async def _said(node: emulating.EmulatedNode, pod: dict[str, Any], text: str) -> bool:
    return text in _log(node, pod)


async def test_a_finished_pods_claims_are_unprepared_before_its_final_phase(
    sandbox: testing.RunningSandbox, kmm_api: kube_client.Client
) -> None:
    async with (
        emulating.emulated(kmm_api) as (node, running),
        real.running_driver(sandbox, node, kmm_api) as driver,
    ):
        template = await real._template(kmm_api, driver)
        name = f"job-{driver.module}"
        body = _pod(name, node, ["sh", "-c", "sleep 1"])
        body["spec"]["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": template}]
        body["spec"]["containers"][0]["resources"] = {"claims": [{"name": "dev"}]}
        await real._create(kmm_api, resources.PODS.path(NAMESPACE), body)
        await testing.eventually(lambda: _phase_is(kmm_api, name, "Succeeded"), "Succeeded")
        # Unprepared before the phase was written: nothing left the moment it reads Succeeded.
        assert not emulating._claims(node)
        assert not real._cdi_specs(node, driver)
        assert [
            running.manager.count(m) for m in ("NodePrepareResources", "NodeUnprepareResources")
        ] == [1, 1]
        await real._delete_pod(kmm_api, name)


async def test_a_process_has_its_service_accounts_access_and_no_more(
    kmm_api: kube_client.Client,
) -> None:
    async with emulating.emulated(kmm_api) as (node, _):
        run = uuid.uuid4().hex[:6]
        account = f"sa-{run}"
        await real._create(
            kmm_api,
            resources.SERVICE_ACCOUNTS.path(NAMESPACE),
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
        )
        denied = f"denied-{run}"
        body = _pod(denied, node, ["kmm", "modules"], serviceAccountName=account)
        await real._create(kmm_api, resources.PODS.path(NAMESPACE), body)
        await testing.eventually(lambda: _phase_is(kmm_api, denied, "Failed"), "Failed")
        pod = await real._pod_state(kmm_api, denied)
        assert pod is not None
        output = _log(node, pod)
        # It reached the API server as its ServiceAccount, which may not list Modules.
        assert f"system:serviceaccount:{NAMESPACE}:{account}" in output, output
        assert "forbidden" in output.lower(), output
        await real._delete_pod(kmm_api, denied)
        await kmm_api.request("DELETE", resources.SERVICE_ACCOUNTS.path(NAMESPACE, account))
