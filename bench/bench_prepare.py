"""Prepare and unprepare: ``kmm driver``, the Kubernetes DRA test driver, the disk's floor.

Run: ``.venv/bin/python bench/bench_prepare.py [--rounds 200] [--big-rounds 40] [--dir /tmp]``

1. A sandbox (one KWOK node, which both drivers serve) in a temporary
   directory under ``--dir``.
2. Two drivers as processes, each on its own plugin and CDI directories under
   ``--dir``: ``kmm driver`` on a fake host tree whose module has 32 devices,
   and the Kubernetes project's DRA test driver (``test/e2e/dra/test-driver``
   of the pinned ``k8s.io/kubernetes``, ``kubelet-plugin``, built like the
   sandbox's binaries) with 32 devices and a client limit of 1,000 QPS, so
   that its GET of every claim is not throttled by its default of 50.
3. ResourceClaims created in the sandbox, their ``status.allocation`` written
   as the scheduler writes it (one device of the driver per claim); every
   prepare gets fresh claims.
4. One gRPC client (grpc.aio on the generated ``v1`` stubs) calls each
   driver's DRA socket, as the kubelet does, alternating between drivers:
   per round, prepare a batch of 1 (or 32) claims, then unprepare them
   (which driver goes first alternates between rounds).
   Every call is timed; every claim must be answered without error.
5. The issue's floor for a crash-safe prepare, with the bytes kmm keeps:
   per round, one CDI-sized file per claim (kmm's spec) and one
   checkpoint-sized file (kmm's state holding the batch, as a snapshot),
   each written to a temporary file, fsynced and renamed, then one fsync of
   the directory (in the same filesystem as the drivers' files).

6. A third server in the same rounds, for what Python's gRPC costs alone:
   a grpc.aio server on the same ``v1`` stubs (this file, ``--serve-no-op``)
   that answers every claim at once, with no devices and no work.

Printed: p50 and p99 per server, call and batch size; kmm's ratio to the
floor (prepare) and to the test driver (both calls); each server's CPU time
per call over the timed rounds (its process, all threads).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import Any

from grpc import aio

from kmm.cli import paths as cli_paths
from kmm.kube import client as kube_client
from kmm.kube import resources
from kmm.kubeletplugin import checkpointing, plugins
from kmm.kubeletplugin.protos import dra_v1_pb2, dra_v1_pb2_grpc
from kmm.sandbox import building, cluster, components

DEVICES = 32
NAMESPACE = "bench"
MODULE = "benchdev"


def cpu_seconds(process: asyncio.subprocess.Process | None) -> float:
    """User + system CPU a driver process has used (``/proc/PID/stat``)."""
    assert process is not None
    fields = pathlib.Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Driver:
    """One driver process: its name, sockets, devices and the claims made for it."""

    def __init__(self, label: str, name: str, devices: list[str], socket: pathlib.Path) -> None:
        self.label, self.name, self.devices, self.socket = label, name, devices, socket
        self.process: asyncio.subprocess.Process | None = None
        self.times: dict[tuple[str, int], list[float]] = {}
        self.channel: aio.Channel | None = None

    @property
    def stub(self) -> dra_v1_pb2_grpc.DRAPluginStub:
        if self.channel is None:
            self.channel = aio.insecure_channel(f"unix://{self.socket}")
        return dra_v1_pb2_grpc.DRAPluginStub(self.channel)

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


class NoOpDRA(dra_v1_pb2_grpc.DRAPluginServicer):
    """Answers every claim at once: the gRPC round trip and nothing else."""

    async def NodePrepareResources(
        self, request: dra_v1_pb2.NodePrepareResourcesRequest, context: Any
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        response = dra_v1_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = ""
        return response

    async def NodeUnprepareResources(
        self, request: dra_v1_pb2.NodeUnprepareResourcesRequest, context: Any
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        response = dra_v1_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = ""
        return response


async def serve_no_op(socket: pathlib.Path) -> None:
    server = aio.server()
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(NoOpDRA(), server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    await server.wait_for_termination()


async def start_no_op(base: pathlib.Path, claims_of: Driver) -> Driver:
    socket = base / "no-op.sock"
    driver = Driver("grpc no-op", claims_of.name, claims_of.devices, socket)
    driver.process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve-no-op", str(socket)
    )
    return driver


def fake_host(root: pathlib.Path) -> None:
    """A host tree whose module ``benchdev`` has 32 character devices."""
    (root / "dev").mkdir(parents=True)
    (root / "sys/module" / MODULE).mkdir(parents=True)
    for i in range(DEVICES):
        entry = root / "sys/class" / MODULE / f"{MODULE}{i}"
        entry.mkdir(parents=True)
        (entry / "dev").write_text(f"240:{i}\n")
        (root / "dev" / f"{MODULE}{i}").write_text("")


async def start_kmm(base: pathlib.Path, kubeconfig: pathlib.Path, node: str) -> Driver:
    root = base / "kmm"
    fake_host(root)
    name = f"{MODULE}.kmm.bench"
    driver = Driver(
        "kmm driver",
        name,
        [f"{MODULE}{i}" for i in range(DEVICES)],
        plugins.Paths.under(root, name).dra_socket,
    )
    with (base / "kmm-driver.log").open("wb") as log:
        driver.process = await asyncio.create_subprocess_exec(
            str(pathlib.Path(sys.executable).with_name("kmm")), "driver",
            f"--node={node}", f"--driver-name={name}", f"--module={MODULE}",
            f"--device-class={MODULE}", f"--root={root}", f"--kubeconfig={kubeconfig}",
            stdout=log, stderr=log,
        )  # fmt: skip
    return driver


async def start_test_driver(
    base: pathlib.Path, kubeconfig: pathlib.Path, node: str, executable: pathlib.Path
) -> Driver:
    root = base / "k8s"
    name = "bench.test.k8s.io"
    kubelet = root / "var/lib/kubelet"
    (kubelet / "plugins" / name).mkdir(parents=True)
    (kubelet / "plugins_registry").mkdir(parents=True)
    driver = Driver(
        "k8s test driver",
        name,
        [f"device-{i:02d}" for i in range(DEVICES)],
        kubelet / "plugins" / name / "dra.sock",
    )
    with (base / "test-driver.log").open("wb") as log:
        driver.process = await asyncio.create_subprocess_exec(
            str(executable), f"--kubeconfig={kubeconfig}", f"--drivername={name}",
            "--kube-api-qps=1000", "--kube-api-burst=1000",
            "kubelet-plugin", f"--node-name={node}", f"--num-devices={DEVICES}",
            f"--plugin-registration-path={kubelet / 'plugins_registry'}",
            f"--datadir={kubelet / 'plugins'}", f"--cdi-dir={root / 'var/run/cdi'}",
            stdout=log, stderr=log,
        )  # fmt: skip
    return driver


async def make_claims(
    api: kube_client.Client, driver: Driver, node: str, batches: Sequence[int]
) -> list[list[dra_v1_pb2.Claim]]:
    """Allocated claims for every round, as the scheduler leaves them."""
    limit = asyncio.Semaphore(16)

    async def one(device: str) -> dra_v1_pb2.Claim:
        name = f"c-{uuid.uuid4().hex[:12]}"
        async with limit:
            created = await api.request(
                "POST",
                resources.RESOURCE_CLAIMS.path(namespace=NAMESPACE),
                body={
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": NAMESPACE},
                    "spec": {
                        "devices": {
                            "requests": [{"name": "r", "exactly": {"deviceClassName": "bench"}}]
                        }
                    },
                },
            )
            created["status"] = {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "r", "driver": driver.name, "pool": node, "device": device}
                        ]
                    }
                }
            }
            await api.request(
                "PUT",
                resources.RESOURCE_CLAIMS.path(
                    namespace=NAMESPACE, name=name, subresource="status"
                ),
                body=created,
            )
        return dra_v1_pb2.Claim(namespace=NAMESPACE, name=name, uid=created["metadata"]["uid"])

    rounds = []
    for size in batches:
        rounds.append(list(await asyncio.gather(*(one(driver.devices[i]) for i in range(size)))))
    return rounds


async def call(driver: Driver, verb: str, refs: list[dra_v1_pb2.Claim]) -> float:
    stub = driver.stub
    started = time.perf_counter()
    if verb == "prepare":
        answer: Any = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=refs), timeout=60
        )
    else:
        answer = await stub.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=refs), timeout=60
        )
    elapsed = time.perf_counter() - started
    errors = {uid: a.error for uid, a in answer.claims.items() if a.error}
    if errors or len(answer.claims) != len(refs):
        raise SystemExit(f"{driver.label} {verb}: {len(answer.claims)} answers, errors {errors}")
    return elapsed


async def warm_up(driver: Driver, refs: list[dra_v1_pb2.Claim], timeout: float = 120) -> None:
    """Until the driver serves (socket up, caches synced): one untimed round."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if driver.socket.exists():
                await call(driver, "prepare", refs)
                await call(driver, "unprepare", refs)
                return
        except (SystemExit, aio.AioRpcError) as err:
            if time.monotonic() > deadline:
                raise SystemExit(f"{driver.label} does not serve: {err}") from err
        if driver.process is not None and driver.process.returncode is not None:
            raise SystemExit(f"{driver.label} exited with {driver.process.returncode}")
        await asyncio.sleep(0.5)


