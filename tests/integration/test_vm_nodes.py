"""VM nodes in the sandbox's cluster (kmm.sandbox.vmnodes): Debian's kernels
under Secure Boot, each guest a real Kubernetes node.

On the session's VM sandbox (``vmsandbox``: ``kmm sandbox up --nodes 0
--kubelet-nodes 1 --runtime containerd --vm-nodes 1 --accel tcg``): one VM
node booted under TCG with Secure Boot on, its NIC a tap bridged onto the
sandbox's fabric. The tests read what its kernel says (Secure Boot,
lockdown), run commands in its OS (``kmm sandbox node exec``), check that
its Node is Ready on the kernel the guest runs and that a pod from the
sandbox registry runs in a real container on it, load the test module
built against its kernel's headers (``make vm-test-modules``) signed with
the sandbox key and refused unsigned, check that its registry serves each
kernel's driver toolkit image (``make vm-toolkit-images``), seeded from the
cache rather than pushed, and that the node runs the one of its kernel,
reboot it onto the other kernel line
(``kmm sandbox node reboot --kernel``; the tests before read the kernel
they run on rather than assume it), and last take the sandbox down: this
module sorts after every other user of it, so its node need not be
rebooted back (``test_vm_modules`` reboots onto a chosen kernel and back).

Cost on this 2-core machine: a reboot about 1 to 2 minutes, the
driver toolkit pod (a 120 MiB pull unpacked under TCG) about 2 minutes
when ``test_vm_modules`` has not pulled it already, the rest under a
minute; the sandbox's start (1 to 2.5 minutes) is paid by its first user.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import namespacing
import pytest
import vmsandbox

from kmm.cli import paths
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
from kmm.oci import layouts
from kmm.sandbox import addressing, cluster, registryseeding
from kmm.sandbox import registry as sandbox_registry
from kmm.sandbox.vmnodes import agent, firmware, images, qemu, toolkitimages
from kmm.sandbox.vmnodes import kind as vmkind
from kmm.sandbox.vmnodes import nodes as vm

MODULES = vmsandbox.MODULES
MODULE = vmsandbox.TEST_MODULE
NODE = vmsandbox.NODE
NAMESPACE = vmsandbox.NAMESPACE
WORKLOAD = vmsandbox.WORKLOAD
REBOOT_TIMEOUT = vmsandbox.REBOOT_TIMEOUT
Started = vmsandbox.Started
_kmm = vmsandbox.kmm


@pytest.fixture(scope="module")
def sandbox(vm_sandbox: Started) -> Started:
    return vm_sandbox


@pytest.fixture(scope="module")
def image(sandbox: Started) -> images.NodeImage:
    return sandbox.image


@pytest.fixture
async def api(sandbox: Started) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(sandbox.record.kubeconfig) as found:
        yield found


async def _run(node: vm.VmNode, script: str) -> agent.ExecResult:
    return await node.exec(["/bin/sh", "-c", script], timeout=300)


async def _node_object(api: kube_client.Client) -> dict[str, Any]:
    found: dict[str, Any] = await api.request("GET", resources.NODES.path(name=NODE))
    return found


def _ready(node: dict[str, Any]) -> str:
    conditions = (node.get("status") or {}).get("conditions") or ()
    return next((c["status"] for c in conditions if c.get("type") == "Ready"), "Unknown")


def test_up_says_what_the_vm_node_runs_and_where_the_signing_key_is(
    sandbox: Started, image: images.NodeImage
) -> None:
    output = " ".join(sandbox.up_output.split())
    assert "0 node(s) and 1 kubelet node(s) and 1 VM node(s) Ready" in output
    assert (
        f"VM node {NODE} ({sandbox.address}): kernel {image.kernels.default}, "
        "Secure Boot on, accelerator tcg"
    ) in output
    key = sandbox.key
    assert f"Module signing key: {key.key}, certificate {key.certificate}" in output
    assert key.key.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert key.key.stat().st_mode & 0o777 == 0o600
    assert key.certificate.read_text().startswith("-----BEGIN CERTIFICATE-----")


async def test_the_node_boots_debians_signed_kernel_under_secure_boot(sandbox: Started) -> None:
    node = sandbox.node
    status = await node.status()
    assert status.secure_boot
    assert "[integrity]" in status.lockdown
    assert status.accel == "tcg"
    assert status.kernel == node.saved_kernel() == node.image.kernels.default
    console = node.machine.serial_log.read_text(errors="replace")
    assert "Secure boot enabled" in console
    assert f"Linux version {status.kernel}" in console
    # The firmware gave the kernel the sandbox key, through shim's MokListRT.
    assert f"Loaded X.509 cert '{sandbox.key.subject()}" in console


async def test_the_node_is_ready_on_the_kernel_its_guest_runs(
    sandbox: Started, api: kube_client.Client
) -> None:
    status = await sandbox.node.status()
    found = await _node_object(api)
    info = found["status"]["nodeInfo"]
    assert _ready(found) == "True"
    assert info["kernelVersion"] == status.kernel
    # The kubelet's own view of this very boot of the guest.
    assert info["bootID"] == status.boot_id
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert found["metadata"]["labels"][vmkind.LABEL] == "true"
    addresses = {a["type"]: a["address"] for a in found["status"]["addresses"]}
    assert addresses["InternalIP"] == sandbox.address


def test_node_exec_runs_as_root_in_the_nodes_os_with_output_and_exit_code(
    sandbox: Started,
) -> None:
    done = _kmm(
        "sandbox", "node", "exec", "--dir", str(sandbox.directory), NODE, "--",
        "sh", "-c", "id -u; hostname; uname -r; echo to-stderr >&2; exit 3",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    uid, hostname, kernel = done.stdout.split()
    assert (uid, hostname) == ("0", NODE)
    # The guest's kernel, not this host's.
    assert kernel == sandbox.node.saved_kernel() != os.uname().release
    assert done.stderr == "to-stderr\n"


async def test_the_guests_one_nic_is_the_tap_on_the_sandboxs_fabric(sandbox: Started) -> None:
    node = sandbox.node
    async with qemu.monitor(node.machine.qmp_socket) as monitor:
        network = await monitor.human("info network")
    assert "type=user" not in network
    assert network.count("type=tap") == 1
    assert f"ifname={node.machine.tap}" in network
    # The guest holds the node's address and reaches the fabric's gateway.
    addresses = (await _run(node, "ip -o -4 addr show")).stdout.decode()
    assert f"{sandbox.address}/24" in addresses
    result = await _run(node, f"ping -c 1 -W 10 {addressing.GATEWAY}")
    assert result.exit_code == 0, result.output
    # Nothing of it in the host's namespace: no tap, no address of the sandbox's.
    host = _host_addresses()
    assert node.machine.tap not in host
    assert str(addressing.GATEWAY) not in host
    assert sandbox.address not in host


def _host_addresses() -> str:
    """Every interface and address of the host's own network namespace."""
    return subprocess.run(
        ["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout


def _pod(name: str, script: str, *, image: str = WORKLOAD) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", script + "; echo KMM-TEST done; exec sleep 3600"],
                }
            ],
        },
    }


