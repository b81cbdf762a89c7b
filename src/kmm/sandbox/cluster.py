"""Bring a sandbox up, take it down, report on it.

``up`` starts etcd, then kube-apiserver, then controller-manager, scheduler and
KWOK together, each on a free port of 127.0.0.1, then the kubelet nodes asked
for (``kubeletnodes``: each a fake runtime and a real kubelet), and records
every process in the sandbox directory as soon as it is launched, so ``down``
can stop a start that was interrupted half-way (and write back the sysctls
the kubelets change). Every ``up`` starts an empty cluster: the data,
certificates and logs of the directory's previous run are replaced.
``restart`` stops one component and starts it again on its data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from kmm.kube import client, objects
from kmm.kube import errors as kube_errors
from kmm.kube import kubeconfigs as kube_access
from kmm.kube import resources as kube_resources
from kmm.sandbox import (
    building,
    components,
    errors,
    health,
    kubeconfigs,
    kubeletnodes,
    nodes,
    pki,
    ports,
    processes,
    state,
)

__all__ = [
    "DEFAULT_KERNELS",
    "KUBELET_NODE_LABEL",
    "TOOLS",
    "Options",
    "api_client",
    "down",
    "kubelet_node",
    "node_table",
    "restart",
    "status",
    "up",
]

DEFAULT_KERNELS = ("6.8.0-45-generic",)

_ADMIN = pki.ClientIdentity("admin", "kmm-sandbox-admin", ("system:masters",))
_CONTROLLER_MANAGER = pki.ClientIdentity("controller-manager", "system:kube-controller-manager")
_SCHEDULER = pki.ClientIdentity("scheduler", "system:kube-scheduler")
_KWOK = pki.ClientIdentity("kwok", "kwok-controller", ("system:masters",))

_SERVICE_CIDR = "10.96.0.0/12"
# What every ``up`` builds: the control plane and the kubectl of its release,
# which ``up`` offers because a machine's own may be outside the version skew.
TOOLS = (*components.ALL, components.KUBECTL)
# Kubelet nodes carry this label (KWOK's nodes do not).
KUBELET_NODE_LABEL = "kmm.sandbox/kubelet"


@dataclasses.dataclass(frozen=True)
class Options:
    """What ``up`` starts: where, with which binary cache, how many nodes of which kernels."""

    directory: Path
    cache_dir: Path
    nodes: int = 3
    kernels: tuple[str, ...] = DEFAULT_KERNELS
    apiserver_port: int = 0
    start_timeout: float = 180.0
    # kube-apiserver --runtime-config entries, e.g. "resource.k8s.io/v1=false"
    # for a cluster that does not serve DRA.
    runtime_config: tuple[str, ...] = ()
    # Nodes served by real kubelets on a fake container runtime (kubeletnodes).
    kubelet_nodes: int = 0


class _Launcher:
    """Launches components and keeps the record on disk current."""

    def __init__(self, record: state.SandboxState) -> None:
        self.record = record

    def launch(self, name: str, argv: list[str], *, health_url: str) -> processes.Process:
        process = processes.launch(
            name, argv, log=self.record.directory / "logs" / f"{name}.log", health_url=health_url
        )
        self.record.launched.append(process)
        state.save(self.record)
        return process

    def stop_all(self) -> None:
        for process in reversed(self.record.launched):
            process.stop()
        if self.record.sysctls:
            kubeletnodes.restore_sysctls(self.record.sysctls)


def _reset(directory: Path) -> None:
    for name in ("pki", "etcd", "logs", "kubelets"):
        shutil.rmtree(directory / name, ignore_errors=True)
    (directory / "logs").mkdir(parents=True)


def _stages_file(directory: Path) -> Path:
    target = directory / "kwok.yaml"
    stages = resources.files("kmm.sandbox").joinpath("stages/kwok.yaml").read_text()
    target.write_text(stages)
    return target


def _admin(credentials: pki.Pki, server: str) -> kube_access.Access:
    return kube_access.Access(
        server=server,
        source="the sandbox's admin certificate",
        ca_file=credentials.ca_cert,
        client_cert_file=credentials.client_cert(_ADMIN),
        client_key_file=credentials.client_key(_ADMIN),
    )


def _insecure(health_url: str) -> kube_access.Access:
    # controller-manager and scheduler serve health with self-signed certificates.
    return kube_access.Access(
        server=health.server_of(health_url), source="a sandbox component", insecure=True
    )


def api_client(kubeconfig: Path) -> client.Client:
    """A ``kube.client.Client`` for the sandbox described by ``kubeconfig``."""
    return client.Client(kube_access.load(kubeconfig))


async def up(
    options: Options, *, progress: building.BuildProgress | None = None
) -> state.SandboxState:
    """Start a sandbox; return once every fake node is Ready."""
    directory = options.directory.resolve()
    if options.nodes < 0:
        raise ValueError("--nodes must be 0 or more")
    if options.kubelet_nodes < 0:
        raise ValueError("--kubelet-nodes must be 0 or more")
    if options.kubelet_nodes:
        kubeletnodes.check_directory(directory)
        if any(entry.startswith("resource.k8s.io/") for entry in options.runtime_config):
            raise ValueError(
                "--kubelet-nodes needs resource.k8s.io served: the Node authorizer and "
                "the kubelet's DRA manager watch it"
            )
    if not options.kernels:
        raise ValueError("at least one --kernel is needed")
    _refuse_if_running(directory)
    if options.apiserver_port:
        ports.require_free(options.apiserver_port, what="kube-apiserver")

    tools = TOOLS + ((components.KUBELET,) if options.kubelet_nodes else ())
    binaries = await building.ensure_built(options.cache_dir, tools, progress=progress)
    directory.mkdir(parents=True, exist_ok=True)
    _reset(directory)
    kubelet_names = [f"{kubeletnodes.NODE_PREFIX}{i}" for i in range(options.kubelet_nodes)]
    credentials = pki.create(
        directory / "pki",
        (
            _ADMIN,
            _CONTROLLER_MANAGER,
            _SCHEDULER,
            _KWOK,
            *(kubeletnodes.identity(n) for n in kubelet_names),
        ),
    )

    etcd_port, peer_port, cm_port, scheduler_port, kwok_port, free_api_port = ports.free_ports(6)
    api_port = options.apiserver_port or free_api_port
    server = f"https://{ports.HOST}:{api_port}"

    def kubeconfig_for(identity: pki.ClientIdentity, path: Path) -> Path:
        return kubeconfigs.write(
            path,
            server=server,
            ca_cert=credentials.ca_cert,
            client_cert=credentials.client_cert(identity),
            client_key=credentials.client_key(identity),
        )

    admin_kubeconfig = kubeconfig_for(_ADMIN, directory / "kubeconfig")
    node_plan = nodes.spread(options.nodes, options.kernels)
    record = state.SandboxState(
        directory=directory,
        server=server,
        kubeconfig=admin_kubeconfig,
        launched=[],
        node_names=[name for name, _ in node_plan],
        versions={tool.name: tool.version for tool in tools},
        kubelet_nodes=kubelet_names,
    )
    launcher = _Launcher(record)
    try:
        etcd = launcher.launch(
            "etcd",
            _etcd_argv(binaries["etcd"], directory, etcd_port, peer_port),
            health_url=f"http://{ports.HOST}:{etcd_port}/health",
        )
        await health.wait_healthy(etcd, timeout=options.start_timeout)
        apiserver = launcher.launch(
            "kube-apiserver",
            _apiserver_argv(
                binaries["kube-apiserver"],
                credentials,
                etcd_port,
                api_port,
                node_authorizer=bool(kubelet_names),
            )
            + (
                [f"--runtime-config={','.join(options.runtime_config)}"]
                if options.runtime_config
                else []
            ),
            health_url=f"{server}/readyz",
        )
        await health.wait_healthy(
            apiserver, timeout=options.start_timeout, access=_admin(credentials, server)
        )
        controller_manager = launcher.launch(
            "kube-controller-manager",
            [
                str(binaries["kube-controller-manager"]),
                f"--kubeconfig={kubeconfig_for(_CONTROLLER_MANAGER, directory / 'controller-manager.kubeconfig')}",
                f"--bind-address={ports.HOST}",
                f"--secure-port={cm_port}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={credentials.service_account_key}",
                f"--root-ca-file={credentials.ca_cert}",
                f"--service-cluster-ip-range={_SERVICE_CIDR}",
                "--controllers=*",
                # KWOK's status heartbeats are jittered up to 35 s; a grace
                # above that keeps a busy machine from marking nodes NotReady.
                "--node-monitor-grace-period=60s",
            ],
            health_url=f"https://{ports.HOST}:{cm_port}/healthz",
        )
        scheduler = launcher.launch(
            "kube-scheduler",
            [
                str(binaries["kube-scheduler"]),
                f"--kubeconfig={kubeconfig_for(_SCHEDULER, directory / 'scheduler.kubeconfig')}",
                f"--bind-address={ports.HOST}",
                f"--secure-port={scheduler_port}",
                "--leader-elect=false",
            ],
            health_url=f"https://{ports.HOST}:{scheduler_port}/healthz",
        )
        kwok = launcher.launch(
            "kwok",
            [
                str(binaries["kwok"]),
                f"--kubeconfig={kubeconfig_for(_KWOK, directory / 'kwok.kubeconfig')}",
                f"--config={_stages_file(directory)}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector="
                f"{nodes.FAKE_NODE_ANNOTATION[0]}={nodes.FAKE_NODE_ANNOTATION[1]}",
                f"--server-address={ports.HOST}:{kwok_port}",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.200.0.1",
            ],
            health_url=f"http://{ports.HOST}:{kwok_port}/healthz",
        )
        await asyncio.gather(
            health.wait_healthy(
                controller_manager,
                timeout=options.start_timeout,
                access=_insecure(controller_manager.health_url),
            ),
            health.wait_healthy(
                scheduler,
                timeout=options.start_timeout,
                access=_insecure(scheduler.health_url),
            ),
            health.wait_healthy(kwok, timeout=options.start_timeout),
        )
        async with api_client(admin_kubeconfig) as api:
            await nodes.create(api, node_plan)
            try:
                await nodes.wait_ready(api, record.node_names, timeout=options.start_timeout)
            except TimeoutError as err:
                raise errors.ComponentFailed(
                    "kwok",
                    f"did not bring {len(node_plan)} fake node(s) to Ready within "
                    f"{options.start_timeout:.0f} s",
                    kwok.log,
                    processes.log_tail(kwok.log),
                ) from err
            # A cluster where a pod can be created: the controller-manager has
            # made the default namespace's ServiceAccount, which admission needs.
            try:
                await _wait_default_account(api, options.start_timeout)
            except TimeoutError as err:
                raise errors.ComponentFailed(
                    "kube-controller-manager",
                    "did not create the default ServiceAccount of namespace default within "
                    f"{options.start_timeout:.0f} s",
                    controller_manager.log,
                    processes.log_tail(controller_manager.log),
                ) from err
        if kubelet_names:
            await _start_kubelets(
                launcher, kubelet_names, binaries, credentials, kubeconfig_for, options
            )
    except BaseException:
        launcher.stop_all()
        raise
    return record


async def _wait_default_account(api: client.Client, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while True:
            try:
                await api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
            except kube_errors.NotFound:
                await asyncio.sleep(0.2)
            else:
                return


async def _start_kubelets(
    launcher: _Launcher,
    names: list[str],
    binaries: dict[str, Path],
    credentials: pki.Pki,
    kubeconfig_for: Callable[[pki.ClientIdentity, Path], Path],
    options: Options,
) -> None:
    """Start each kubelet node (its fake runtime first); return once all are Ready."""
    record = launcher.record
    address = kubeletnodes.node_ip()
    # What the kubelets will change on the host, as it was: `down` restores it.
    record.sysctls = kubeletnodes.read_sysctls()
    state.save(record)
    started: list[processes.Process] = []
    for index, name in enumerate(names):
        port, healthz_port, cri_port = ports.free_ports(3)
        node = kubeletnodes.KubeletNode(
            name=name,
            # Short: unix socket paths under it are limited to 107 characters.
            directory=record.directory / "kubelets" / str(index),
            port=port,
            healthz_port=healthz_port,
            cri_http_port=cri_port,
        )
        node.make_dirs()
        kubeletnodes.save(node)
        runtime = launcher.launch(
            f"fake-cri/{name}",
            kubeletnodes.cri_argv(binaries["kmm-fake-cri"], node),
            health_url=f"{node.cri_url}/healthz",
        )
        await health.wait_healthy(runtime, timeout=options.start_timeout)
        kubeconfig = kubeconfig_for(kubeletnodes.identity(name), node.directory / "kubeconfig")
        started.append(
            launcher.launch(
                f"kubelet/{name}",
                kubeletnodes.kubelet_argv(
                    binaries["kubelet"],
                    node,
                    kubeconfig=kubeconfig,
                    config=kubeletnodes.write_config(node, ca_cert=credentials.ca_cert),
                    address=address,
                    labels={KUBELET_NODE_LABEL: "true"},
                ),
                health_url=node.health_url,
            )
        )
    await asyncio.gather(*(health.wait_healthy(p, timeout=options.start_timeout) for p in started))
    async with api_client(record.kubeconfig) as api:
        try:
            await nodes.wait_ready(
                api,
                names,
                timeout=options.start_timeout,
                label_selector=f"{KUBELET_NODE_LABEL}=true",
            )
        except TimeoutError as err:
            raise errors.ComponentFailed(
                "kubelet",
                f"{len(names)} kubelet node(s) not Ready within {options.start_timeout:.0f} s",
                started[0].log,
                processes.log_tail(started[0].log),
            ) from err


async def restart(directory: Path, component: str, *, timeout: float = 180.0) -> processes.Process:
    """Stop one component (``kube-apiserver``, ``kubelet/<node>`` ...) and start
    it again with the same command line and log, keeping its data; return
    once it is healthy again."""
    record = status(directory)
    found = [i for i, p in enumerate(record.launched) if p.name == component]
    if not found:
        names = ", ".join(p.name for p in record.launched)
        raise errors.NotRunning(f"the sandbox in {directory} has no {component}; it has {names}")
    index = found[0]
    process = record.launched[index]
    process.stop()
    again = processes.launch(
        process.name, list(process.argv), log=process.log, health_url=process.health_url
    )
    record.launched[index] = again
    state.save(record)
    access = _insecure(again.health_url) if again.health_url.startswith("https") else None
    if component == "kube-apiserver":
        access = _admin(pki.Pki(record.directory / "pki"), record.server)
    await health.wait_healthy(again, timeout=timeout, access=access)
    return again


def kubelet_node(directory: Path, name: str) -> kubeletnodes.KubeletNode:
    """A running sandbox's kubelet node by name: its files and ports."""
    record = status(directory)
    if name not in record.kubelet_nodes:
        raise errors.NotRunning(f"the sandbox in {directory} has no kubelet node {name}")
    return kubeletnodes.load(record.directory / "kubelets" / str(record.kubelet_nodes.index(name)))


