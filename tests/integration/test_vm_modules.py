"""kmm's example Module (examples/kmmdemo) on a real kernel: built in the
cluster from ``FROM ${DTK_AUTO}``, signed with the sandbox's Secure Boot
key, loaded, used through DRA, upgraded, rebooted, moved to another kernel.

On the session's VM sandbox (``vmsandbox``): build, sign and preflight pods
run on its containerd node (the Module's ``build.selector``, the one change
made to the example's manifests), modules load on its VM node, whose kernel
enforces module signatures. The operator runs as the example's README runs
it (``kmm operator`` with ``--driver-toolkit-image``), the manifests are
applied with kubectl, the steps taken with kmm's commands.

The tests are one story and run in order, each starting from where the
one before left the node (a test run alone finds no Module and fails at
once, saying so):

1. the Module without ``sign``: built, its load refused by the kernel ("Key
   was rejected by service"), said on the Module, no ready label; the
   in-tree ``dummy`` removed all the same;
2. ``sign`` added: rebuilt and signed with no other action; both modules in
   the node's ``/proc/modules`` (kmmdemo used by kmmdemo_peer), no ``E``
   taint, the signer in the loader image's ``.ko`` the sandbox key's;
3. a workload reads its device through a DRA claim;
4. v1 to v2 while the workload holds its device, not opted in to
   eviction: a NoSchedule DeviceTaintRule keeps new claims off the node's
   devices, the move waits on the workload and ``kmm upgrade`` and the
   Module name it, v1 stays loaded and no node reports v2 ready; the
   workload deleted, v2 loads with no other action;
5. a reboot with a prepared claim: the ready label goes once the operator
   sees the new boot and comes back after the reload, the workload runs
   again;
6. opted in to eviction (``kmm.sigs.x-k8s.io/evict-device-users``), the
   node moved back to v1 with a pod using no device beside the workload:
   the eviction controller evicts the workload alone under the NoExecute
   DeviceTaintRule, before the driver leaves and v2 is unloaded (the order
   read from watches, by resourceVersion); the other pod keeps its uid and
   restart count, v1 loads, the rule goes, a new claim reads v1;
7. a kernel upgrade: ``kmm preflight --push`` builds and signs for the other
   kernel line, the node reboots onto it and loads that image with no build;
8. the Module deleted: both modules unloaded; the node back on its first
   kernel (what the next user of the sandbox expects).

Cost on this 2-core machine: 17.5 minutes for the file, the sandbox's
start included (1,051 s measured; 1,364 s in a run beside other work),
mostly the VM node under TCG: pulling and unpacking each kernel's loader
image (its toolkit base, 120 MiB) and kmm's, three reboots, and four
builds. Moving back to v1 in step 6 builds and pulls nothing new.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import helm_support
import pytest
import test_device_taints_in_containers as taints
import test_upgrade_in_containers as upgrades
import vmsandbox
import yaml

from kmm.api import labels
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
from kmm.operator import writing
from kmm.sandbox import cluster, components

EXAMPLE = vmsandbox.ROOT / "examples" / "kmmdemo"
NODE = vmsandbox.NODE
NAMESPACE = vmsandbox.NAMESPACE
MODULE = "kmmdemo"
WORKLOAD = "kmmdemo-workload"
DRIVER = "kmmdemo.kmm.io"
LONG = 900.0  # seconds: a build and a pull unpacked under TCG
_READY = labels.ready(NAMESPACE, MODULE)
_VERSION_READY = labels.version_ready(NAMESPACE, MODULE)


@pytest.fixture(scope="module")
def sandbox(vm_sandbox: vmsandbox.Started) -> vmsandbox.Started:
    return vm_sandbox


@pytest.fixture(scope="module")
def kubectl(sandbox: vmsandbox.Started) -> Callable[..., subprocess.CompletedProcess[str]]:
    binary = helm_support.binary(components.KUBECTL)

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(binary), "--kubeconfig", str(sandbox.record.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run


Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def example(sandbox: vmsandbox.Started, kubectl: Kubectl) -> Iterator[Path]:
    """kmm installed and its operator running as the README runs them, and
    the objects the Module names; the scratch directory for manifests.
    Afterwards: nothing of the example left, the node on its first kernel."""
    directory = sandbox.directory / "kmmdemo"
    directory.mkdir()
    deploy = vmsandbox.ROOT / "deploy"
    _ok(vmsandbox.kmm(
        "apply", "--kubeconfig", str(sandbox.record.kubeconfig),
        "-f", str(deploy / "crd" / "modules.kmm.sigs.x-k8s.io.yaml"),
        "-f", str(deploy / "crd" / "preflightvalidations.kmm.sigs.x-k8s.io.yaml"),
        "-f", str(deploy / "admission" / "modules.kmm.sigs.x-k8s.io.yaml"),
    ))  # fmt: skip
    registry = sandbox.record.registry
    assert registry is not None
    log = (directory / "operator.log").open("wb")
    operator = subprocess.Popen(
        [
            str(vmsandbox.KMM_CLI), "operator",
            "--kubeconfig", str(sandbox.record.kubeconfig),
            "--no-leader-election", "--bind-address", "127.0.0.1",
            "--metrics-port", "0", "--health-port", "0",
            "--builder-image", vmsandbox.BUILDER,
            "--driver-toolkit-image", "10.253.0.1:5000/kmm/driver-toolkit:${KERNEL_FULL_VERSION}",
            "--registry-ca", str(sandbox.directory / "pki" / "ca.crt"),
            "--registry-endpoint", f"{registry.reference_host}={registry.host}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _ok(kubectl(
            "create", "configmap", "kmmdemo-dockerfile",
            f"--from-file=dockerfile={EXAMPLE / 'Dockerfile'}",
        ))  # fmt: skip
        token = uuid.uuid4().hex
        _ok(kubectl("create", "secret", "generic", "kmmdemo-build-secret", f"--from-literal=token={token}"))  # fmt: skip
        key = sandbox.key
        _ok(kubectl("create", "secret", "generic", "kmmdemo-signing-key", f"--from-file=key={key.key}"))  # fmt: skip
        _ok(kubectl("create", "secret", "generic", "kmmdemo-signing-cert", f"--from-file=cert={key.certificate}"))  # fmt: skip
        yield directory
    finally:
        kubectl("delete", "--ignore-not-found", "--wait", "-f", str(EXAMPLE / "workload.yaml"))
        kubectl("delete", "--ignore-not-found", "--wait", "--timeout=300s", "module", MODULE)
        kubectl("delete", "--ignore-not-found", "preflightvalidations", "--all")
        kubectl("delete", "--ignore-not-found", "configmap", "kmmdemo-dockerfile")
        for secret in ("kmmdemo-build-secret", "kmmdemo-signing-key", "kmmdemo-signing-cert"):
            kubectl("delete", "--ignore-not-found", "secret", secret)
        operator.terminate()
        try:
            operator.wait(timeout=60)
        except subprocess.TimeoutExpired:
            operator.kill()
            operator.wait()
        log.close()
        if sandbox.node.saved_kernel() != sandbox.image.kernels.default:
            vmsandbox.kmm(
                "sandbox", "node", "reboot", "--dir", str(sandbox.directory), NODE,
                "--kernel", sandbox.image.kernels.default,
                timeout=vmsandbox.REBOOT_TIMEOUT + 60,
            )  # fmt: skip


@pytest.fixture
async def api(sandbox: vmsandbox.Started) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(sandbox.record.kubeconfig) as found:
        yield found


def _manifest(directory: Path, source: str, *, signed: bool = True) -> Path:
    """The example's manifest ``source`` as this sandbox applies it: build
    (and sign) pods pinned to its containerd node; without ``sign`` when not
    ``signed``."""
    documents = list(yaml.safe_load_all((EXAMPLE / source).read_text()))
    for document in documents:
        if document["kind"] != "Module":
            continue
        for mapping in document["spec"]["moduleLoader"]["container"]["kernelMappings"]:
            mapping["build"]["selector"] = {"kubernetes.io/hostname": vmsandbox.BUILD_NODE}
            if not signed:
                del mapping["sign"]
    written = directory / f"{'' if signed else 'unsigned-'}{source}"
    written.write_text(yaml.safe_dump_all(documents))
    return written


async def _sh(sandbox: vmsandbox.Started, script: str) -> str:
    """``script`` run as root in the VM node's OS; its output."""
    done = await sandbox.node.exec(["/bin/sh", "-c", script], timeout=300)
    return done.stdout.decode()


