"""The operator under churn: label latency, CPU and API writes per change, beside an ideal operator.

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
   - the baseline: the log replayed in etcd's order (resourceVersions are
     its revisions, one order over all four resources), the model evaluated
     after each revision that changed something it reads, and one write
     counted per change of its outputs: a node's required labels, a
     DaemonSet wanted, changed or no longer wanted (not those of a deleted
     Module: the garbage collector deletes them), plus a finalizer write
     per Module created or deleted. That is an operator that writes once
     for every state the cluster went through; one that never saw a
     short-lived state writes less, so the ratio may dip under 1.

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
import json
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


# -- the baseline: the run replayed in etcd's order ------------------------


def _relevant(kind: str, obj: Mapping[str, Any]) -> Any:
    """What the model reads of an object (DaemonSets: nothing; it wants
    them from Modules and nodes), to skip events that change nothing it reads."""
    metadata = obj.get("metadata") or {}
    if kind == "nodes":
        kernel = ((obj.get("status") or {}).get("nodeInfo") or {}).get("kernelVersion")
        return (metadata.get("labels"), obj.get("spec"), kernel)
    if kind == "pods":
        return (
            metadata.get("labels"),
            metadata.get("deletionTimestamp"),
            (obj.get("spec") or {}).get("nodeName"),
            expectations.is_ready(obj),
        )
    if kind == "modules":
        return (metadata.get("uid"), metadata.get("deletionTimestamp"), obj.get("spec"))
    return None


def _outputs(expected: expectations.Expected) -> tuple[dict[str, str], dict[str, str]]:
    """The model's outputs an operator writes: each node's required labels,
    each wanted DaemonSet's spec (by identity)."""
    required = {n: json.dumps(found, sort_keys=True) for n, found in expected.labels.items()}
    wanted = {
        json.dumps(dict(w.identity), sort_keys=True): json.dumps(
            [w.image, dict(w.node_selector), list(w.tolerations)], sort_keys=True
        )
        for w in expected.daemonsets
    }
    return required, wanted


def ideal_writes(log: list[Entry], start: int, churn: Sequence[churning.Change]) -> dict[str, int]:
    """The writes of an operator that follows every state the cluster went
    through after revision ``start``, one write per change: a node's
    required labels changed (a new node's counts only when it needs any),
    a DaemonSet wanted, changed or no longer wanted, a finalizer per Module
    created or deleted. An operator may see fewer states (a state gone
    before it looked costs it nothing) and write less."""
    state: dict[str, dict[str, stores.RawObject]] = {
        k: {} for k in ("modules", "nodes", "daemonsets", "pods")
    }
    found = collections.Counter[str]()
    required: dict[str, str] = {}
    wanted: dict[str, str] = {}
    ordered = sorted(log, key=lambda e: e.version)
    dirty = False
    for index, entry in enumerate(ordered):
        before = [_relevant(entry.kind, o) for o in state[entry.kind].values()]
        if entry.type == "REPLACE":
            state[entry.kind] = {stores.key_of(o): o for o in entry.objects}
        elif entry.type == "DELETED":
            state[entry.kind].pop(entry.key, None)
        else:
            state[entry.kind][entry.key] = entry.objects[0]
        after = [_relevant(entry.kind, o) for o in state[entry.kind].values()]
        dirty = dirty or before != after
        if not dirty or (index + 1 < len(ordered) and ordered[index + 1].version == entry.version):
            continue
        dirty = False
        labels_now, wanted_now = _outputs(expectations.expect(snapshot_of(state)))
        if entry.version > start:
            found["node label patch"] += sum(
                value != required.get(node, "{}") for node, value in labels_now.items()
            )
            # The garbage collector, not the operator, deletes a deleted Module's DaemonSets.
            live = {
                m["metadata"]["name"]
                for m in state["modules"].values()
                if not m["metadata"].get("deletionTimestamp")
            }
            found["DaemonSet write"] += sum(
                wanted.get(key) != wanted_now.get(key)
                and (key in wanted_now or json.loads(key)[labels.MODULE_NAME] in live)
                for key in wanted.keys() | wanted_now.keys()
            )
        required, wanted = labels_now, wanted_now
    found["finalizer"] = sum(c.kind in ("module-create", "module-delete") for c in churn)
    return dict(found)


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
            tasks.append(asyncio.ensure_future(observe(observer, latencies, stop)))
            started = asyncio.get_running_loop().time()
            changes = await churn.run(args.changes, on_change=latencies.on_change)
            took = asyncio.get_running_loop().time() - started
            await settle(observer, latencies, f"after {len(changes)} changes")
            written = await quiet(port) - writes_before
            cpu = cpu_seconds(pid) - cpu_before
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    ideal = ideal_writes(observer.log, start, changes)
    report(args, changes, took, latencies, ideal, written, cpu)


def report(
    args: argparse.Namespace,
    changes: Sequence[churning.Change],
    took: float,
    latencies: Latencies,
    ideal: Mapping[str, int],
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
        "against an operator writing once per state the cluster went through (the model, replayed):",
    ]
    for kind, have in operator_writes.items():
        floor = ideal.get(kind, 0)
        lines.append(f"  {kind:17} operator {have:5}  ideal {floor:5}  {have / max(floor, 1):.2f}x")
    have, floor = sum(operator_writes.values()), sum(ideal.values())
    lines += [
        f"  {'together':17} operator {have:5}  ideal {floor:5}  {have / max(floor, 1):.2f}x;"
        f" ideal {floor / count:.2f} per change",
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