def _refuse_if_running(directory: Path) -> None:
    try:
        existing = state.load(directory)
    except ValueError as err:
        # Without a readable record we cannot tell what still runs: refuse
        # rather than start a second control plane beside unknown processes.
        raise errors.SandboxInUse(
            f"{err}. Stop any sandbox process still running from {directory}, "
            f"remove {directory / state.STATE_FILE}, and run the command again."
        ) from err
    if existing is None:
        return
    running = existing.alive()
    if running:
        pids = ", ".join(f"{process.name} {process.pid}" for process in running)
        raise errors.SandboxInUse(
            f"a sandbox is already running in {directory} ({pids}). "
            f"Run `kmm sandbox down --dir {directory}` first, or choose another --dir."
        )


def _etcd_argv(binary: Path, directory: Path, client_port: int, peer_port: int) -> list[str]:
    client_url = f"http://{ports.HOST}:{client_port}"
    peer_url = f"http://{ports.HOST}:{peer_port}"
    return [
        str(binary),
        "--name=sandbox",
        f"--data-dir={directory / 'etcd'}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=sandbox={peer_url}",
        "--initial-cluster-state=new",
        # A sandbox is thrown away on every start: durability buys nothing here
        # and fsync dominates API latency on a shared disk.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def _apiserver_argv(
    binary: Path, credentials: pki.Pki, etcd_port: int, port: int, *, node_authorizer: bool
) -> list[str]:
    # With kubelet nodes, as in a real cluster: kubelets are judged by the
    # Node authorizer and NodeRestriction, everyone else by RBAC. (Without
    # them there is no node identity to judge, and the Node authorizer's
    # ResourceSlice informer would keep a cluster that does not serve
    # resource.k8s.io from ever being ready.)
    authorization = (
        ["--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction"]
        if node_authorizer
        else ["--authorization-mode=RBAC"]
    )
    return [
        str(binary),
        f"--etcd-servers=http://{ports.HOST}:{etcd_port}",
        f"--bind-address={ports.HOST}",
        f"--advertise-address={ports.HOST}",
        f"--secure-port={port}",
        f"--tls-cert-file={credentials.serving_cert}",
        f"--tls-private-key-file={credentials.serving_key}",
        f"--client-ca-file={credentials.ca_cert}",
        *authorization,
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={credentials.service_account_public_key}",
        f"--service-account-signing-key-file={credentials.service_account_key}",
        f"--service-cluster-ip-range={_SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
        # Alpha in 1.35: without it the server drops the device health a
        # kubelet (or `kmm kubelet --resource-health-status`) reports.
        "--feature-gates=ResourceHealthStatus=true",
    ]