async def _log_when_done(api: kube_client.Client, name: str, *, timeout: float = 300) -> str:
    path = resources.PODS.path(namespace=NAMESPACE, name=name)
    async with asyncio.timeout(timeout):
        while True:
            pod = await api.request("GET", path)
            if (pod.get("status") or {}).get("phase") == "Running":
                # Through the API server, which asks the guest's kubelet
                # through the relay's CONNECT proxy on the fabric.
                text = await api.request("GET", path + "/log")
                if "KMM-TEST done" in (text or ""):
                    return str(text)
            await asyncio.sleep(0.5)


async def test_a_pod_from_the_sandbox_registry_runs_in_a_real_container_on_the_node(
    sandbox: Started, api: kube_client.Client
) -> None:
    name = f"vm-hello-{uuid.uuid4().hex[:6]}"
    script = "echo KMM-TEST kernel $(uname -r); echo KMM-TEST address $(hostname -i)"
    await api.request("POST", resources.PODS.path(namespace=NAMESPACE), body=_pod(name, script))
    try:
        log = await _log_when_done(api, name)
        pod = await api.request("GET", resources.PODS.path(namespace=NAMESPACE, name=name))
    finally:
        with contextlib.suppress(kube_errors.NotFound):
            await api.request("DELETE", resources.PODS.path(namespace=NAMESPACE, name=name))
    status = await sandbox.node.status()
    # A container on the guest's kernel, with an address of the node's pod subnet.
    assert f"KMM-TEST kernel {status.kernel}" in log
    assert pod["status"]["podIP"] in {
        str(a) for a in addressing.pod_subnet(vmsandbox.NODE_INDEX).hosts()
    }
    # The image came from the sandbox registry into the guest's containerd.
    listed = await _run(sandbox.node, "ctr --namespace k8s.io images ls -q")
    assert WORKLOAD in listed.stdout.decode().split()


