"""Prepare and unprepare: ``kmm driver`` against its I/O floor, a no-op server, the test driver.

Run: ``.venv/bin/python bench/bench_prepare.py [--rounds 200] [--big-rounds 60] [--dir /tmp]``

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
5. The floor: the least work kmm's guarantee needs, in this process, in the
   same rounds. kmm's prepare fsyncs nothing (``kubeletplugin.plugins`` says
   why): it appends a "started" line to its checkpoint journal, writes each
   claim's CDI spec (temporary file, rename), appends a "completed" line; an
   unprepare appends a "drop" line and removes the specs. Past 1 MiB of
   journal, a commit folds it into a new snapshot and an empty journal, each
   fsynced (``checkpointing``). The floor does exactly that I/O with the same
   bytes, and nothing else: after each of kmm's calls the lines it appended
   and the specs it wrote are read back (untimed, checked to be the two or
   one lines and the specs a call writes), and the floor's steps are planned
   from them before its timed region, snapshots included. It starts from a
   copy of kmm's snapshot and journal, so it compacts where kmm does; at the
   end its snapshot and journal must equal kmm's byte for byte, or the
   benchmark fails.

Printed: p50, p99 and mean per server, call and batch size (the mean is
where a compaction's cost shows: one per MiB of journal, about 1,700
one-claim rounds or 55 of 32 claims; the default counts pass it once);
kmm's ratio to each of the floor, the no-op server and the test driver;
each server's CPU time per call over the timed rounds (its process, all
threads).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import shutil
import statistics
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
from kmm.kubeletplugin import cdi, checkpointing, claims, plugins
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


class JournalTail:
    """Reads the lines kmm's driver appends to its checkpoint journal.

    An open descriptor on the journal, read from where the last read ended:
    when a compaction renames a new journal into place, the old file's last
    lines are still read through it, then the new file's lines after its
    header.
    """

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.offset = os.fstat(self.fd).st_size
        self.compactions = 0

    def lines(self) -> list[bytes]:
        """The whole lines appended since the last call."""
        found = self._drain()
        if os.stat(self.path).st_ino != os.fstat(self.fd).st_ino:
            os.close(self.fd)
            self.fd = os.open(self.path, os.O_RDONLY)
            self.offset = 0
            self.compactions += 1
            found += self._drain()[1:]  # the new journal's header is the compaction's
        return found

    def _drain(self) -> list[bytes]:
        data = os.pread(self.fd, os.fstat(self.fd).st_size - self.offset, self.offset)
        end = data.rfind(b"\n") + 1  # kmm writes whole lines; read only those
        self.offset += end
        return [line + b"\n" for line in data[:end].split(b"\n")[:-1]]

    def close(self) -> None:
        os.close(self.fd)


def change_of(line: bytes) -> dict[str, Any]:
    """The ``{"put": ..., "drop": ...}`` of a journal line."""
    change: dict[str, Any] = json.loads(line.split(b" ", 1)[1])
    return change


# The floor's steps, decided before the timed region: append a journal line,
# write a spec (temporary file and rename), remove a spec, compact.
Step = tuple[str, bytes, str]


class Floor:
    """The same bytes as kmm's driver, written the same way, with nothing else.

    A copy of kmm's checkpoint directory (snapshot and journal) and an empty
    CDI directory beside it. Per prepare: the "started" line appended, each
    claim's spec written to a temporary file and renamed, the "completed" line
    appended; per unprepare: the "drop" line appended, each spec removed.
    Nothing fsynced, as kmm fsyncs nothing there. When the journal passes
    kmm's limit after an append, the snapshot of the state at that point and a
    new journal's header are written as kmm's ``save`` writes them (temporary
    file, fsync, rename, directory fsync, each). Starting from kmm's own files
    and appending the same lines, the floor compacts where kmm does, so at the
    end its files must equal kmm's, byte for byte.
    """

    def __init__(
        self, directory: pathlib.Path, *, limit: int = checkpointing.JOURNAL_LIMIT
    ) -> None:
        self.data_dir = directory / "plugin"
        self.cdi_dir = directory / "cdi"
        self.limit = limit
        self.journal_path = self.data_dir / checkpointing.JOURNAL_NAME
        self.snapshot_path = self.data_dir / checkpointing.FILE_NAME
        self.journal_fd = -1
        self.size = 0
        self.header = b""
        self.model = checkpointing.Checkpoint(directory / "model")  # only encodes snapshots
        self.compactions = 0

    def begin(self, snapshot: bytes, journal: bytes) -> None:
        """Start from kmm's snapshot and journal as they are (untimed)."""
        self.data_dir.mkdir(parents=True)
        self.cdi_dir.mkdir(parents=True)
        self.snapshot_path.write_bytes(snapshot)
        self.journal_path.write_bytes(journal)
        self.journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND)
        self.size = len(journal)
        self.header = journal[: journal.index(b"\n") + 1]
        self.model.boot_id = change_of(self.header).get("bootID")
        records: dict[str, Any] = {}
        for line in journal.splitlines(keepends=True)[1:]:
            change = change_of(line)
            for uid in change.get("drop", []):
                records.pop(uid, None)
            records.update(change.get("put", {}))
        if records:  # the warm-up's claims were unprepared: the model starts empty
            raise SystemExit(f"kmm's checkpoint holds claims before the timed rounds: {records}")

    def plan(self, lines: Sequence[bytes], specs: Sequence[tuple[str, bytes | None]]) -> list[Step]:
        """One call's steps: ``lines[0]``, the specs (``None``: remove), the other lines."""
        steps: list[Step] = []
        for line in lines[:1]:
            steps.extend(self._append(line))
        for name, data in specs:
            steps.append(("unlink", b"", name) if data is None else ("spec", data, name))
        for line in lines[1:]:
            steps.extend(self._append(line))
        return steps

    def _append(self, line: bytes) -> list[Step]:
        steps: list[Step] = [("append", line, "")]
        change = change_of(line)
        for uid in change.get("drop", []):
            self.model.claims.pop(uid, None)
        for uid, raw in change.get("put", {}).items():
            self.model.claims[claims.ClaimUID(uid)] = checkpointing.ClaimRecord.from_dict(raw)
        self.size += len(line)
        if self.size > self.limit:
            steps.append(("compact", self.model.snapshot(), ""))
            self.size = len(self.header)
        return steps

    def run(self, steps: Sequence[Step]) -> float:
        """Do the steps; their time."""
        started = time.perf_counter()
        for kind, data, name in steps:
            if kind == "append":
                os.write(self.journal_fd, data)
            elif kind == "spec":
                path = self.cdi_dir / name
                tmp = self.cdi_dir / f".{name}.tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, data)
                os.close(fd)
                os.replace(tmp, path)
            elif kind == "unlink":
                os.unlink(self.cdi_dir / name)
            else:
                self._compact(data)
        return time.perf_counter() - started

    def _compact(self, snapshot: bytes) -> None:
        """kmm's ``save``: the snapshot, then a new journal, each durably."""
        durable(self.snapshot_path, snapshot, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        os.close(self.journal_fd)
        self.journal_fd = durable(self.journal_path, self.header, flags, keep=True)
        self.compactions += 1

    def close(self) -> None:
        os.close(self.journal_fd)


def durable(path: pathlib.Path, data: bytes, flags: int, *, keep: bool = False) -> int:
    """Temporary file, write, fsync, rename, directory fsync; the open file if kept."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, flags, 0o600)
    os.write(fd, data)
    os.fsync(fd)
    kept = os.dup(fd) if keep else -1
    os.close(fd)
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(directory)
    os.close(directory)
    return kept


class KmmCapture:
    """What kmm's driver wrote in one call, read back after it (untimed)."""

    def __init__(self, kmm: Driver, files: plugins.Paths) -> None:
        self.specs = cdi.SpecDir(files.cdi_dir, vendor=kmm.name)
        self.tail = JournalTail(files.plugin_data_dir / checkpointing.JOURNAL_NAME)

    def prepared(
        self, refs: Sequence[dra_v1_pb2.Claim]
    ) -> tuple[list[bytes], list[tuple[str, bytes | None]]]:
        """The two lines and the specs of a prepare, checked against what the floor replays."""
        lines = self.tail.lines()
        uids = {ref.uid for ref in refs}
        states = [
            {raw["state"] for raw in change_of(line).get("put", {}).values()} for line in lines
        ]
        keys = [set(change_of(line).get("put", {})) for line in lines]
        if keys != [uids, uids] or states != [{checkpointing.STARTED}, {checkpointing.COMPLETED}]:
            raise SystemExit(f"kmm's prepare wrote {lines!r}: not a started and a completed line")
        specs: list[tuple[str, bytes | None]] = []
        for ref in refs:
            path = self.specs.path_of(claims.ClaimUID(ref.uid))
            specs.append((path.name, path.read_bytes()))
        return lines, specs

    def unprepared(
        self, refs: Sequence[dra_v1_pb2.Claim]
    ) -> tuple[list[bytes], list[tuple[str, bytes | None]]]:
        """The line of an unprepare and the specs it removed, checked likewise."""
        lines = self.tail.lines()
        uids = [ref.uid for ref in refs]
        if [sorted(change_of(line).get("drop", [])) for line in lines] != [sorted(uids)]:
            raise SystemExit(f"kmm's unprepare wrote {lines!r}: not one drop line")
        specs: list[tuple[str, bytes | None]] = []
        for uid in uids:
            path = self.specs.path_of(claims.ClaimUID(uid))
            if path.exists():
                raise SystemExit(f"kmm's unprepare left {path}")
            specs.append((path.name, None))
        return lines, specs


def same_files(kmm_files: plugins.Paths, floor: Floor, capture: KmmCapture) -> str:
    """Check that the floor's files equal kmm's, byte for byte; say what was compared."""
    pairs = [
        (kmm_files.plugin_data_dir / checkpointing.JOURNAL_NAME, floor.journal_path),
        (kmm_files.plugin_data_dir / checkpointing.FILE_NAME, floor.snapshot_path),
    ]
    for theirs, ours in pairs:
        if theirs.read_bytes() != ours.read_bytes():
            raise SystemExit(f"the floor's {ours} differs from kmm's {theirs}")
    left = sorted(p.name for p in kmm_files.cdi_dir.iterdir())
    if left != sorted(p.name for p in floor.cdi_dir.iterdir()):
        raise SystemExit(f"the floor's CDI directory differs from kmm's ({left})")
    if floor.compactions != capture.tail.compactions:
        raise SystemExit(
            f"the floor compacted {floor.compactions} times, kmm {capture.tail.compactions}"
        )
    return (
        f"the floor's snapshot and journal ({floor.journal_path.stat().st_size} bytes) equal"
        f" kmm's byte for byte; {floor.compactions} compaction(s) each"
    )


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
            claims_of = {d.label: await make_claims(api, d, node, [1, *sizes]) for d in drivers}
            no_op = await start_no_op(base, drivers[0])
            drivers.append(no_op)
            claims_of[no_op.label] = claims_of[drivers[0].label]  # it looks nothing up
            print(
                f"{sum(len(r) for d in drivers[:2] for r in claims_of[d.label])} allocated claims"
                f" made in {time.perf_counter() - started:.1f} s"
            )
        for driver in drivers:
            await warm_up(driver, claims_of[driver.label][0])
        await asyncio.sleep(2)  # kmm's claim cache has seen every allocation
        kmm = drivers[0]
        kmm_files = plugins.Paths.under(base / "kmm", kmm.name)
        capture = KmmCapture(kmm, kmm_files)
        floor = Floor(base / "floor")  # the drivers' filesystem
        floor.begin(
            (kmm_files.plugin_data_dir / checkpointing.FILE_NAME).read_bytes(),
            os.pread(capture.tail.fd, capture.tail.offset, 0),
        )
        floor_times: dict[tuple[str, int], list[float]] = {}
        cpu_before = {d.label: cpu_seconds(d.process) for d in drivers}
        for index, size in enumerate(sizes, start=1):
            # Who goes first rotates too: a call right after another may find caches warm.
            for driver in drivers[index % 3 :] + drivers[: index % 3]:
                refs = claims_of[driver.label][index]
                for verb in ("prepare", "unprepare"):
                    elapsed = await call(driver, verb, refs)
                    driver.times.setdefault((verb, size), []).append(elapsed)
                    if driver is kmm and verb == "prepare":
                        prepare_steps = floor.plan(*capture.prepared(refs))
                    elif driver is kmm:
                        unprepare_steps = floor.plan(*capture.unprepared(refs))
            # The floor in the same round, so that drift on a shared machine hits all four.
            floor_times.setdefault(("prepare", size), []).append(floor.run(prepare_steps))
            floor_times.setdefault(("unprepare", size), []).append(floor.run(unprepare_steps))
        checked = same_files(kmm_files, floor, capture)
        floor.close()
        capture.tail.close()
        print_results(base, drivers, floor_times)
        print(checked)
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
    base: pathlib.Path, drivers: list[Driver], floor_times: dict[tuple[str, int], list[float]]
) -> None:
    kmm, other, no_op = drivers
    columns = {
        "kmm": kmm.times,
        "floor": floor_times,
        "no-op": no_op.times,
        "test driver": other.times,
    }
    print(f"directory {base} (one filesystem for the drivers and the floor); times in ms")
    print(
        f"{'call':9} {'batch':>5}"
        + "".join(f" {name + ' p50':>15} {'p99':>7} {'mean':>7}" for name in columns)
    )
    for verb in ("prepare", "unprepare"):
        for size in (1, DEVICES):
            cells = "".join(
                f" {percentile(t[(verb, size)], 0.5) * 1e3:15.3f}"
                f" {percentile(t[(verb, size)], 0.99) * 1e3:7.3f}"
                f" {statistics.mean(t[(verb, size)]) * 1e3:7.3f}"
                for t in columns.values()
            )
            print(f"{verb:9} {size:>5}{cells}")
    print("kmm's ratio to each baseline (kmm / baseline):")
    print(
        f"{'call':9} {'batch':>5}"
        + "".join(
            f" {'/' + name + ' p50':>16} {'p99':>6} {'mean':>6}" for name in list(columns)[1:]
        )
    )
    for verb in ("prepare", "unprepare"):
        for size in (1, DEVICES):
            mine = kmm.times[(verb, size)]
            cells = "".join(
                f" {percentile(mine, 0.5) / percentile(t[(verb, size)], 0.5):16.2f}"
                f" {percentile(mine, 0.99) / percentile(t[(verb, size)], 0.99):6.2f}"
                f" {statistics.mean(mine) / statistics.mean(t[(verb, size)]):6.2f}"
                for t in list(columns.values())[1:]
            )
            print(f"{verb:9} {size:>5}{cells}")
    counts = {f"{verb} {size}": len(v) for (verb, size), v in kmm.times.items()}
    print(f"calls per server: {counts}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-no-op"]:
        asyncio.run(serve_no_op(pathlib.Path(sys.argv[2])))
        raise SystemExit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="rounds of 1 claim")
    parser.add_argument("--big-rounds", type=int, default=60, help="rounds of 32 claims")
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()))
    asyncio.run(main(parser.parse_args()))