async def _loaded(sandbox: vmsandbox.Started) -> dict[str, str]:
    """The kernel's modules of the example and ``dummy``: name -> "used by"."""
    found = {}
    for line in (await _sh(sandbox, "cat /proc/modules")).splitlines():
        name, _size, _count, users, *_ = line.split()
        if name in ("kmmdemo", "kmmdemo_peer", "dummy"):
            found[name] = users
    return found


async def _node_labels(api: kube_client.Client) -> dict[str, str]:
    node = await api.request("GET", resources.NODES.path(name=NODE))
    return dict(node["metadata"].get("labels") or {})


async def _module(api: kube_client.Client) -> dict[str, Any]:
    found: dict[str, Any] = await api.request("GET", writing.MODULES.path(NAMESPACE, MODULE))
    return found


def _condition(module: dict[str, Any], kind: str) -> dict[str, Any]:
    conditions = (module.get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c.get("type") == kind), {})


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = LONG) -> float:
    """Poll ``check`` until true; the seconds it took."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            while True:
                if await check():
                    break
                await asyncio.sleep(2)
    except TimeoutError:
        raise AssertionError(f"not within {timeout:.0f} s: {what}") from None
    return time.monotonic() - started


@contextlib.asynccontextmanager
async def _pods_made(api: kube_client.Client, roles: str) -> AsyncIterator[list[str]]:
    """The names of pods of ``roles`` (``build,sign``) created in the
    namespace while this is entered, from a watch (they are deleted once done)."""
    made: list[str] = []
    path = resources.PODS.path(namespace=NAMESPACE)
    selector = f"{labels.ROLE} in ({roles})"
    listing = await api.request("GET", path, query={"labelSelector": selector})
    version = listing["metadata"]["resourceVersion"]
    watching = asyncio.Event()

    async def watch() -> None:
        query = {"labelSelector": selector, "resourceVersion": version}
        watching.set()
        while True:
            async for event in api.watch(path, query=query, timeout_seconds=60):
                if event["type"] == "ADDED":
                    made.append(event["object"]["metadata"]["name"])
                if event["type"] != "ERROR":
                    query["resourceVersion"] = event["object"]["metadata"]["resourceVersion"]

    task = asyncio.ensure_future(watch())
    await watching.wait()
    try:
        yield made
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _workload_log(kubectl: Kubectl) -> str:
    return _ok(kubectl("logs", "--namespace", NAMESPACE, WORKLOAD))


def _run_workload(kubectl: Kubectl) -> str:
    """The example workload applied, Ready, and its log once it has read its
    device: Ready means only started (it has no readiness probe), and a 1.37
    kubelet reports it before the shell has printed (seen empty once)."""
    _ok(kubectl("apply", "-f", str(EXAMPLE / "workload.yaml")))
    _ok(kubectl(
        "wait", "--namespace", NAMESPACE, "--for=condition=Ready", f"pod/{WORKLOAD}",
        f"--timeout={LONG:.0f}s", timeout=LONG + 30,
    ))  # fmt: skip
    log = ""
    for _ in range(60):
        log = _workload_log(kubectl)
        if "version:" in log:
            break
        time.sleep(1)
    return log


async def test_an_unsigned_module_is_refused_by_the_kernel_and_the_module_says_why(
    sandbox: vmsandbox.Started, example: Path, api: kube_client.Client, kubectl: Kubectl
) -> None:
    await _sh(sandbox, "modprobe dummy")
    assert "dummy" in await _loaded(sandbox)
    _ok(kubectl("apply", "-f", str(_manifest(example, "module.yaml", signed=False))))
    moved = await asyncio.to_thread(
        vmsandbox.kmm, "upgrade", f"{NAMESPACE}/{MODULE}", "--to", "1", NODE,
        "--kubeconfig", str(sandbox.record.kubeconfig), "--timeout", str(LONG), timeout=LONG + 60,
    )  # fmt: skip
    # The node's step stops on the kernel's refusal, said in its own words.
    assert moved.returncode != 0, moved.stdout
    assert "Key was rejected by service" in moved.stdout + moved.stderr
    degraded = _condition(await _module(api), "Degraded")
    assert degraded.get("reason") == "ModuleLoadFailed", degraded
    assert f"did not load on node {NODE}" in degraded["message"]
    assert "Key was rejected by service" in degraded["message"]
    assert _READY not in await _node_labels(api)
    # The in-tree module went first; neither of the example's is loaded.
    assert await _loaded(sandbox) == {}
    assert "Loading of unsigned module is rejected" in await _sh(sandbox, "dmesg")


async def test_sign_added_the_module_is_rebuilt_signed_and_loaded_with_no_other_action(
    sandbox: vmsandbox.Started, example: Path, api: kube_client.Client, kubectl: Kubectl
) -> None:
    # dummy again: the signed load removes it too (the refused one did before).
    await _sh(sandbox, "modprobe dummy")
    async with _pods_made(api, "build,sign") as made:
        _ok(kubectl("apply", "-f", str(_manifest(example, "module.yaml"))))

        async def ready() -> bool:
            return _condition(await _module(api), "Ready").get("status") == "True"

        await _until(ready, "the Module Ready with sign added")
    # Built again from the current inputs (the unsigned image is stale), then signed.
    assert any("build" in name for name in made), made
    assert any("sign" in name for name in made), made
    assert _READY in await _node_labels(api)
    loaded = await _loaded(sandbox)
    assert set(loaded) == {"kmmdemo", "kmmdemo_peer"}  # and no dummy
    assert loaded["kmmdemo"].rstrip(",") == "kmmdemo_peer"
    assert (await _sh(sandbox, "cat /sys/module/kmmdemo/version")).strip() == "1"
    for name in ("kmmdemo", "kmmdemo_peer"):
        # Trusted by the kernel's keyring (the sandbox key, a MOK), not tolerated.
        assert "E" not in await _sh(sandbox, f"cat /sys/module/{name}/taint")
    assert (await _sh(sandbox, "cat /sys/module/kmmdemo_peer/parameters/note")).strip() == (
        "loaded-by-kmm"
    )
    # The signer as the loader image's own .ko files carry it.
    kernel = (await sandbox.node.status()).kernel
    pods = await api.request(
        "GET",
        resources.PODS.path(namespace=NAMESPACE),
        query={"labelSelector": f"{labels.MODULE_NAME}={MODULE},{labels.ROLE}=module-loader"},
    )
    (loader,) = [p for p in pods["items"] if p["spec"].get("nodeName") == NODE]
    for name in ("kmmdemo", "kmmdemo_peer"):
        signer = _ok(kubectl(
            "exec", "--namespace", NAMESPACE, loader["metadata"]["name"], "--",
            "modinfo", "-F", "signer", f"/opt/lib/modules/{kernel}/{name}.ko",
        ))  # fmt: skip
        assert signer.strip() == sandbox.key.subject()


async def test_a_workload_reads_its_device_through_a_dra_claim(
    sandbox: vmsandbox.Started, example: Path, api: kube_client.Client, kubectl: Kubectl
) -> None:
    slices = await api.request("GET", resources.RESOURCE_SLICES.path())
    published = [
        device["name"]
        for item in slices["items"]
        if item["spec"]["driver"] == DRIVER and item["spec"].get("nodeName") == NODE
        for device in item["spec"].get("devices") or ()
    ]
    # The node's real devices: the build argument KMMDEMO_DEVICES is 2.
    assert sorted(published) == ["kmmdemo0", "kmmdemo1"], published
    log = _run_workload(kubectl)
    assert "(mode 444)" in log
    assert "version: 1" in log
    assert "peer: loaded-by-kmm" in log
    assert "kmmdemo firmware for version 1" in log
    assert any(line in {"index: 0", "index: 1"} for line in log.splitlines()), log


async def test_an_upgrade_waits_while_the_device_is_open_and_finishes_alone(
    sandbox: vmsandbox.Started, example: Path, api: kube_client.Client, kubectl: Kubectl
) -> None:
    assert "version: 1" in _workload_log(kubectl)
    _ok(kubectl("apply", "-f", str(_manifest(example, "module-v2.yaml"))))
    # seed 003: "modprobe -r ... will fail" while a workload holds the device.
    # With device taints (1.37) the move does not get that far: a NoSchedule
    # rule keeps new claims off the node's devices, the driver stays while the
    # workload's claim holds one, and the Module's status and ``kmm upgrade``
    # name the workload the move waits on (not evicted: the Module has not
    # opted in). The admin deletes it; the same ``kmm upgrade`` finishes.
    moving = asyncio.ensure_future(asyncio.to_thread(
        vmsandbox.kmm, "upgrade", f"{NAMESPACE}/{MODULE}", "--to", "2", NODE,
        "--kubeconfig", str(sandbox.record.kubeconfig), "--timeout", str(2 * LONG),
        timeout=2 * LONG + 60,
    ))  # fmt: skip
    taints: dict[str, Any] = {}

    async def waiting_on_the_workload() -> bool:
        assert not moving.done(), moving.result().stdout + moving.result().stderr
        status = (await _module(api)).get("status") or {}
        taints.update(status.get("deviceTaints") or {})
        return any(
            f"{NAMESPACE}/{WORKLOAD}" in (entry.get("staying") or ())
            for entry in taints.get("nodes") or ()
        )

    await _until(waiting_on_the_workload, "the Module naming the device user")
    assert [entry["effect"] for entry in taints["nodes"]] == ["NoSchedule"], taints
    rules = await api.request("GET", "/apis/resource.k8s.io/v1/devicetaintrules")
    assert [r["spec"]["taint"]["effect"] for r in rules["items"]] == ["NoSchedule"], rules
    assert (await _sh(sandbox, "cat /sys/module/kmmdemo/version")).strip() == "1"
    assert (await _node_labels(api)).get(_VERSION_READY) != "2"
    assert "version: 1" in _workload_log(kubectl)  # never evicted, still reading v1

    deleting = time.monotonic()
    _ok(kubectl("delete", "--wait", "--timeout=300s", "--namespace", NAMESPACE, "pod", WORKLOAD))
    deleted = time.monotonic() - deleting

    async def on_v2() -> bool:
        # The label first: a v2 label read before a v1 version is a lie.
        label = (await _node_labels(api)).get(_VERSION_READY)
        version = (await _sh(sandbox, "cat /sys/module/kmmdemo/version 2>&1")).strip()
        assert not (label == "2" and version != "2"), f"v2 ready while the kernel holds {version}"
        return label == "2" and version == "2"

    took = await _until(on_v2, "version 2 loaded and ready after the workload left")
    print(
        f"v2 loaded and ready {deleted + took:.1f} s after the workload's deletion was asked "
        f"({took:.1f} s after the pod was gone)"
    )
    moved = await moving
    said = " ".join((moved.stdout + moved.stderr).split())
    assert moved.returncode == 0, said
    assert f"pod {NAMESPACE}/{WORKLOAD} uses the Module's devices (NoSchedule: not evicted" in said
    assert f"{NODE}: on 2" in said

    async def untainted() -> bool:  # once the node's new version is ready
        listed = await api.request("GET", "/apis/resource.k8s.io/v1/devicetaintrules")
        return listed["items"] == []

    await _until(untainted, "the node's DeviceTaintRule removed", timeout=120)


async def test_a_reboot_with_a_prepared_claim_reloads_with_no_help(
    sandbox: vmsandbox.Started, example: Path, api: kube_client.Client, kubectl: Kubectl
) -> None:
    assert "version: 2" in _run_workload(kubectl)
    before = await sandbox.node.status()
    seen: list[tuple[str, bool]] = []  # (boot id, ready label) as the Node changed

    async def watch() -> None:
        query = {"fieldSelector": f"metadata.name={NODE}"}
        while True:
            async for event in api.watch(resources.NODES.path(), query=query, timeout_seconds=60):
                if event["type"] in ("ADDED", "MODIFIED"):
                    node = event["object"]
                    boot = node["status"]["nodeInfo"]["bootID"]
                    seen.append((boot, _READY in (node["metadata"].get("labels") or {})))

    task = asyncio.ensure_future(watch())
    try:
        rebooted = await asyncio.to_thread(
            vmsandbox.kmm, "sandbox", "node", "reboot", "--dir", str(sandbox.directory), NODE,
            "--timeout", str(vmsandbox.REBOOT_TIMEOUT), timeout=vmsandbox.REBOOT_TIMEOUT + 60,
        )  # fmt: skip
        assert rebooted.returncode == 0, rebooted.stdout + rebooted.stderr
        after = await sandbox.node.status()
        assert after.boot_id != before.boot_id

        def this_boot() -> list[bool]:
            return [ready for boot, ready in seen if boot == after.boot_id]

        async def reloaded() -> bool:
            # The Node's first update on the new boot is the kubelet's, with
            # the label of the old boot still on it: the operator takes it
            # off once it sees the new boot id, and puts it back only after
            # this boot's load. Reloaded: the label back after it went.
            labels_seen = this_boot()
            return False in labels_seen and True in labels_seen[labels_seen.index(False) :]

        await _until(reloaded, "the ready label back on the new boot")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert (await _sh(sandbox, "cat /sys/module/kmmdemo/version")).strip() == "2"

    async def workload_back() -> bool:
        pod = await api.request("GET", resources.PODS.path(namespace=NAMESPACE, name=WORKLOAD))
        statuses = (pod.get("status") or {}).get("containerStatuses") or ()
        return any(s.get("ready") and s.get("restartCount", 0) >= 1 for s in statuses)

    # Its claim stayed prepared across the boot (the kubelet's checkpoint and
    # the driver's journal live in /var/lib); the kubelet ran it again.
    await _until(workload_back, "the workload running again after the reboot")
    assert "version: 2" in _workload_log(kubectl)


async def test_opted_in_a_move_back_evicts_only_the_device_user(
    sandbox: vmsandbox.Started, example: Path, api: kube_client.Client, kubectl: Kubectl
) -> None:
    # The workload holds a v2 device again since the reboot; a pod beside it
    # on the node uses no device. The Module opts in to eviction and the node
    # is moved back to version 1 (its image is in the registry, its loader
    # image on the node): the device taint's eviction controller deletes the
    # device user alone, before the driver leaves and the kernel unloads v2.
    user = await api.request("GET", resources.PODS.path(namespace=NAMESPACE, name=WORKLOAD))
    assert "version: 2" in _workload_log(kubectl)
    claim = await api.request(
        "GET", resources.RESOURCE_CLAIMS.path(NAMESPACE, taints.claim_name(user))
    )
    driver = await upgrades.loader_pod(api, NAMESPACE, NODE, "dra")
    await api.request("POST", resources.PODS.path(namespace=NAMESPACE), body=_bystander())
    try:
        bystander = await _running(api, BYSTANDER)
        _ok(kubectl("annotate", "module", MODULE, f"{labels.EVICT_DEVICE_USERS}=true"))
        _ok(kubectl("apply", "-f", str(_manifest(example, "module.yaml"))))
        timeline = taints.Timeline(api, NAMESPACE, node=NODE)
        try:
            async with timeline.recording():
                moved = await asyncio.to_thread(
                    vmsandbox.kmm, "upgrade", f"{NAMESPACE}/{MODULE}", "--to", "1", NODE,
                    "--kubeconfig", str(sandbox.record.kubeconfig), "--timeout", str(LONG),
                    timeout=LONG + 60,
                )  # fmt: skip
                said = " ".join((moved.stdout + moved.stderr).split())
                assert moved.returncode == 0, said
                assert f"{NODE}: on 1" in said

                async def rule_gone() -> bool:
                    return any(s.type == "DELETED" for s in timeline.rules(NAMESPACE, MODULE))

                await _until(rule_gone, "the node's DeviceTaintRule deleted", timeout=120)
                _evicted_in_order(timeline, user, bystander, claim, driver.uid)
        finally:
            print(f"\neviction timeline on {NODE}:", *timeline.story(NAMESPACE, MODULE), sep="\n  ")
        still = await api.request("GET", resources.PODS.path(namespace=NAMESPACE, name=BYSTANDER))
        assert still["metadata"]["uid"] == bystander["metadata"]["uid"]
        assert taints.restarts(still) == 0
    finally:
        kubectl(
            "delete", "--ignore-not-found", "--wait", "--namespace", NAMESPACE, "pod", BYSTANDER
        )
    assert (await _sh(sandbox, "cat /sys/module/kmmdemo/version")).strip() == "1"
    # A new claim gets one of the node's devices again, of version 1.
    log = _run_workload(kubectl)
    assert "version: 1" in log
    assert "kmmdemo firmware for version 1" in log


BYSTANDER = "kmmdemo-bystander"


def _bystander() -> dict[str, Any]:
    """A pod on the VM node that uses no device (kmm's image is there)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": BYSTANDER, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "idle",
                    "image": "10.253.0.1:5000/kmm/kmm:example",
                    "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait"],
                }
            ],
        },
    }