def test_up_names_the_driver_toolkit_images_and_the_operators_flag(
    sandbox: Started, image: images.NodeImage
) -> None:
    output = " ".join(sandbox.up_output.split())
    served = ", ".join(toolkitimages.reference(image.kernels, k) for k in image.kernels.versions)
    assert f"Driver toolkit images: {served}" in output
    assert (
        "Builds get them as DTK_AUTO with: kmm operator --driver-toolkit-image "
        "'10.253.0.1:5000/kmm/driver-toolkit:${KERNEL_FULL_VERSION}'"
    ) in output


async def test_the_registry_serves_each_kernels_driver_toolkit_image_seeded_not_pushed(
    sandbox: Started, image: images.NodeImage
) -> None:
    cache = paths.cache_dir()
    async with sandbox_registry.client(sandbox.record) as client:
        for kernel in image.kernels.versions:
            layout = toolkitimages.find(cache, image.kernels, kernel)
            assert layout is not None
            built = layouts.read(layout)
            found = await client.head_manifest(toolkitimages.NAME, image.kernels.tag(kernel))
            assert found.digest == built.manifest.digest
            for blob in built.blobs:
                assert await client.blob_exists(toolkitimages.NAME, blob.digest)
    assert registryseeding.tags(
        sandbox_registry.storage(sandbox.directory), toolkitimages.NAME
    ) == sorted(image.kernels.tag(k) for k in image.kernels.versions)
    # The largest blob (the toolkit's layer) is the cache's own file: linked,
    # not uploaded into this sandbox.
    largest = max(built.blobs, key=lambda blob: blob.size)
    hexa = largest.digest.removeprefix("sha256:")
    stored = sandbox_registry.storage(sandbox.directory) / (
        f"docker/registry/v2/blobs/sha256/{hexa[:2]}/{hexa}/data"
    )
    assert stored.stat().st_ino == layouts.blob_path(layout, largest.digest).stat().st_ino


async def test_the_node_runs_its_kernels_driver_toolkit_image(
    sandbox: Started, api: kube_client.Client
) -> None:
    kernel = (await sandbox.node.status()).kernel
    reference = toolkitimages.reference(sandbox.node.image.kernels, kernel)
    name = f"vm-dtk-{uuid.uuid4().hex[:6]}"
    script = (
        "echo KMM-TEST kernel $(uname -r); cat /etc/driver-toolkit-release.json; "
        "echo KMM-TEST gcc $(gcc -dumpversion); make --version | head -n 1; kmod --version; "
        'test -f "/lib/modules/$(uname -r)/build/Makefile" && echo KMM-TEST headers; '
        'test -x "/lib/modules/$(uname -r)/build/scripts/sign-file" && echo KMM-TEST sign-file'
    )
    await api.request(
        "POST", resources.PODS.path(namespace=NAMESPACE), body=_pod(name, script, image=reference)
    )
    try:
        log = await _log_when_done(api, name, timeout=900)
    finally:
        with contextlib.suppress(kube_errors.NotFound):
            await api.request("DELETE", resources.PODS.path(namespace=NAMESPACE, name=name))
    assert f"KMM-TEST kernel {kernel}" in log
    assert f'"KERNEL_VERSION": "{kernel}"' in log
    assert "KMM-TEST gcc 12" in log
    assert "GNU Make" in log
    assert "kmod version" in log
    # The headers of the kernel the node runs, where kbuild looks for them.
    assert "KMM-TEST headers" in log
    assert "KMM-TEST sign-file" in log


def test_status_shows_the_vm_nodes_kernel_secure_boot_and_accelerator(sandbox: Started) -> None:
    done = _kmm("sandbox", "status", "--dir", str(sandbox.directory))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "VM nodes" in done.stdout
    row = next(line for line in done.stdout.splitlines() if NODE in line and "tcg" in line)
    cells = [cell.strip() for cell in row.strip("│ ").split("│")]
    assert cells == [
        NODE,
        sandbox.node.saved_kernel(),
        "on",
        "tcg",
        sandbox.address,
        "True",
    ]


def _sign(kernel: str, key: firmware.SigningKey, target: Path) -> None:
    """The test module for ``kernel``, signed with ``key`` by the kernel's own
    sign-file, at ``target``."""
    built = MODULES / kernel
    target.write_bytes((built / f"{MODULE}.ko").read_bytes())
    subprocess.run(
        [str(built / "sign-file"), "sha256", str(key.key), str(key.certificate), str(target)],
        check=True,
    )


