"""Bring a sandbox up, take it down, report on it.

``up`` starts etcd, then kube-apiserver, then controller-manager, scheduler and
KWOK together, each on a free port of 127.0.0.1, then the kubelet nodes asked
for (``kubeletnodes``: each a fake runtime and a real kubelet in namespaces of
its own, whose network ``networking`` makes, relay included, before the API
server starts), and records
every process in the sandbox directory as soon as it is launched, so ``down``
can stop a start that was interrupted half-way (and write back the sysctls
the kubelets change). Every ``up`` starts an empty cluster: the data,
certificates and logs of the directory's previous run are replaced.
``restarting`` stops and starts one component of a running sandbox on its data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import shutil
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from kmm.kube import client, objects
from kmm.kube import errors as kube_errors
from kmm.kube import kubeconfigs as kube_access
from kmm.kube import resources as kube_resources
from kmm.sandbox import (
    addressing,
    building,
    components,
    containernodes,
    containerstarting,
    errors,
    fakemodules,
    health,
    kubeconfigs,
    kubeletnodes,
    namespaces,
    networking,
    nodes,
    pki,
    ports,
    processes,
    registry,
    state,
)
from kmm.sandbox.registry import Auth as RegistryAuth

__all__ = [
    "DEFAULT_KERNELS",
    "KUBELET_NODE_LABEL",
    "KWOK_TAINT",
    "RUNTIMES",
    "TOOLS",
    "Options",
    "api_client",
    "container_node_table",
    "down",
    "health_access",
    "kubelet_node",
    "node_table",
    "status",
    "up",
    "wait_default_account",
]

DEFAULT_KERNELS = ("6.8.0-45-generic",)

_ADMIN = pki.ClientIdentity("admin", "kmm-sandbox-admin", ("system:masters",))
_CONTROLLER_MANAGER = pki.ClientIdentity("controller-manager", "system:kube-controller-manager")
_SCHEDULER = pki.ClientIdentity("scheduler", "system:kube-scheduler")
_KWOK = pki.ClientIdentity("kwok", "kwok-controller", ("system:masters",))
# The API server's identity towards kubelets (logs, exec, proxy), which ask
# the API server itself whether it may: as a member of system:masters, yes.
_KUBELET_CLIENT = pki.ClientIdentity(
    "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
)

_SERVICE_CIDR = "10.96.0.0/12"
# What every ``up`` builds: the control plane and the kubectl of its release,
# which ``up`` offers because a machine's own may be outside the version skew.
TOOLS = (*components.ALL, components.KUBECTL)
# Kubelet nodes carry this label (KWOK's nodes do not).
KUBELET_NODE_LABEL = "kmm.sandbox/kubelet"
# What runs a kubelet node's pods: nothing (a fake CRI), or containerd and runc.
RUNTIMES = ("fake", containernodes.RUNTIME)
# KWOK's nodes carry it when container nodes exist: a pod that must really
# run never lands where nothing runs (a Module meant for KWOK tolerates it).
KWOK_TAINT = {"key": "kmm.sandbox/kwok", "value": "true", "effect": "NoSchedule"}


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
    # Nodes served by real kubelets on a fake container runtime (kubeletnodes),
    # or on containerd (runtime "containerd": containernodes).
    kubelet_nodes: int = 0
    runtime: str = "fake"
    # The pause image containerd's pod sandboxes run (`make test-images`).
    pause_image: Path = Path("build/images/pause.tar")
    # Seconds between the compactions the API server asks of etcd (its
    # --etcd-compaction-interval; None keeps its 5 minutes). A short one makes
    # a resourceVersion older than two intervals answer 410 Gone.
    etcd_compaction_interval: float | None = None
    # False: the API server's --watch-cache=false. Watches and lists then go
    # to etcd, so a watch from a resourceVersion compaction has passed is
    # answered 410 Gone (its watch cache would answer it from memory, and
    # expire it only when its own window of events moves on).
    watch_cache: bool = True
    # The API server's --max-requests-inflight / --max-mutating-requests-inflight
    # (None keeps its defaults). Setting either turns API Priority and Fairness
    # off, so the limit is the plain in-flight filter: a request past it is
    # answered 429 with Retry-After at once instead of waiting in an APF queue.
    # Members of system:masters (the sandbox's admin) are never throttled.
    max_requests_inflight: int | None = None
    max_mutating_requests_inflight: int | None = None
    # The image registry (``registry``): None leaves it to the default, on
    # when credentials are asked for (and, once the sandbox has container
    # nodes, when it has any); ``registry_auth`` turns htpasswd auth on.
    registry: bool | None = None
    registry_auth: RegistryAuth | None = None
    # Kernel modules every container node shows as loaded, with their devices
    # (``fakemodules``: the kernel here loads none).
    fake_modules: tuple[fakemodules.FakeModule, ...] = ()

    @property
    def wants_registry(self) -> bool:
        if self.registry is not None:
            return self.registry
        return self.registry_auth is not None or self.runtime == containernodes.RUNTIME

    def apiserver_flags(self) -> list[str]:
        """The kube-apiserver flags these options add."""
        flags = []
        if self.runtime_config:
            flags.append(f"--runtime-config={','.join(self.runtime_config)}")
        if self.etcd_compaction_interval is not None:
            # Go durations take a unit; milliseconds keep sub-second values.
            flags.append(
                f"--etcd-compaction-interval={round(self.etcd_compaction_interval * 1000)}ms"
            )
        if not self.watch_cache:
            flags.append("--watch-cache=false")
        limits = (
            ("max-requests-inflight", self.max_requests_inflight),
            ("max-mutating-requests-inflight", self.max_mutating_requests_inflight),
        )
        for flag, value in limits:
            if value is not None:
                flags.append(f"--{flag}={value}")
        if any(value is not None for _, value in limits):
            flags.append("--enable-priority-and-fairness=false")
        return flags

    def check(self) -> None:
        """ValueError naming the flag of the first option out of range."""
        if self.nodes < 0:
            raise ValueError("--nodes must be 0 or more")
        if self.kubelet_nodes < 0:
            raise ValueError("--kubelet-nodes must be 0 or more")
        if self.runtime not in RUNTIMES:
            raise ValueError(
                f"--runtime must be one of {', '.join(RUNTIMES)}, not {self.runtime!r}"
            )
        if self.runtime != "fake" and not self.kubelet_nodes:
            raise ValueError(f"--runtime {self.runtime} needs --kubelet-nodes 1 or more")
        if not self.kernels:
            raise ValueError("at least one --kernel is needed")
        if self.etcd_compaction_interval is not None and not self.etcd_compaction_interval > 0:
            raise ValueError("--etcd-compaction-interval must be more than 0 seconds")
        if self.registry is False and self.registry_auth is not None:
            raise ValueError("--registry-auth needs the registry: drop --no-registry")
        if self.fake_modules and self.runtime != containernodes.RUNTIME:
            raise ValueError(f"--fake-module needs --runtime {containernodes.RUNTIME}")
        fakemodules.check(self.fake_modules)
        for flag, value in (
            ("--max-requests-inflight", self.max_requests_inflight),
            ("--max-mutating-requests-inflight", self.max_mutating_requests_inflight),
        ):
            # 0 would lift the limit altogether once APF is off: not what a
            # user asking for a low limit means.
            if value is not None and value < 1:
                raise ValueError(f"{flag} must be 1 or more")


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
        try:
            containerstarting.clean_up(self.record)
        finally:
            if self.record.sysctls:
                kubeletnodes.restore_sysctls(self.record.sysctls)


def _reset(directory: Path) -> None:
    for name in ("pki", "etcd", "logs", "kubelets", "relay", "registry"):
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
    options.check()
    if options.kubelet_nodes:
        kubeletnodes.check_directory(directory)
        if options.runtime == containernodes.RUNTIME:
            containernodes.check_directory(directory, containernodes.overlay_roots())
        if any(entry.startswith("resource.k8s.io/") for entry in options.runtime_config):
            raise ValueError(
                "--kubelet-nodes needs resource.k8s.io served: the Node authorizer and "
                "the kubelet's DRA manager watch it"
            )
    _refuse_if_running(directory)
    if options.apiserver_port:
        ports.require_free(options.apiserver_port, what="kube-apiserver")

    containers = options.runtime == containernodes.RUNTIME
    tools = TOOLS + ((components.KUBELET,) if options.kubelet_nodes else ())
    tools += components.CONTAINER_NODE if containers else ()
    tools += (components.REGISTRY,) if options.wants_registry else ()
    binaries = await building.ensure_built(options.cache_dir, tools, progress=progress)
    pinned = (
        building.pinned_dir(options.cache_dir, components.CONTAINER_NODE) if containers else None
    )
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
            *((_KUBELET_CLIENT,) if kubelet_names else ()),
            *(kubeletnodes.identity(n) for n in kubelet_names),
            *(containernodes.proxy_identity(n) for n in kubelet_names if containers),
        ),
    )

    # One call, so that no two coincide: kubelet nodes' host ports (and the
    # relay's health port) are bound by the relay before the API server starts.
    chosen = ports.free_ports(8 + (1 + 3 * len(kubelet_names) if kubelet_names else 0))
    etcd_port, peer_port, cm_port, scheduler_port, kwok_port, free_api_port = chosen[:6]
    # The registry's: chosen now, for the relay (started first) to forward to.
    registry_port, registry_debug_port = chosen.pop(6), chosen.pop(6)
    relay_health_port, *kubelet_ports = chosen[6:] or [0]  # 0: no relay without kubelets
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
        container_nodes=kubelet_names if containers else [],
        cgroup_parent=f"kmm-sandbox-{secrets.token_hex(4)}" if containers else "",
    )
    launcher = _Launcher(record)
    container_plan = [
        containerstarting.plan(
            directory,
            index,
            name,
            record.cgroup_parent,
            kubelet_ports[3 * index : 3 * index + 3],
            fake_modules=options.fake_modules,
        )
        for index, name in enumerate(kubelet_names)
        if containers
    ]
    kubelet_plan = [node.kubelet for node in container_plan] or [
        _plan_kubelet(directory, index, name, kubelet_ports[3 * index : 3 * index + 3])
        for index, name in enumerate(kubelet_names)
    ]
    try:
        etcd = launcher.launch(
            "etcd",
            _etcd_argv(binaries["etcd"], directory, etcd_port, peer_port),
            health_url=f"http://{ports.HOST}:{etcd_port}/health",
        )
        await health.wait_healthy(etcd, timeout=options.start_timeout)
        network = None
        if kubelet_plan:
            network = networking.start(
                launcher,
                directory,
                kubelet_plan,
                api_port=api_port,
                health_port=relay_health_port,
                registry_port=registry_port if options.wants_registry else 0,
                **(containerstarting.network_options(container_plan) if containers else {}),
            )
            await health.wait_healthy(network.relay, timeout=options.start_timeout)
        apiserver = launcher.launch(
            "kube-apiserver",
            _apiserver_argv(binaries["kube-apiserver"], credentials, etcd_port, api_port, network)
            + options.apiserver_flags(),
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
        registry_process = None
        if options.wants_registry:
            registry_process, record.registry = registry.start(
                launcher.launch,
                directory,
                binaries["registry"],
                credentials,
                auth=options.registry_auth,
                port=registry_port,
                debug_port=registry_debug_port,
            )
            state.save(record)
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
        if registry_process is not None:
            await health.wait_healthy(registry_process, timeout=options.start_timeout)
        async with api_client(admin_kubeconfig) as api:
            await nodes.create(api, node_plan, taints=[KWOK_TAINT] if containers else [])
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
                await wait_default_account(api, timeout=options.start_timeout)
            except TimeoutError as err:
                raise errors.ComponentFailed(
                    "kube-controller-manager",
                    "did not create the default ServiceAccount of namespace default within "
                    f"{options.start_timeout:.0f} s",
                    controller_manager.log,
                    processes.log_tail(controller_manager.log),
                ) from err
        if network is not None and containers:
            await _start_container_nodes(
                launcher,
                list(zip(container_plan, network.holders, strict=True)),
                binaries,
                pinned,
                credentials,
                kubeconfig_for,
                options,
            )
        elif network is not None:
            await _start_kubelets(
                launcher,
                list(zip(kubelet_plan, network.holders, strict=True)),
                binaries,
                credentials,
                kubeconfig_for,
                options,
            )
    except BaseException:
        launcher.stop_all()
        raise
    return record


async def wait_default_account(
    api: client.Client, namespace: str = "default", *, timeout: float
) -> None:
    """Wait until the controller-manager made ``namespace``'s default
    ServiceAccount (a pod can be created there from then on); TimeoutError
    after ``timeout`` seconds."""
    path = kube_resources.SERVICE_ACCOUNTS.path(namespace=namespace, name="default")
    async with asyncio.timeout(timeout):
        while True:
            try:
                await api.request("GET", path)
            except kube_errors.NotFound:
                await asyncio.sleep(0.2)
            else:
                return


async def _start_container_nodes(
    launcher: _Launcher,
    planned: list[tuple[containernodes.ContainerNode, namespaces.Holder]],
    binaries: dict[str, Path],
    pinned: Path | None,
    credentials: pki.Pki,
    kubeconfig_for: Callable[[pki.ClientIdentity, Path], Path],
    options: Options,
) -> None:
    """Start each container node (``containerstarting``); return once all are Ready."""
    record = launcher.record
    # What the kubelets will change on the host, as it was: `down` restores it.
    record.sysctls = kubeletnodes.read_sysctls()
    state.save(record)

    async def wait_ready(wanted: list[str]) -> None:
        await _wait_kubelet_nodes(record, wanted, options, first_log=None)

    assert pinned is not None  # built with the container nodes' tools
    await containerstarting.start(
        launcher,
        planned,
        binaries,
        pinned,
        credentials,
        kubeconfig_for,
        pause_archive=options.pause_image,
        labels={KUBELET_NODE_LABEL: "true"},
        timeout=options.start_timeout,
        wait_ready=wait_ready,
    )


async def _wait_kubelet_nodes(
    record: state.SandboxState, names: list[str], options: Options, *, first_log: Path | None
) -> None:
    async with api_client(record.kubeconfig) as api:
        try:
            await nodes.wait_ready(
                api,
                names,
                timeout=options.start_timeout,
                label_selector=f"{KUBELET_NODE_LABEL}=true",
            )
        except TimeoutError as err:
            log = first_log or record.directory / "logs" / f"kubelet/{names[0]}.log"
            raise errors.ComponentFailed(
                "kubelet",
                f"{len(names)} kubelet node(s) not Ready within {options.start_timeout:.0f} s",
                log,
                processes.log_tail(log),
            ) from err


def _plan_kubelet(
    directory: Path, index: int, name: str, free: list[int]
) -> kubeletnodes.KubeletNode:
    """Kubelet node ``index``'s files and host ports (three ``free`` ones),
    recorded in its directory."""
    port, healthz_port, cri_port = free
    node = kubeletnodes.KubeletNode(
        name=name,
        # Short: unix socket paths under it are limited to 107 characters.
        directory=directory / "kubelets" / str(index),
        port=port,
        healthz_port=healthz_port,
        cri_http_port=cri_port,
    )
    node.make_dirs()
    kubeletnodes.save(node)
    return node


async def _start_kubelets(
    launcher: _Launcher,
    planned: list[tuple[kubeletnodes.KubeletNode, namespaces.Holder]],
    binaries: dict[str, Path],
    credentials: pki.Pki,
    kubeconfig_for: Callable[[pki.ClientIdentity, Path], Path],
    options: Options,
) -> None:
    """Start each kubelet node (its fake runtime first) in its namespaces;
    return once all are Ready."""
    record = launcher.record
    # What the kubelets will change on the host, as it was: `down` restores it.
    record.sysctls = kubeletnodes.read_sysctls()
    state.save(record)
    started: list[processes.Process] = []
    names = [node.name for node, _ in planned]
    for index, (node, holder) in enumerate(planned):
        name = node.name
        runtime = launcher.launch(
            f"fake-cri/{name}",
            kubeletnodes.cri_argv(binaries["kmm-fake-cri"], node),
            health_url=f"{node.cri_url}/healthz",
        )
        await health.wait_healthy(runtime, timeout=options.start_timeout)
        # Its server, https://127.0.0.1:P, is the relay in the node's namespace.
        kubeconfig = kubeconfig_for(kubeletnodes.identity(name), node.directory / "kubeconfig")
        started.append(
            launcher.launch(
                f"kubelet/{name}",
                kubeletnodes.kubelet_argv(
                    binaries["kubelet"],
                    node,
                    holder=holder,
                    kubeconfig=kubeconfig,
                    config=kubeletnodes.write_config(node, ca_cert=credentials.ca_cert),
                    address=str(addressing.node_address(index)),
                    labels={KUBELET_NODE_LABEL: "true"},
                ),
                health_url=node.health_url,
            )
        )
    await asyncio.gather(*(health.wait_healthy(p, timeout=options.start_timeout) for p in started))
    await _wait_kubelet_nodes(record, names, options, first_log=started[0].log)


def health_access(record: state.SandboxState, process: processes.Process) -> kube_access.Access:
    """How to ask ``process``'s health endpoint: the admin certificate for the
    API server, no verification for the self-signed controller-manager and
    scheduler, plain HTTP (the URL's own) for etcd and KWOK."""
    if process.name == "kube-apiserver":
        return _admin(pki.Pki(record.directory / "pki"), record.server)
    if process.health_url.startswith("https"):
        return _insecure(process.health_url)
    return kube_access.Access(server=health.server_of(process.health_url), source=process.name)


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
    binary: Path,
    credentials: pki.Pki,
    etcd_port: int,
    port: int,
    network: networking.Network | None = None,
) -> list[str]:
    # With kubelet nodes, as in a real cluster: kubelets are judged by the
    # Node authorizer and NodeRestriction, everyone else by RBAC. (Without
    # them there is no node identity to judge, and the Node authorizer's
    # ResourceSlice informer would keep a cluster that does not serve
    # resource.k8s.io from ever being ready.)
    # OwnerReferencesPermissionEnforcement, as OpenShift (KMM's home) runs
    # it: an owner reference with blockOwnerDeletion needs update on the
    # owner's /finalizers, so the operator's RBAC for that is put to the test.
    owners = "OwnerReferencesPermissionEnforcement"
    authorization = (
        ["--authorization-mode=Node,RBAC", f"--enable-admission-plugins=NodeRestriction,{owners}"]
        if network
        else ["--authorization-mode=RBAC", f"--enable-admission-plugins={owners}"]
    )
    # Without kubelet nodes nothing dials the API server's advertised
    # address, and 127.0.0.1 is what sandboxes always advertised; with them,
    # nodes and pods reach it on the fabric's gateway (``networking``).
    advertised = str(addressing.GATEWAY) if network else ports.HOST
    kubelets = (
        [
            *networking.apiserver_flags(network),
            f"--kubelet-client-certificate={credentials.client_cert(_KUBELET_CLIENT)}",
            f"--kubelet-client-key={credentials.client_key(_KUBELET_CLIENT)}",
        ]
        if network
        else []
    )
    return [
        str(binary),
        f"--etcd-servers=http://{ports.HOST}:{etcd_port}",
        f"--bind-address={ports.HOST}",
        f"--advertise-address={advertised}",
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
        *kubelets,
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
    try:
        containerstarting.clean_up(record)
    finally:
        # Whatever clean_up could not remove, the host's sysctls come back.
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


def container_node_table(record: state.SandboxState) -> list[tuple[str, str, str]]:
    """(name, runtime, node IP) of every container node, for ``status``."""
    rows = []
    for name in record.container_nodes:
        found = containernodes.load(
            record.directory / "kubelets" / str(record.kubelet_nodes.index(name))
        )
        if found is not None:
            rows.append((name, containernodes.RUNTIME, found.address))
    return rows


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
