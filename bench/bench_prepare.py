"""NodePrepareResources latency with a warm claim cache, beside a file-writing floor.

Run: ``.venv/bin/python bench/bench_prepare.py [--rounds N] [--dir DIR]``

A real ``Plugin`` serves the kubelet gRPC API on unix sockets; its claims come
from a ``ClaimCache`` (list+watch) pointed at a tiny in-process HTTP server
playing the API server, warmed before timing. A gRPC client plays the
kubelet and prepares batches of 1 and 32 fresh claims (each then unprepared,
untimed). The floor is a bare loop writing and fsyncing the same files a
prepare writes (checkpoint "started", one CDI spec per claim, checkpoint
"completed": temp file, fsync, rename, directory fsync), with the same bytes.
Printed: p50/p99 of both, their ratio, and API requests per prepare.
The directory should be on the same filesystem the node would use.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from aiohttp import web
from grpc import aio

from kmm.kube import client as kube_client
from kmm.kube import kubeconfigs
from kmm.kubeletplugin import (
    checkpointing,
    claimcache,
    claims,
    owners,
    plugins,
    publishing,
)
from kmm.kubeletplugin.protos import dra_v1_pb2, dra_v1_pb2_grpc

DRIVER = "bench.example.com"
NODE = "node-bench"


class Owner:
    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    @property
    def lock(self) -> asyncio.Lock:
        return self._lock

    async def claim_allocated(self, claim: claims.ClaimRef) -> None:
        return None

    async def claim_released(self, claim: claims.ClaimRef) -> None:
        return None

    def request_shutdown(self, reason: str) -> None:
        raise SystemExit(f"shutdown requested: {reason}")


class Policy:
    name = "bench"

    def devices(self) -> Sequence[publishing.Device]:
        return []

    async def prepare(self, claim: owners.PreparingClaim) -> Sequence[owners.DeviceAllocation]:
        return [
            owners.DeviceAllocation(
                request_names=(r["request"],),
                pool_name=r["pool"],
                device_name=r["device"],
                edits={"deviceNodes": [{"path": f"/dev/{r['device']}", "type": "c"}]},
            )
            for r in claim.results
        ]

    async def unprepare(self, uid: claims.ClaimUID) -> None:
        return None

    def restore(
        self, prepared: Mapping[claims.ClaimUID, Sequence[checkpointing.PreparedDevice]]
    ) -> None:
        return None

    def health_supported(self) -> bool:
        return False

    async def watch_health(self) -> AsyncIterator[Sequence[owners.DeviceHealthReport]]:
        if False:
            yield []


def make_claims(count: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        uid = str(uuid.uuid4())
        out.append(
            {
                "metadata": {
                    "name": f"c-{uid[:8]}",
                    "namespace": "bench",
                    "uid": uid,
                    "resourceVersion": str(i + 1),
                },
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {"request": "r", "driver": DRIVER, "pool": NODE, "device": f"d{i}"}
                            ]
                        }
                    }
                },
            }
        )
    return out


async def api_server(items: list[dict[str, Any]]) -> web.AppRunner:
    async def list_claims(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch"):
            response = web.StreamResponse()
            await response.prepare(request)
            await asyncio.Event().wait()  # quiet watch, held until shutdown
        return web.json_response({"items": items, "metadata": {"resourceVersion": "1"}})

    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/resourceclaims", list_claims)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def floor_write(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)


def floor(
    directory: pathlib.Path, batch: int, rounds: int, sample: dict[str, bytes]
) -> list[float]:
    directory.mkdir(parents=True, exist_ok=True)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        floor_write(directory / "checkpoint.json", sample["checkpoint"])
        for i in range(batch):
            floor_write(directory / f"spec{i}.json", sample["spec"])
        floor_write(directory / "checkpoint.json", sample["checkpoint"])
        times.append(time.perf_counter() - start)
        for i in range(batch):
            os.unlink(directory / f"spec{i}.json")
    return times


async def main(rounds: int, base: pathlib.Path) -> None:
    root = pathlib.Path(tempfile.mkdtemp(prefix="kb", dir=base))
    batches = {1: rounds, 32: max(10, rounds // 4)}
    pool = {size: [make_claims(size) for _ in range(count)] for size, count in batches.items()}
    everything = [c for rounds_ in pool.values() for batch in rounds_ for c in batch]
    runner = await api_server(everything)
    port = runner.addresses[0][1]
    api = kube_client.Client(
        kubeconfigs.Access(server=f"http://127.0.0.1:{port}", source="the bench's fake API server")
    )
    cache = claimcache.ClaimCache(api, on_error=lambda e, m: print("error:", m, e))
    paths = plugins.Paths.under(root, DRIVER)
    plugin = plugins.Plugin(
        DRIVER, node=NODE, owner=Owner(), policy=Policy(), claim_source=cache, paths=paths
    )
    await plugin.start()
    plugin.allow_claims()
    await asyncio.wait_for(cache.synced.wait(), timeout=30)
    channel = aio.insecure_channel(f"unix://{paths.dra_socket}")
    stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
    results: dict[int, dict[str, Any]] = {}
    sample: dict[str, bytes] = {}
    try:
        for size, claim_batches in pool.items():
            times = []
            requests_before = api.counter.total
            for batch in claim_batches:
                refs = [
                    dra_v1_pb2.Claim(
                        namespace=c["metadata"]["namespace"],
                        name=c["metadata"]["name"],
                        uid=c["metadata"]["uid"],
                    )
                    for c in batch
                ]
                start = time.perf_counter()
                response = await stub.NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(claims=refs)
                )
                times.append(time.perf_counter() - start)
                assert all(not a.error for a in response.claims.values()), response
                if not sample:
                    sample["checkpoint"] = plugin.checkpoint.path.read_bytes()
                    sample["spec"] = next(paths.cdi_dir.iterdir()).read_bytes()
                await stub.NodeUnprepareResources(
                    dra_v1_pb2.NodeUnprepareResourcesRequest(claims=refs)
                )
            results[size] = {
                "times": times,
                "api_per_prepare": (api.counter.total - requests_before) / len(claim_batches),
            }
    finally:
        await channel.close()
        await plugin.stop()
        await api.close()
        await runner.cleanup()
    print(f"directory: {root} ({rounds} rounds of 1 claim, {batches[32]} of 32)")
    print(
        f"{'batch':>5} {'p50 ms':>8} {'p99 ms':>8} {'floor p50':>10} {'floor p99':>10} "
        f"{'ratio p50':>9} {'ratio p99':>9} {'API/prepare':>11}"
    )
    for size, result in results.items():
        times = result["times"]
        floor_times = floor(root / "floor", size, len(times), sample)
        p50, p99 = percentile(times, 0.5), percentile(times, 0.99)
        f50, f99 = percentile(floor_times, 0.5), percentile(floor_times, 0.99)
        print(
            f"{size:>5} {p50 * 1e3:>8.2f} {p99 * 1e3:>8.2f} {f50 * 1e3:>10.2f} {f99 * 1e3:>10.2f} "
            f"{p50 / f50:>9.2f} {p99 / f99:>9.2f} {result['api_per_prepare']:>11.1f}"
        )
    print(f"(mean of all prepare calls: {statistics.mean(results[1]['times']) * 1e3:.2f} ms for 1)")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()))
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.dir))