async def _running(api: kube_client.Client, name: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def running() -> bool:
        pod = await api.request("GET", resources.PODS.path(namespace=NAMESPACE, name=name))
        found["pod"] = pod
        return (pod.get("status") or {}).get("phase") == "Running"

    await _until(running, f"pod {name} running", timeout=300)
    return found["pod"]


def _evicted_in_order(
    timeline: taints.Timeline,
    user: dict[str, Any],
    bystander: dict[str, Any],
    claim: dict[str, Any],
    driver_uid: str,
) -> None:
    """The opted-in move's order by revision: the NoExecute rule, the user's
    DisruptionTarget and deletion, its claim released, the driver's label
    off and its pod gone, the loader's label off (its pod's preStop unloads
    v2), version 1 ready, the rule deleted; the bystander untouched."""
    rules = timeline.rules(NAMESPACE, MODULE)
    [rule] = [s for s in rules if s.type == "ADDED"]
    assert {s.obj["spec"]["taint"]["effect"] for s in rules} == {"NoExecute"}, rules
    [rule_deleted] = [s.revision for s in rules if s.type == "DELETED"]
    user_uid = user["metadata"]["uid"]
    disrupted = [s for s in timeline.events("Pod", uid=user_uid) if taints.disrupted(s.obj)]
    assert disrupted, timeline.events("Pod", uid=user_uid)
    assert {(taints.disrupted(s.obj) or {}).get("reason") for s in disrupted} == {taints.EVICTED_BY}
    deleting = timeline.deletion(user_uid)
    assert rule.revision < disrupted[0].revision < deleting <= timeline.gone(user_uid)
    for seen in timeline.events("Pod", uid=bystander["metadata"]["uid"]):
        assert seen.type == "MODIFIED", seen.type
        assert not seen.obj["metadata"].get("deletionTimestamp")
        assert taints.disrupted(seen.obj) is None
    assert not timeline.unschedulable()
    released = timeline.released(claim["metadata"]["uid"])
    driver_off = taints.known(
        timeline.node_label(labels.device_plugin_version(NAMESPACE, MODULE), None), "driver off"
    )
    driver_gone = timeline.gone(driver_uid)
    assert rule.revision < deleting < released < driver_off <= driver_gone
    loader_off = taints.known(
        timeline.node_label(labels.module_loader_version(NAMESPACE, MODULE), None), "loader off"
    )
    v1_ready = taints.known(timeline.node_label(_VERSION_READY, "1"), "version 1 ready")
    assert driver_gone < loader_off < v1_ready < rule_deleted


async def test_a_kernel_upgrade_loads_the_image_preflight_pushed_with_no_build(
    sandbox: vmsandbox.Started, example: Path, api: kube_client.Client, kubectl: Kubectl
) -> None:
    _ok(kubectl("delete", "--wait", "--timeout=300s", "--namespace", NAMESPACE, "pod", WORKLOAD))
    other = sandbox.image.kernels.other((await sandbox.node.status()).kernel)
    checked = await asyncio.to_thread(
        vmsandbox.kmm, "preflight", "--kernel", other, "--push", "--wait",
        "--timeout", str(LONG), "--kubeconfig", str(sandbox.record.kubeconfig),
        timeout=LONG + 60,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"every Module has its image for kernel {other}" in " ".join(checked.stdout.split())
    async with _pods_made(api, "build,sign") as made:
        rebooted = await asyncio.to_thread(
            vmsandbox.kmm, "sandbox", "node", "reboot", "--dir", str(sandbox.directory), NODE,
            "--kernel", other, "--timeout", str(vmsandbox.REBOOT_TIMEOUT),
            timeout=vmsandbox.REBOOT_TIMEOUT + 60,
        )  # fmt: skip
        assert rebooted.returncode == 0, rebooted.stdout + rebooted.stderr

        async def loaded_on_other() -> bool:
            node = await api.request("GET", resources.NODES.path(name=NODE))
            on_other = node["status"]["nodeInfo"]["kernelVersion"] == other
            return on_other and _READY in (node["metadata"].get("labels") or {})

        took = await _until(loaded_on_other, f"the module ready on {other}")
        print(f"loaded on {other} {took:.1f} s after the Node was Ready")
    assert made == []
    assert (await _sh(sandbox, "uname -r")).strip() == other
    assert set(await _loaded(sandbox)) == {"kmmdemo", "kmmdemo_peer"}
    # The old kernel's loader failed on its way out: not the Module's problem.
    module = await _module(api)
    assert _condition(module, "Degraded").get("status") == "False", module["status"]


async def test_deleting_the_module_unloads_both(
    sandbox: vmsandbox.Started, example: Path, api: kube_client.Client, kubectl: Kubectl
) -> None:
    assert set(await _loaded(sandbox)) == {"kmmdemo", "kmmdemo_peer"}
    _ok(kubectl("delete", "--wait", "--timeout=300s", "--namespace", NAMESPACE, "module", MODULE))
    assert await _loaded(sandbox) == {}
    with contextlib.suppress(kube_errors.NotFound):
        await _module(api)
        raise AssertionError("the Module is still there")
