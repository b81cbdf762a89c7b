"""A real module on a VM node: a Module applied until its module is in the
node's ``/proc/modules``, against the floor; and a kernel upgrade's Node
Ready until the module is loaded again.

Run: ``/work/notes/nodes-lock .venv/bin/python bench/bench_vm_modules.py [--runs 3]``
(root; after ``make vm-toolkit-images image test-images``)

1. A sandbox of its own (``kmm sandbox up --nodes 0 --kubelet-nodes 1
   --runtime containerd --vm-nodes 1 --accel tcg``), kmm's image and the
   builder image pushed, the CRDs and admission policy applied, ``kmm
   operator`` running as the example's README runs it, the objects
   examples/kmmdemo's Module names. The Module is the example's with its
   builds pinned to the containerd node and no ``version`` (an ordinary
   Module: its loaders start without ``kmm upgrade``).
2. Untimed: the Module applied once until loaded and deleted until
   unloaded, so its image exists in the registry and on the node (built,
   signed, pulled): what is measured next is a Module whose image exists.
3. ``--runs`` times each, alternating: **kmm**, the Module created until
   ``kmmdemo_peer`` is in the node's ``/proc/modules``; then deleted until
   both modules are gone. **Floor**: the least work with the same result, a
   pod started by hand on that node from the same image (cached there as
   kmm's was), privileged, that copies the image's firmware as the loader
   does and runs the same ``modprobe -d /opt kmmdemo_peer``; created until
   ``kmmdemo_peer`` is in ``/proc/modules``; then deleted and unloaded.
   Both are watched the same way: the node's ``/proc/modules`` read through
   the guest agent every 0.5 s. Printed: each run, the medians, kmm/floor.
4. Kernel upgrade: ``kmm preflight --kernel OTHER --push --wait`` (untimed),
   then ``kmm sandbox node reboot --kernel OTHER``, which returns once the
   Node is Ready on OTHER: from then until ``kmmdemo_peer`` is loaded (the
   other kernel's loader image is pulled onto the node for the first
   time). Then the node is rebooted back.

Bounds: one node, ``--runs`` (at most 10) of each, every wait bounded
(``--timeout``); the sandbox is taken down at the end. Addresses: the API
server and registry on loopback, the node in the sandbox's namespaces.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from kmm.cli import applying, paths
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
from kmm.operator import writing
from kmm.sandbox import cluster
from kmm.sandbox.vmnodes import kernels
from kmm.sandbox.vmnodes import nodes as vm

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "kmmdemo"
NODE = "kmm-vm-0"
BUILD_NODE = "kmm-kubelet-0"
NAMESPACE = "default"
KMM = Path(sys.executable).with_name("kmm")


def _kmm(*args: str, timeout: float) -> str:
    done = subprocess.run(
        [str(KMM), *args], capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, "COLUMNS": "250"},
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(
            f"kmm {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        )
    return done.stdout


def _example_module() -> dict[str, Any]:
    documents = list(yaml.safe_load_all((EXAMPLE / "module.yaml").read_text()))
    module: dict[str, Any] = next(d for d in documents if d["kind"] == "Module")
    module["spec"]["moduleLoader"]["container"].pop("version")
    for mapping in module["spec"]["moduleLoader"]["container"]["kernelMappings"]:
        mapping["build"]["selector"] = {"kubernetes.io/hostname": BUILD_NODE}
    return module


def _floor_pod(image: str) -> dict[str, Any]:
    script = (
        "cp -r /firmware/. /var/lib/firmware && "
        "modprobe -d /opt kmmdemo_peer note=floor && exec sleep infinity"
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bench-floor", "namespace": NAMESPACE},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "load",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/bin/sh", "-c", script],
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "firmware", "mountPath": "/var/lib/firmware"}],
                }
            ],
            "volumes": [
                {
                    "name": "firmware",
                    "hostPath": {"path": "/var/lib/firmware", "type": "DirectoryOrCreate"},
                }
            ],
        },
    }


class Bench:
    def __init__(self, api: kube_client.Client, node: vm.VmNode, timeout: float) -> None:
        self.api, self.node, self.timeout = api, node, timeout

    async def loaded(self) -> set[str]:
        done = await self.node.exec(["cat", "/proc/modules"], timeout=60)
        names = {line.split()[0] for line in done.stdout.decode().splitlines() if line}
        return names & {"kmmdemo", "kmmdemo_peer"}

    async def until(self, want: set[str], started: float) -> float:
        async with asyncio.timeout(self.timeout):
            while True:
                if await self.loaded() == want:
                    return time.monotonic() - started
                await asyncio.sleep(0.5)

    async def module_run(self, module: dict[str, Any]) -> float:
        path = writing.MODULES.path(NAMESPACE)
        started = time.monotonic()
        await self.api.request("POST", path, body=copy.deepcopy(module))
        took = await self.until({"kmmdemo", "kmmdemo_peer"}, started)
        await self.api.request(
            "DELETE", writing.MODULES.path(NAMESPACE, module["metadata"]["name"])
        )
        await self.until(set(), time.monotonic())
        await self._gone(writing.MODULES.path(NAMESPACE, module["metadata"]["name"]))
        return took

    async def floor_run(self, image: str) -> float:
        started = time.monotonic()
        await self.api.request(
            "POST", resources.PODS.path(namespace=NAMESPACE), body=_floor_pod(image)
        )
        took = await self.until({"kmmdemo", "kmmdemo_peer"}, started)
        pod = resources.PODS.path(namespace=NAMESPACE, name="bench-floor")
        await self.api.request("DELETE", pod)
        await self._gone(pod)
        await self.node.exec(["rmmod", "kmmdemo_peer", "kmmdemo"], timeout=60)
        await self.until(set(), time.monotonic())
        return took

    async def _gone(self, path: str) -> None:
        async with asyncio.timeout(self.timeout):
            while True:
                try:
                    await self.api.request("GET", path)
                except kube_errors.NotFound:
                    return
                await asyncio.sleep(0.5)

    async def loader_image(self) -> str:
        pods = await self.api.request(
            "GET", resources.PODS.path(namespace=NAMESPACE),
            query={"labelSelector": "kmm.node.kubernetes.io/role=module-loader"},
        )  # fmt: skip
        return str(pods["items"][0]["spec"]["containers"][0]["image"])


async def _setup(directory: Path) -> None:
    config = directory / "kubeconfig"
    async with cluster.api_client(config) as api:
        for source in (
            ROOT / "deploy/crd/modules.kmm.sigs.x-k8s.io.yaml",
            ROOT / "deploy/crd/preflightvalidations.kmm.sigs.x-k8s.io.yaml",
            ROOT / "deploy/admission/modules.kmm.sigs.x-k8s.io.yaml",
        ):
            await applying.apply_documents(api, list(yaml.safe_load_all(source.read_text())))
        key = directory / "secure-boot"
        objects: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "kmmdemo-dockerfile", "namespace": NAMESPACE},
             "data": {"dockerfile": (EXAMPLE / "Dockerfile").read_text()}},
            {"apiVersion": "v1", "kind": "Secret",
             "metadata": {"name": "kmmdemo-build-secret", "namespace": NAMESPACE},
             "stringData": {"token": "bench"}},
            {"apiVersion": "v1", "kind": "Secret",
             "metadata": {"name": "kmmdemo-signing-key", "namespace": NAMESPACE},
             "stringData": {"key": (key / "signing.key").read_text()}},
            {"apiVersion": "v1", "kind": "Secret",
             "metadata": {"name": "kmmdemo-signing-cert", "namespace": NAMESPACE},
             "stringData": {"cert": (key / "signing.crt").read_text()}},
        ]  # fmt: skip
        documents = list(yaml.safe_load_all((EXAMPLE / "module.yaml").read_text()))
        objects += [d for d in documents if d["kind"] != "Module"]
        await applying.apply_documents(api, objects)


async def _measure(directory: Path, runs: int, timeout: float) -> None:
    config = directory / "kubeconfig"
    node = cluster.vm_nodes(directory).handle(NODE)
    module = _example_module()
    async with cluster.api_client(config) as api:
        bench = Bench(api, node, timeout)
        started = time.monotonic()
        await bench.module_run(module)
        print(
            f"first Module: built, signed, pulled and loaded, then unloaded: {time.monotonic() - started:.1f} s"
        )
        # The loader runs its image by digest; the floor's pod names the same.
        await api.request("POST", writing.MODULES.path(NAMESPACE), body=copy.deepcopy(module))
        await bench.until({"kmmdemo", "kmmdemo_peer"}, time.monotonic())
        image = await bench.loader_image()
        await api.request("DELETE", writing.MODULES.path(NAMESPACE, module["metadata"]["name"]))
        await bench.until(set(), time.monotonic())
        await bench._gone(writing.MODULES.path(NAMESPACE, module["metadata"]["name"]))
        kmm_times, floor_times = [], []
        for run in range(runs):
            kmm_times.append(await bench.module_run(module))
            floor_times.append(await bench.floor_run(image))
            print(f"run {run + 1}: kmm {kmm_times[-1]:.1f} s, floor {floor_times[-1]:.1f} s")
        kmm_median, floor_median = statistics.median(kmm_times), statistics.median(floor_times)
        print(
            f"Module applied -> /proc/modules: kmm {kmm_median:.1f} s, floor {floor_median:.1f} s "
            f"(medians of {runs}), kmm/floor {kmm_median / floor_median:.2f}"
        )

        await api.request("POST", writing.MODULES.path(NAMESPACE), body=copy.deepcopy(module))
        await bench.until({"kmmdemo", "kmmdemo_peer"}, time.monotonic())
        chosen = kernels.load(paths.cache_dir())
        assert chosen is not None
        first = (await node.status()).kernel
        other = chosen.other(first)
        _kmm("preflight", "--kernel", other, "--push", "--wait", "--timeout", str(timeout),
             "--kubeconfig", str(config), timeout=timeout + 60)  # fmt: skip
        _kmm("sandbox", "node", "reboot", "--dir", str(directory), NODE, "--kernel", other,
             timeout=timeout)  # fmt: skip
        ready = time.monotonic()
        took = await bench.until({"kmmdemo", "kmmdemo_peer"}, ready)
        print(f"kernel upgrade {first} -> {other}: Node Ready -> module loaded {took:.1f} s")
        _kmm("sandbox", "node", "reboot", "--dir", str(directory), NODE, "--kernel", first,
             timeout=timeout)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, choices=range(1, 11))
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    directory = Path(os.path.realpath(tempfile.mkdtemp(prefix="kb", dir="/tmp")))
    operator: subprocess.Popen[bytes] | None = None
    try:
        up = _kmm(
            "sandbox", "up", "--dir", str(directory), "--nodes", "0", "--kubelet-nodes", "1",
            "--runtime", "containerd", "--vm-nodes", "1", "--accel", "tcg",
            "--pause-image", str(ROOT / "build/images/pause.tar"), timeout=1200,
        )  # fmt: skip
        print(next(line for line in up.splitlines() if line.startswith("Sandbox up")))
        record = cluster.status(directory)
        assert record.registry is not None
        for tar, name in (
            ("kmm-image.tar", "kmm/kmm:example"),
            ("kmm-builder-image.tar", "kmm/builder:1"),
        ):
            _kmm(
                "sandbox",
                "push",
                "--dir",
                str(directory),
                str(ROOT / "build" / tar),
                name,
                timeout=600,
            )
        asyncio.run(_setup(directory))
        log = (directory / "operator.log").open("wb")
        operator = subprocess.Popen(
            [str(KMM), "operator", "--kubeconfig", str(directory / "kubeconfig"),
             "--no-leader-election", "--bind-address", "127.0.0.1", "--metrics-port", "0",
             "--health-port", "0", "--builder-image", "10.253.0.1:5000/kmm/builder:1",
             "--driver-toolkit-image", "10.253.0.1:5000/kmm/driver-toolkit:${KERNEL_FULL_VERSION}",
             "--registry-ca", str(directory / "pki" / "ca.crt"),
             "--registry-endpoint", f"{record.registry.reference_host}={record.registry.host}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        asyncio.run(_measure(directory, args.runs, args.timeout))
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(timeout=60)
        cluster.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
