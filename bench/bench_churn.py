"""The operator under churn: label latency, CPU and API writes per change, beside a baseline.

Run: ``.venv/bin/python bench/bench_churn.py [--nodes 40] [--changes 150] [--seed 3]``

1. A sandbox of its own, started empty, the CRD and admission policy from
   ``deploy/``; ``kmm operator`` as a process (no leader election): its
   ``kmm_api_writes_total`` read from ``/metrics``, its CPU time from
   ``/proc/<pid>/stat``.
2. The churn of ``tests/churning.py`` (the churn test's generator, same
   seed): ``--nodes`` KWOK nodes and 3 Modules, waited for until the cluster
   equals the model of ``tests/expectations.py``; then ``--changes``
   changes to nodes and Modules (about 0.4 s apart); then waited for again
   (the settle).
3. An observer in this process (kmm's reflectors, list+watch, on Modules,
   Nodes, and the namespace's DaemonSets and role-labelled pods) logs every
   event and evaluates the model whenever the cluster changed, at most
   every 50 ms:

   - latency: for each node change (add, relabel, cordon, taint, kernel; a
     delete has no labels to get right), the time from its write returning
     to the first evaluation showing the node at (or past) that write's
     resourceVersion with its labels and pods as the model says. Printed:
     p50/p99 over all node changes, and over those that needed work (the
     node was not right when the change was first seen);
   - the baseline's pods: every pod event, with its resourceVersion.

4. The baseline (``bench/churnbaseline.py``): the writes the model says
   the churn's changes need, computed from the churn's own record of what
   it made (each node and Module after each change, at its write's
   revision) and from the pods the cluster placed and made Ready, never
   from what the operator wrote: one write per change of the model's
   outputs (a node's required labels; a DaemonSet wanted, changed or no
   longer wanted) plus a finalizer write per Module created or deleted.
   An operator that never saw a short-lived state writes less, so the
   ratio may dip under 1.

Printed after the settle: changes by kind, the operator's CPU seconds
(total and per change), its writes by (verb, resource) and per change, and
operator/baseline for the kinds the baseline counts (node patches,
DaemonSet writes, Module finalizer patches); status patches and Events are
shown apart, with no baseline (how often counts are worth writing is policy).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import os
import pathlib
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from prometheus_client import parser

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import churnbaseline  # noqa: E402
import churning  # noqa: E402
import expectations  # noqa: E402

from kmm.api import labels, modules  # noqa: E402
from kmm.cli import applying  # noqa: E402
from kmm.kube import client as kube_client  # noqa: E402
from kmm.kube import errors as kube_errors  # noqa: E402
from kmm.kube import listwatch, reflecting, resources  # noqa: E402
from kmm.runtime import stores  # noqa: E402
from kmm.sandbox import cluster, ports  # noqa: E402

NAMESPACE = "churn"
MODULES = 3
TICK = 0.05
KMM = pathlib.Path(sys.executable).with_name("kmm")
_MODULE_RESOURCE = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)


class Recording:
    """A reflector's sink: the objects of one resource, every event logged
    with its resourceVersion (etcd's revision: one order for all four)."""

    def __init__(self, kind: str, changed: asyncio.Event, log: list[Entry]) -> None:
        self.kind = kind
        self.objects: dict[str, stores.RawObject] = {}
        self.synced = asyncio.Event()
        self._changed = changed
        self._log = log

    def replace(self, items: list[stores.RawObject], resource_version: str) -> None:
        self.objects = {stores.key_of(obj): obj for obj in items}
        self._log.append(Entry(int(resource_version), self.kind, "REPLACE", "", items))
        self.synced.set()
        self._changed.set()

    def apply(self, event: listwatch.WatchEvent) -> None:
        if event["type"] == "BOOKMARK":
            return
        obj, key = event["object"], stores.key_of(event["object"])
        if event["type"] == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        version = int(obj["metadata"]["resourceVersion"])
        self._log.append(Entry(version, self.kind, event["type"], key, [obj]))
        self._changed.set()


@dataclasses.dataclass(frozen=True)
class Entry:
    version: int
    kind: str
    type: str
    key: str
    objects: list[stores.RawObject]


class Observer:
    """What the model reads, kept by kmm's reflectors; every event logged."""

    def __init__(self, api: kube_client.Client) -> None:
        self.changed = asyncio.Event()
        self.log: list[Entry] = []
        self.reflectors: list[reflecting.Reflector] = []

        def recording(
            kind: str, resource: resources.Resource, namespace: str | None, selector: str | None
        ) -> Recording:
            sink = Recording(kind, self.changed, self.log)
            source = listwatch.ApiListWatch(api, resource, namespace=namespace)
            self.reflectors.append(
                reflecting.Reflector(kind, source, sink, label_selector=selector)
            )
            return sink

        self.modules = recording("modules", _MODULE_RESOURCE, NAMESPACE, None)
        self.nodes = recording("nodes", resources.NODES, None, None)
        self.daemonsets = recording("daemonsets", resources.DAEMONSETS, NAMESPACE, None)
        self.pods = recording("pods", resources.PODS, NAMESPACE, labels.ROLE)

    def sinks(self) -> tuple[Recording, ...]:
        return (self.modules, self.nodes, self.daemonsets, self.pods)

    def snapshot(self) -> expectations.Snapshot:
        return snapshot_of({s.kind: s.objects for s in self.sinks()})

    def last_version(self) -> int:
        return max((e.version for e in self.log), default=0)


def snapshot_of(objects: Mapping[str, Mapping[str, stores.RawObject]]) -> expectations.Snapshot:
    return expectations.Snapshot(
        namespace=NAMESPACE,
        modules=list(objects["modules"].values()),
        nodes=list(objects["nodes"].values()),
        daemonsets=list(objects["daemonsets"].values()),
        pods=list(objects["pods"].values()),
    )


@dataclasses.dataclass
class Pending:
    change: churning.Change
    needed_work: bool | None = None  # set when the change is first seen


@dataclasses.dataclass
class Latencies:
    """From each node change to the first evaluation showing that node right."""

    pending: list[Pending] = dataclasses.field(default_factory=list)
    measured: list[tuple[float, bool]] = dataclasses.field(default_factory=list)

    def on_change(self, change: churning.Change) -> None:
        if change.kind in churning.NODE_KINDS and change.kind != "node-delete":
            self.pending.append(Pending(change))

    def evaluate(self, observer: Observer, now: float) -> list[tuple[str, str]]:
        found = observer.snapshot()
        left = expectations.differences(found, expectations.expect(found))
        wrong = {node for node, _ in left if node}
        for item in list(self.pending):
            name = item.change.target
            node = observer.nodes.objects.get(name)
            if node is None:
                if item.needed_work is not None:  # deleted since: nothing to get right
                    self.pending.remove(item)
                continue
            if int(node["metadata"]["resourceVersion"]) < int(item.change.resource_version):
                continue
            if item.needed_work is None:
                item.needed_work = name in wrong
            if name not in wrong:
                self.measured.append((now - item.change.at, item.needed_work))
                self.pending.remove(item)
        return left


# -- the baseline's inputs: the churn's changes and the cluster's pods -----


@dataclasses.dataclass
class Made:
    """The churn's changes, each with the node or Module as the churn made it."""

    changes: list[tuple[churning.Change, dict[str, Any] | None]] = dataclasses.field(
        default_factory=list
    )

    def record(self, churn: churning.Churn, change: churning.Change) -> None:
        name = change.target
        if change.kind in churning.NODE_KINDS:
            body = churn.node_object(name) if name in churn.nodes else None
        else:
            body = churn.module_body(name) if name in churn.modules else None
        self.changes.append((change, body))


def _deleted_at(log: list[Entry], kind: str, key: str, after: int) -> int:
    """The revision a delete took effect at: the first event showing it."""
    for entry in sorted(log, key=lambda e: e.version):
        if entry.kind != kind or entry.key != key or entry.version <= after:
            continue
        if entry.type == "DELETED" or entry.objects[0]["metadata"].get("deletionTimestamp"):
            return entry.version
    raise SystemExit(f"never saw {kind} {key} deleted")


def baseline_inputs(log: list[Entry], start: int, made: Made) -> list[churnbaseline.Input]:
    """The churn's changes at their revisions, and every pod event after ``start``."""
    inputs = []
    for change, body in made.changes:
        kind: churnbaseline.Kind = "nodes" if change.kind in churning.NODE_KINDS else "modules"
        key = change.target if kind == "nodes" else f"{NAMESPACE}/{change.target}"
        revision = (
            int(change.resource_version)
            if change.resource_version
            else _deleted_at(log, kind, key, start)
        )
        inputs.append(churnbaseline.Input(revision, kind, change.target, body))
    for entry in log:
        if entry.kind != "pods" or entry.version <= start:
            continue
        for obj in entry.objects:
            body = None if entry.type == "DELETED" else obj
            inputs.append(churnbaseline.Input(entry.version, "pods", stores.key_of(obj), body))
    return inputs


async def observe(observer: Observer, latencies: Latencies, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(observer.changed.wait(), 0.5)
        observer.changed.clear()
        latencies.evaluate(observer, loop.time())
        await asyncio.sleep(TICK)


async def settle(observer: Observer, latencies: Latencies, what: str, bound: float = 300) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    while True:
        left = latencies.evaluate(observer, loop.time())
        if not left:
            return
        if loop.time() > deadline:
            shown = "\n".join(f"  {n or '-'}: {t}" for n, t in left[:30])
            raise SystemExit(f"never settled ({what}); {len(left)} differences:\n{shown}")
        await asyncio.sleep(0.5)


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def writes(port: int) -> collections.Counter[tuple[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as answer,
    ):
        text = await answer.text()
    found: collections.Counter[tuple[str, str]] = collections.Counter()
    for family in parser.text_string_to_metric_families(text):
        if family.name == "kmm_api_writes":
            for sample in family.samples:
                if sample.name == "kmm_api_writes_total":
                    found[sample.labels["verb"], sample.labels["resource"]] = int(sample.value)
    return found


async def quiet(port: int, *, still: float = 3.0) -> collections.Counter[tuple[str, str]]:
    """The operator's writes once they stopped changing for ``still`` seconds
    (a settled model may still owe a status write or an Event)."""
    loop = asyncio.get_running_loop()
    last, since = await writes(port), loop.time()
    while loop.time() - since < still:
        await asyncio.sleep(0.5)
        now = await writes(port)
        if now != last:
            last, since = now, loop.time()
    return last


@contextlib.asynccontextmanager
async def operator(kubeconfig: pathlib.Path, log: pathlib.Path) -> AsyncIterator[tuple[int, int]]:
    """``kmm operator`` as a process; (pid, metrics port) once ready."""
    (port,) = ports.free_ports(1)
    argv = [str(KMM), "operator", f"--kubeconfig={kubeconfig}", f"--metrics-port={port}",
            f"--health-port={port}", "--bind-address=127.0.0.1", "--no-leader-election"]  # fmt: skip
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)
    deadline = asyncio.get_running_loop().time() + 120
    try:
        while True:
            if asyncio.get_running_loop().time() > deadline:
                raise SystemExit(f"operator never ready: {log.read_text()[-2000:]}")
            if process.returncode is not None:
                raise SystemExit(f"operator exited: {log.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError):
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"http://127.0.0.1:{port}/readyz") as answer,
                ):
                    if answer.status == 200:
                        break
            await asyncio.sleep(0.5)
        yield process.pid, port
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)


