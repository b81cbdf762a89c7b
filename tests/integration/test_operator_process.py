"""``kmm operator`` as a process: SIGKILL mid-reconcile, and two replicas.

Writes are counted by the operator itself (``kmm_api_writes_total`` on
``/metrics``, from the WriteCounter on its client), so "only the leader
writes" is an exact count, not a timing.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import test_operator_support as support
from kubernetes_asyncio import client
from prometheus_client import parser

from kmm.api import labels, modules
from kmm.sandbox import testing

manifests = support.manifests

KMM = str(Path(sys.executable).with_name("kmm"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Replica:
    def __init__(self, kubeconfig: Path, log: Path, *, identity: str, lease_ns: str | None) -> None:
        self.identity = identity
        self.port = _free_port()
        self.log = log
        argv = [
            KMM,
            "operator",
            f"--kubeconfig={kubeconfig}",
            f"--metrics-port={self.port}",
            f"--health-port={self.port}",
            "--bind-address=127.0.0.1",
            f"--identity={identity}",
        ]
        if lease_ns:
            # Short lease timing, as a user sets it: a takeover in seconds.
            argv += [
                f"--namespace-of-lease={lease_ns}",
                "--lease-duration=4",
                "--renew-deadline=3",
                "--retry-period=1",
            ]
        else:
            argv += ["--no-leader-election"]
        with log.open("ab") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=out)

    async def get(self, path: str) -> tuple[int, str]:
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(
                    f"http://127.0.0.1:{self.port}{path}", timeout=aiohttp.ClientTimeout(total=5)
                ) as response,
            ):
                return response.status, await response.text()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return 0, ""

    async def ready(self) -> bool:
        return (await self.get("/readyz"))[0] == 200

    async def writes(self) -> int:
        """API writes so far, Lease renewals excluded."""
        status, text = await self.get("/metrics")
        assert status == 200, f"{self.identity} metrics unavailable"
        total = 0
        for family in parser.text_string_to_metric_families(text):
            if family.name == "kmm_api_writes":
                for sample in family.samples:
                    if sample.name.endswith("_total") and "leases" not in sample.labels["resource"]:
                        total += int(sample.value)
        return total

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def replicas(*started: Replica) -> Iterator[tuple[Replica, ...]]:
    try:
        yield started
    finally:
        for replica in started:
            replica.stop()


async def _create(api: client.ApiClient, namespace: str, name: str, select: str) -> None:
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        modules.GROUP,
        modules.VERSION,
        namespace,
        modules.PLURAL,
        support.module_body(name, {select: "yes"}),
    )


async def _loaded_on(api: client.ApiClient, namespace: str, name: str) -> set[str]:
    key = labels.ready(namespace, name)
    return {n for n, lbl in (await support.node_labels(api)).items() if key in lbl}


async def _ready(api: client.ApiClient, namespace: str, name: str, nodes: set[str]) -> bool:
    module = await support.get_module(api, namespace, name)
    ready = support.condition(module, "Ready")
    return (
        ready is not None
        and ready["status"] == "True"
        and await _loaded_on(api, namespace, name) == nodes
    )


async def _delete_and_wait(api: client.ApiClient, namespace: str, name: str) -> None:
    await client.CustomObjectsApi(api).delete_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
    )

    async def gone() -> bool:
        return await support.get_module(api, namespace, name) is None and not await _loaded_on(
            api, namespace, name
        )

    await testing.eventually(gone, "module deleted and its labels removed")


@contextlib.asynccontextmanager
async def _logs_on_failure(*logs: Path) -> AsyncIterator[None]:
    try:
        yield
    except BaseException:
        for log in logs:
            if log.exists():
                sys.stderr.write(f"--- {log}\n{log.read_text()[-4000:]}\n")
        raise


async def test_sigkill_mid_reconcile_then_restart_converges_without_duplicates(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    name = "killed"
    select = f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:3]
    log = tmp_path / "operator.log"
    async with support.selecting(api_client, chosen, select), _logs_on_failure(log):
        first = Replica(sandbox.kubeconfig, log, identity="first", lease_ns=None)
        with replicas(first):
            await testing.eventually(first.ready, "first replica ready")
            await _create(api_client, namespace, name, select)

            # Kill as soon as the reconcile has written its first DaemonSet:
            # the rest (other DaemonSets, labels, status) is still to come.
            async def started() -> bool:
                return bool(await support.loader_daemonsets(api_client, namespace))

            await testing.eventually(started, "first DaemonSet written", interval=0.02)
            first.kill()
        partial = await support.loader_daemonsets(api_client, namespace)
        module = await support.get_module(api_client, namespace, name)
        sys.stderr.write(
            f"killed with {len(partial)} DaemonSet(s), status={bool((module or {}).get('status'))}\n"
        )

        second = Replica(sandbox.kubeconfig, log, identity="second", lease_ns=None)
        with replicas(second):
            await testing.eventually(
                lambda: _ready(api_client, namespace, name, set(chosen)), "restart converged"
            )
            daemonsets = await support.loader_daemonsets(api_client, namespace)
            kernels = [d.metadata.labels[labels.KERNEL_VERSION_FULL] for d in daemonsets]
            assert sorted(kernels) == sorted(set(kernels))
            assert len(daemonsets) == 3
            await _delete_and_wait(api_client, namespace, name)
        assert second.process.returncode == 0, "SIGTERM must end the operator cleanly"


async def _holder(api: client.ApiClient, namespace: str) -> str | None:
    try:
        lease = await client.CoordinationV1Api(api).read_namespaced_lease("kmm-operator", namespace)
    except client.ApiException:
        return None
    holder: str | None = lease.spec.holder_identity
    return holder or None


async def test_two_replicas_only_the_leader_writes_and_the_other_takes_over(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    name = "elected"
    select = f"kmm-test/{namespace}"
    logs = (tmp_path / "a.log", tmp_path / "b.log")
    async with (
        support.selecting(api_client, sandbox.node_names[:2], select),
        _logs_on_failure(*logs),
    ):
        a = Replica(sandbox.kubeconfig, logs[0], identity="replica-a", lease_ns=namespace)
        b = Replica(sandbox.kubeconfig, logs[1], identity="replica-b", lease_ns=namespace)
        with replicas(a, b):
            await testing.eventually(a.ready, "replica a ready")
            await testing.eventually(b.ready, "replica b ready")

            async def elected() -> bool:
                return await _holder(api_client, namespace) in ("replica-a", "replica-b")

            await testing.eventually(elected, "a leader elected")
            lease = await client.CoordinationV1Api(api_client).read_namespaced_lease(
                "kmm-operator", namespace
            )
            assert lease.spec.lease_duration_seconds == 4  # --lease-duration
            leader, follower = (
                (a, b) if await _holder(api_client, namespace) == "replica-a" else (b, a)
            )

            await _create(api_client, namespace, name, select)
            await testing.eventually(
                lambda: _ready(api_client, namespace, name, set(sandbox.node_names[:2])),
                "converged under the first leader",
            )
            assert await leader.writes() > 0
            assert await follower.writes() == 0

            leader.kill()

            async def took_over() -> bool:
                return await _holder(api_client, namespace) == follower.identity

            await testing.eventually(took_over, "the other replica took the lease")
            # A change only the new leader can act on: one more node selected.
            await client.CoreV1Api(api_client).patch_node(
                sandbox.node_names[2], {"metadata": {"labels": {select: "yes"}}}
            )
            try:
                await testing.eventually(
                    lambda: _ready(api_client, namespace, name, set(sandbox.node_names[:3])),
                    "converged under the new leader",
                )
                assert await follower.writes() > 0
                await _delete_and_wait(api_client, namespace, name)
            finally:
                await client.CoreV1Api(api_client).patch_node(
                    sandbox.node_names[2], {"metadata": {"labels": {select: None}}}
                )
