"""A VM node's costs: image build, boot to ready, memory, reboot (kmm.sandbox.vmnodes).

Run: ``/work/notes/nodes-lock .venv/bin/python bench/bench_vm_nodes.py [--cold] [--accel tcg]
[--sandbox]`` (root; after ``make vm-image test-images``)

1. Node image, warm: ``images.build`` when the image is cached (finding it
   by its key). With ``--cold``, also a cold build into a temporary cache
   directory holding only the kernel list and links to the pinned binaries:
   mmdebstrap, both kernels' initrds, mkfs.ext4 (downloads Debian's
   packages: this is a build, not a test).
2. One node under Secure Boot in a network namespace of its own: start to
   ready (the guest agent answers and systemd finished booting), qemu's
   resident memory then and the guest's own view (MemTotal, MemAvailable),
   and a reboot onto the other kernel line until ready again.

3. With ``--sandbox``, instead of 2: a sandbox with one VM node and no KWOK
   node (``cluster.up``, as ``kmm sandbox up --nodes 0 --vm-nodes 1``): up
   to every node Ready (the VM boots while the control plane starts, so
   this is the VM node's time from ``up`` to Ready too), the sandbox's own
   processes' resident memory, qemu's, and inside the guest its kubelet's,
   containerd's and kube-proxy's and what the guest uses (MemTotal minus
   MemAvailable); a reboot until the Node is Ready again on the other
   kernel line.

Bounds: one node, every wait bounded (600 s); everything started is stopped
at the end. Addresses: none but the sandbox's own namespaces.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from kmm.cli import paths
from kmm.sandbox import building, cluster, namespaces, processes
from kmm.sandbox.vmnodes import esp, firmware, images, kernels
from kmm.sandbox.vmnodes import nodes as vm


class _Launcher:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.launched: list[processes.Process] = []

    def launch(self, name: str, argv: list[str], *, health_url: str) -> processes.Process:
        log = self.directory / "logs" / f"{name.replace('/', '-')}.log"
        process = processes.launch(name, argv, log=log, health_url=health_url)
        self.launched.append(process)
        return process


def _image(cold: bool) -> images.NodeImage:
    cache = paths.cache_dir()
    chosen = kernels.load(cache)
    if chosen is None:
        raise SystemExit("no kernel list: run `make vm-image` first")
    tools = tuple(dict.fromkeys(tool for tool, _, _ in images.BINARIES))
    binaries = asyncio.run(building.ensure_built(cache, tools))
    started = time.monotonic()
    image = images.build(cache, chosen, binaries, log=cache / "vm" / "build.log")
    print(f"image, warm:        {time.monotonic() - started:7.2f} s  ({image.directory})")
    if cold:
        with tempfile.TemporaryDirectory(prefix="kmm-bench-vm-", dir=cache) as work:
            scratch = Path(work)
            (scratch / "vm").mkdir()
            shutil.copyfile(kernels.list_path(cache), kernels.list_path(scratch))
            started = time.monotonic()
            images.build(scratch, chosen, binaries, log=scratch / "build.log")
            print(f"image, cold:        {time.monotonic() - started:7.2f} s")
    return image


async def _node(image: images.NodeImage, accel: str) -> None:
    with tempfile.TemporaryDirectory(prefix="kmm-bench-") as work:
        launcher = _Launcher(Path(work))
        try:
            holder = namespaces.start_holder(launcher, "bench-vm-netns")
            key = firmware.signing_key(launcher.directory, common_name="kmm bench")
            spec = vm.NodeSpec(
                name="bench-0",
                directory=launcher.directory / "vm",
                kernel=image.kernels.default,
                accel=accel,  # type: ignore[arg-type]
                settings=esp.NodeSettings(name="bench-0", mac=vm.mac_address(0)),
            )
            started = time.monotonic()
            node = await vm.start(
                launcher, spec, image=image, holder=holder, key=key, cache_dir=paths.cache_dir()
            )
            state = await node.wait_ready(timeout=600)
            ready = time.monotonic() - started
            status = await node.status()
            print(f"start to ready:     {ready:7.2f} s  ({status.kernel}, {status.accel}, {state})")
            memory = await node.exec(["sh", "-c", "grep -E '^Mem(Total|Available):' /proc/meminfo"])
            guest = dict(line.split(":") for line in memory.stdout.decode().splitlines())
            print(
                f"qemu resident:      {node.rss_bytes() / 2**20:7.0f} MiB  (guest "
                f"{int(guest['MemTotal'].split()[0]) >> 10} MiB, "
                f"{int(guest['MemAvailable'].split()[0]) >> 10} MiB available)"
            )
            started = time.monotonic()
            after = await node.reboot(kernel=image.kernels.other(status.kernel), timeout=600)
            print(f"reboot to ready:    {time.monotonic() - started:7.2f} s  ({after.kernel})")
            print(f"qemu resident:      {node.rss_bytes() / 2**20:7.0f} MiB  (after the reboot)")
        finally:
            for process in reversed(launcher.launched):
                await process.stop_async()


_GUEST_MEMORY = """
for unit in kmm-kubelet kmm-containerd kmm-kube-proxy; do
    pid=$(systemctl show -p MainPID --value "$unit")
    echo "$unit $(grep '^VmRSS:' /proc/$pid/status | tr -s ' ' | cut -d' ' -f2)"