def percentile(values: list[float], fraction: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[round(fraction * 100) - 1]


@contextlib.contextmanager
def sandbox() -> Iterator[Any]:
    directory = pathlib.Path(tempfile.mkdtemp(prefix="kmm-bench-churn-"))
    cache = pathlib.Path(os.environ.get("KMM_CACHE_DIR", pathlib.Path.home() / ".cache" / "kmm"))
    options = cluster.Options(directory=directory, cache_dir=cache, nodes=0, start_timeout=600)
    record = asyncio.run(cluster.up(options))
    try:
        yield record
    finally:
        cluster.down(directory)


async def install(api: kube_client.Client) -> None:
    docs = [
        doc
        for folder in ("crd", "admission")
        for path in sorted((ROOT / "deploy" / folder).glob("*.yaml"))
        for doc in applying.load_documents(path.read_text())
    ]
    docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    await applying.apply_documents(api, docs)
    while True:  # the CRD serves once Established
        try:
            await api.request("GET", _MODULE_RESOURCE.path(NAMESPACE))
            break
        except kube_errors.NotFound:
            await asyncio.sleep(0.5)
    await cluster.wait_default_account(api, NAMESPACE, timeout=60)


async def run(record: Any, args: argparse.Namespace) -> None:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(record.kubeconfig), client_configuration=configuration
    )
    stop = asyncio.Event()
    async with cluster.api_client(record.kubeconfig) as api:
        await install(api)
    async with (
        cluster.api_client(record.kubeconfig) as api,
        client.ApiClient(configuration) as churn_api,
        operator(record.kubeconfig, record.directory / "operator.log") as (pid, port),
    ):
        observer = Observer(api)
        tasks = [asyncio.ensure_future(r.run()) for r in observer.reflectors]
        try:
            for sink in observer.sinks():
                await sink.synced.wait()
            churn = churning.Churn(
                churn_api, churning.Settings(seed=args.seed, namespace=NAMESPACE)
            )
            latencies = Latencies()
            await churn.populate(args.nodes, MODULES)
            await settle(observer, latencies, "the starting cluster")
            writes_before, cpu_before = await quiet(port), cpu_seconds(pid)
            start = observer.last_version()
            begun: dict[churnbaseline.Kind, list[dict[str, Any]]] = {
                "nodes": [churn.node_object(n) for n in churn.nodes],
                "modules": [churn.module_body(m) for m in churn.modules],
                "pods": list(observer.pods.objects.values()),
            }
            made = Made()

            def on_change(change: churning.Change) -> None:
                made.record(churn, change)
                latencies.on_change(change)

            tasks.append(asyncio.ensure_future(observe(observer, latencies, stop)))
            started = asyncio.get_running_loop().time()
            changes = await churn.run(args.changes, on_change=on_change)
            took = asyncio.get_running_loop().time() - started
            await settle(observer, latencies, f"after {len(changes)} changes")
            written = await quiet(port) - writes_before
            cpu = cpu_seconds(pid) - cpu_before
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    baseline = churnbaseline.baseline(
        NAMESPACE,
        begun,
        baseline_inputs(observer.log, start, made),
        finalizers=sum(c.kind in ("module-create", "module-delete") for c in changes),
    )
    report(args, changes, took, latencies, baseline, written, cpu)