def down(directory: Path) -> list[processes.Process]:
    """Stop exactly the processes the sandbox in ``directory`` started.

    Returns those that were still running. Processes are stopped in reverse
    start order so etcd outlives the API server that writes to it.
    """
    record = state.load(directory.resolve())
    if record is None:
        raise errors.NotRunning(f"no sandbox recorded in {directory}; nothing to stop")
    running = record.alive()
    for process in reversed(record.launched):
        process.stop()
    if record.sysctls:
        kubeletnodes.restore_sysctls(record.sysctls)
    return running


def status(directory: Path) -> state.SandboxState:
    record = state.load(directory.resolve())
    if record is None:
        raise errors.NotRunning(
            f"no sandbox recorded in {directory}; start one with `kmm sandbox up --dir {directory}`"
        )
    return record


async def node_table(kubeconfig: Path) -> list[tuple[str, str, str]]:
    """(name, Ready status, kernel) of every node, for ``status``."""
    async with api_client(kubeconfig) as api:
        listing = await api.request("GET", kube_resources.NODES.path())
    rows = []
    for node in listing["items"]:
        status = node.get("status") or {}
        ready = next(
            (c["status"] for c in status.get("conditions") or () if c.get("type") == "Ready"),
            "Unknown",
        )
        kernel = (status.get("nodeInfo") or {}).get("kernelVersion", "")
        rows.append((objects.name(node), ready, kernel))
    return rows