done
grep -E '^Mem(Total|Available):' /proc/meminfo | tr -d ':' | tr -s ' ' | cut -d' ' -f1,2
"""


async def _sandbox(accel: str) -> None:
    directory = Path(tempfile.mkdtemp(prefix="kb", dir="/tmp"))
    options = cluster.Options(
        directory=directory,
        cache_dir=paths.cache_dir(),
        nodes=0,
        vm_nodes=1,
        accel=accel,
        pause_image=Path("build/images/pause.tar").resolve(),
    )
    try:
        started = time.monotonic()
        record = await cluster.up(options)
        print(
            f"sandbox up, VM Ready: {time.monotonic() - started:7.2f} s  (1 VM node, no KWOK node)"
        )
        vms = cluster.vm_nodes(directory)
        node = vms.handle(record.vm_nodes[0])
        status = await node.status()
        print(f"  the node runs {status.kernel} on {status.accel}")
        others = sum(p.rss_bytes() for p in record.launched if not p.name.startswith("vm/"))
        print(
            f"  sandbox processes:  {others / 2**20:7.0f} MiB resident (control plane, relay ...)"
        )
        print(f"  qemu resident:      {node.rss_bytes() / 2**20:7.0f} MiB")
        found = await node.exec(["sh", "-c", _GUEST_MEMORY], timeout=120)
        values = dict(line.split() for line in found.stdout.decode().splitlines())
        used = int(values["MemTotal"]) - int(values["MemAvailable"])
        daemons = ", ".join(
            f"{unit.removeprefix('kmm-')} {int(values[unit]) >> 10}"
            for unit in ("kmm-kubelet", "kmm-containerd", "kmm-kube-proxy")
        )
        print(f"  in the guest:       {used >> 10:7d} MiB used ({daemons} MiB resident)")
        other = node.image.kernels.other(status.kernel)
        started = time.monotonic()
        await vms.reboot(node.name, kernel=other, timeout=600)
        print(f"  reboot, Node Ready: {time.monotonic() - started:7.2f} s  ({other})")
    finally:
        cluster.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="also build the image cold")
    parser.add_argument("--accel", default="tcg", choices=("auto", "kvm", "tcg"))
    parser.add_argument(
        "--sandbox", action="store_true", help="a sandbox with one VM node instead of a bare one"
    )
    args = parser.parse_args()
    image = _image(args.cold)
    if args.sandbox:
        asyncio.run(_sandbox(args.accel))
    else:
        asyncio.run(_node(image, args.accel))


if __name__ == "__main__":
    main()