def report(
    args: argparse.Namespace,
    changes: Sequence[churning.Change],
    took: float,
    latencies: Latencies,
    baseline: Mapping[str, int],
    written: collections.Counter[tuple[str, str]],
    cpu: float,
) -> None:
    count = len(changes)
    kinds = collections.Counter(c.kind for c in changes)
    every = [t for t, _ in latencies.measured]
    worked = [t for t, needed in latencies.measured if needed]
    total = sum(written.values())
    operator_writes = {
        "node label patch": written["PATCH", "nodes"],
        "DaemonSet write": sum(n for (_, r), n in written.items() if r == "apps/daemonsets"),
        "finalizer": written["PATCH", "kmm.sigs.x-k8s.io/modules"],
    }
    lines = [
        f"churn: seed {args.seed}, {count} changes in {took:.0f} s, {args.nodes} nodes to start",
        "  " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())),
        f"node change -> that node's labels and pods right ({len(every)} measured,"
        f" {len(latencies.pending)} never seen right):",
        f"  all:                 p50 {percentile(every, 0.5):.2f} s, p99 {percentile(every, 0.99):.2f} s",
        f"  needing work ({len(worked):3}): p50 {percentile(worked, 0.5):.2f} s,"
        f" p99 {percentile(worked, 0.99):.2f} s",
        f"operator CPU: {cpu:.1f} s, {cpu / count:.3f} s per change",
        f"operator API writes: {total}, {total / count:.2f} per change",
        *(f"    {verb:6} {resource:34} {n}" for (verb, resource), n in sorted(written.items())),
        "against the writes the model says the churn's changes and the pods' transitions need:",
    ]
    for kind, have in operator_writes.items():
        floor = baseline.get(kind, 0)
        lines.append(
            f"  {kind:17} operator {have:5}  baseline {floor:5}  {have / max(floor, 1):.2f}x"
        )
    have, floor = sum(operator_writes.values()), sum(baseline.values())
    lines += [
        f"  {'together':17} operator {have:5}  baseline {floor:5}  {have / max(floor, 1):.2f}x;"
        f" baseline {floor / count:.2f} per change",
        f"  status patches {written['PATCH', 'kmm.sigs.x-k8s.io/modules/status']},"
        f" events {written['POST', 'events']} (no baseline)",
    ]
    print("\n".join(lines))


def main() -> None:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--nodes", type=int, default=40)
    arguments.add_argument("--changes", type=int, default=150)
    arguments.add_argument("--seed", type=int, default=3)
    args = arguments.parse_args()
    with sandbox() as record:
        asyncio.run(run(record, args))


if __name__ == "__main__":
    main()