async def _load_and_unload(
    node: vm.VmNode, key: firmware.SigningKey, scratch: Path, token: str
) -> None:
    """Refused unsigned, loaded signed with the sandbox key, then unloaded."""
    kernel = (await node.status()).kernel
    unsigned = (MODULES / kernel / f"{MODULE}.ko").read_bytes()
    await node.write_file(f"/root/{MODULE}-unsigned.ko", unsigned)
    refused = await _run(node, f"insmod /root/{MODULE}-unsigned.ko greeting={token}")
    assert refused.exit_code != 0
    assert "Key was rejected by service" in refused.output
    log = (await _run(node, "dmesg")).stdout.decode()
    assert "Loading of unsigned module is rejected" in log
    assert f"greeting {token}" not in log

    signed = scratch / f"{MODULE}-{kernel}.ko"
    _sign(kernel, key, signed)
    await node.write_file(f"/root/{MODULE}.ko", signed.read_bytes())
    signer = await _run(node, f"modinfo -F signer /root/{MODULE}.ko")
    assert signer.stdout.decode().strip() == key.subject()
    loaded = await _run(node, f"insmod /root/{MODULE}.ko greeting={token}")
    assert loaded.exit_code == 0, loaded.output
    modules = (await _run(node, "cat /proc/modules")).stdout.decode()
    assert any(line.split()[0] == MODULE for line in modules.splitlines())
    # Trusted, not merely tolerated: no 'E' (unsigned module) taint.
    taint = await _run(node, f"cat /sys/module/{MODULE}/taint")
    assert "E" not in taint.stdout.decode()
    assert f"greeting {token}" in (await _run(node, "dmesg")).stdout.decode()
    unloaded = await _run(node, f"rmmod {MODULE} && ! grep -q '^{MODULE} ' /proc/modules")
    assert unloaded.exit_code == 0, unloaded.output


async def test_a_module_signed_with_the_sandbox_key_loads_an_unsigned_one_is_refused(
    sandbox: Started, tmp_path: Path
) -> None:
    await _load_and_unload(sandbox.node, sandbox.key, tmp_path, "first-boot")


async def _reboot(sandbox: Started, api: kube_client.Client, kernel: str) -> None:
    """``kmm sandbox node reboot --kernel``, and the Node as it then is."""
    before = await sandbox.node.status()
    done = await asyncio.to_thread(
        _kmm,
        "sandbox", "node", "reboot", "--dir", str(sandbox.directory), NODE,
        "--kernel", kernel, "--timeout", str(REBOOT_TIMEOUT),
        timeout=REBOOT_TIMEOUT + 60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{NODE} Ready on kernel {kernel} after" in " ".join(done.stdout.split())
    after = await sandbox.node.status()
    # As the kernel says it, brackets and all ("none [integrity] confidentiality").
    assert f"lockdown {after.lockdown};" in done.stdout
    assert after.kernel == kernel
    assert after.boot_id != before.boot_id
    assert after.secure_boot
    assert "[integrity]" in after.lockdown
    assert sandbox.node.saved_kernel() == kernel
    found = await _node_object(api)
    assert _ready(found) == "True"
    assert found["status"]["nodeInfo"]["kernelVersion"] == kernel
    assert found["status"]["nodeInfo"]["bootID"] == after.boot_id


async def test_node_reboot_onto_the_other_kernel_line(
    sandbox: Started, api: kube_client.Client, tmp_path: Path
) -> None:
    before = await sandbox.node.status()
    other = sandbox.node.image.kernels.other(before.kernel)
    await _reboot(sandbox, api, other)
    # The sandbox key is trusted on this kernel too (its module built for it).
    await _load_and_unload(sandbox.node, sandbox.key, tmp_path, "after-reboot")


def test_down_stops_qemu_and_removes_the_nodes_tap_and_disks(sandbox: Started) -> None:
    # Last: the module's sandbox goes (the fixture's own down then finds nothing to do).
    node = sandbox.node
    holder = next(p for p in sandbox.record.launched if p.name == f"node/{NODE}")
    namespace = os.readlink(f"/proc/{holder.pid}/ns/net")
    done = _kmm("sandbox", "down", "--dir", str(sandbox.directory))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"vm/{NODE}" in done.stdout
    assert not node.alive()
    # The tap lived in the node's namespace, which is gone.
    assert namespace not in namespacing.namespace_ids("net")
    for disk in (node.machine.root, node.machine.esp, node.machine.variables):
        assert not disk.exists()
    # Its console stays with the logs.
    assert node.machine.serial_log.is_file()