def floor_round(directory: pathlib.Path, batch: int, spec: bytes, checkpoint: bytes) -> float:
    """Write batch CDI-sized files + one checkpoint-sized file durably; its time."""

    def write(path: pathlib.Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        os.rename(tmp, path)

    started = time.perf_counter()
    for i in range(batch):
        write(directory / f"spec-{i}.json", spec)
    write(directory / "checkpoint.json", checkpoint)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    elapsed = time.perf_counter() - started
    for i in range(batch):
        os.unlink(directory / f"spec-{i}.json")
    return elapsed


async def main(args: argparse.Namespace) -> None:
    base = pathlib.Path(tempfile.mkdtemp(prefix="kb", dir=args.dir))
    sizes = [1] * args.rounds + [DEVICES] * args.big_rounds
    built = await building.ensure_built(cli_paths.cache_dir(), (components.DRA_TEST_DRIVER,))
    record = await cluster.up(
        cluster.Options(
            directory=base / "sandbox", cache_dir=cli_paths.cache_dir(), nodes=1, start_timeout=600
        )
    )
    node = record.node_names[0]
    drivers: list[Driver] = []
    try:
        async with cluster.api_client(record.kubeconfig) as api:
            await api.request(
                "POST",
                resources.NAMESPACES.path(),
                body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            )
            drivers = [
                await start_kmm(base, record.kubeconfig, node),
                await start_test_driver(base, record.kubeconfig, node, built["dra-test-driver"]),
            ]
            started = time.perf_counter()
            claims = {d.label: await make_claims(api, d, node, [1, *sizes]) for d in drivers}
            no_op = await start_no_op(base, drivers[0])
            drivers.append(no_op)
            claims[no_op.label] = claims[drivers[0].label]  # it looks nothing up
            print(
                f"{sum(len(r) for d in drivers[:2] for r in claims[d.label])} allocated claims made"
                f" in {time.perf_counter() - started:.1f} s"
            )
        for driver in drivers:
            await warm_up(driver, claims[driver.label][0])
        await asyncio.sleep(2)  # kmm's claim cache has seen every allocation
        kmm = drivers[0]
        kmm_files = plugins.Paths.under(base / "kmm", kmm.name)
        # The bytes kmm writes for a batch: one claim's spec, the checkpoint.
        samples: dict[int, tuple[bytes, bytes]] = {}
        floor_times: dict[int, list[float]] = {}
        floor_dir = base / "floor"
        floor_dir.mkdir()
        cpu_before = {d.label: cpu_seconds(d.process) for d in drivers}
        for index, size in enumerate(sizes, start=1):
            # Who goes first rotates too: a call right after another may find caches warm.
            for driver in drivers[index % 3 :] + drivers[: index % 3]:
                refs = claims[driver.label][index]
                for verb in ("prepare", "unprepare"):
                    elapsed = await call(driver, verb, refs)
                    driver.times.setdefault((verb, size), []).append(elapsed)
                    if driver is kmm and verb == "prepare" and size not in samples:
                        spec = next(kmm_files.cdi_dir.glob("*.json")).read_bytes()
                        # kmm's state holding the batch, as one file (its snapshot).
                        state = checkpointing.Checkpoint(kmm_files.plugin_data_dir)
                        state.load()
                        samples[size] = (spec, state.snapshot())
            # The floor in the same round, so that drift on a shared machine hits all three.
            floor_times.setdefault(size, []).append(floor_round(floor_dir, size, *samples[size]))
        print_results(base, drivers, floor_times)
        calls = 2 * len(sizes)
        for driver in drivers:
            used = cpu_seconds(driver.process) - cpu_before[driver.label]
            print(f"{driver.label}: {used / calls * 1e3:.2f} ms of CPU per call ({calls} calls)")
    finally:
        for driver in drivers:
            await driver.stop()
        cluster.down(record.directory)
        shutil.rmtree(base, ignore_errors=True)


def print_results(
    base: pathlib.Path, drivers: list[Driver], floor_times: dict[int, list[float]]
) -> None:
    kmm, other, no_op = drivers
    print(f"directory {base} (one filesystem for the drivers and the floor); times in ms")
    print(
        f"{'call':9} {'batch':>5} {'kmm p50':>8} {'p99':>7} {'test driver p50':>15} {'p99':>7}"
        f" {'no-op p50':>9} {'p99':>7} {'floor p50':>9} {'p99':>7} {'kmm/floor p50':>13}"
        f" {'kmm/test p50':>12} {'p99':>5}"
    )
    for verb in ("prepare", "unprepare"):
        for size in (1, DEVICES):
            mine, theirs = kmm.times[(verb, size)], other.times[(verb, size)]
            bare = no_op.times[(verb, size)]
            m50, m99 = percentile(mine, 0.5), percentile(mine, 0.99)
            t50, t99 = percentile(theirs, 0.5), percentile(theirs, 0.99)
            n50, n99 = percentile(bare, 0.5), percentile(bare, 0.99)
            floor_cells = f"{'-':>9} {'-':>7} {'-':>13}"
            if verb == "prepare":
                floor = floor_times[size]
                f50, f99 = percentile(floor, 0.5), percentile(floor, 0.99)
                floor_cells = f"{f50 * 1e3:9.2f} {f99 * 1e3:7.2f} {m50 / f50:13.2f}"
            print(
                f"{verb:9} {size:>5} {m50 * 1e3:8.2f} {m99 * 1e3:7.2f} {t50 * 1e3:15.2f}"
                f" {t99 * 1e3:7.2f} {n50 * 1e3:9.2f} {n99 * 1e3:7.2f} {floor_cells}"
                f" {m50 / t50:12.2f} {m99 / t99:5.2f}"
            )
    counts = {k: len(v) for k, v in kmm.times.items()}
    print(f"calls per server: {counts}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-no-op"]:
        asyncio.run(serve_no_op(pathlib.Path(sys.argv[2])))
        raise SystemExit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="rounds of 1 claim")
    parser.add_argument("--big-rounds", type=int, default=40, help="rounds of 32 claims")
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()))
    asyncio.run(main(parser.parse_args()))
