"""Bring a sandbox up, take it down, report on it.

``up`` plans each kind of node asked for (``nodekinds``: KWOK's, fake-runtime
kubelets, container nodes), starts etcd, then the network of the nodes that
need namespaces of their own (``networking``: the fabric, a holder per node,
the relay), then kube-apiserver, then controller-manager, scheduler, KWOK
(``controlplane``) and the registry together (its storage seeded with the
VM nodes' driver toolkit images: ``vmnodes.toolkitimages``), then each kind's nodes, and
returns once every node is Ready. Every process is recorded in the sandbox
directory as soon as it is launched (``launching``), so ``down`` can stop a
start that was interrupted half-way: each kind stops its nodes and what
they leave behind (and writes back the host sysctls its kubelets changed,
``hostsysctls``), then the rest stops in reverse start order. Every ``up`` starts an empty
cluster: the data, certificates and logs of the directory's previous run are
replaced. ``restarting`` stops and starts one component of a running
sandbox on its data.

``Options`` (``options``) is re-exported here with the names tests and the
CLI use: ``cluster.up(cluster.Options(...))`` is the sandbox's entry point.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
from pathlib import Path

from kmm.kube import client, objects
from kmm.kube import errors as kube_errors
from kmm.kube import kubeconfigs as kube_access
from kmm.kube import resources as kube_resources
from kmm.sandbox import (
    building,
    components,
    controlplane,
    errors,
    health,
    kubeconfigs,
    launching,
    networking,
    nodekinds,
    options,
    pki,
    ports,
    processes,
    registry,
    state,
)
from kmm.sandbox.containernodes import kind as containerkind
from kmm.sandbox.containernodes import nodes as containernodes
from kmm.sandbox.kubeletnodes import kind as kubeletkind
from kmm.sandbox.kubeletnodes import nodes as kubeletnodes
from kmm.sandbox.kwoknodes import kind as kwokkind
from kmm.sandbox.kwoknodes import nodes as kwoknodes
from kmm.sandbox.vmnodes import kind as vmkind
from kmm.sandbox.vmnodes import planning as vmplanning
from kmm.sandbox.vmnodes import toolkitimages

__all__ = [
    "DEFAULT_KERNELS",
    "KUBELET_NODE_LABEL",
    "KWOK_TAINT",
    "RUNTIMES",
    "TOOLS",
    "Options",
    "api_client",
    "down",
    "health_access",
    "kinds",
    "kubelet_node",
    "node_table",
    "status",
    "up",
    "vm_nodes",
    "wait_default_account",
]

Options = options.Options
DEFAULT_KERNELS = options.DEFAULT_KERNELS
RUNTIMES = options.RUNTIMES
TOOLS = controlplane.TOOLS
KUBELET_NODE_LABEL = nodekinds.KUBELET_NODE_LABEL
KWOK_TAINT = kwokkind.TAINT
health_access = controlplane.health_access


def _reset(directory: Path) -> None:
    for name in ("pki", "etcd", "logs", "kubelets", "relay", "registry", "vms", "secure-boot"):
        shutil.rmtree(directory / name, ignore_errors=True)
    (directory / "logs").mkdir(parents=True)


def api_client(kubeconfig: Path) -> client.Client:
    """A ``kube.client.Client`` for the sandbox described by ``kubeconfig``."""
    return client.Client(kube_access.load(kubeconfig))


def _check_directory(directory: Path, chosen: options.Options) -> None:
    if chosen.kubelet_nodes:
        kubeletnodes.check_directory(directory)
        if chosen.containers:
            containernodes.check_directory(directory, containernodes.overlay_roots())
    if chosen.vm_nodes:
        vmplanning.check_directory(directory)


def _vm_boot(directory: Path, chosen: options.Options) -> vmplanning.Boot | None:
    """How the VM nodes asked for boot, checked before anything starts (the
    image built, the kernel one of its own, qemu and the firmware there);
    None without VM nodes. The signing key is made later, in ``directory``."""
    if not chosen.vm_nodes:
        return None
    image = vmplanning.find_image(chosen.cache_dir)
    return vmplanning.Boot(
        image=image,
        kernel=vmplanning.check_kernel(image, chosen.node_kernel),
        secure_boot=chosen.secure_boot,
        accel=vmplanning.requested_accel(chosen.accel),
        key=vmplanning.signing_key_path(directory),
        pause_archive=chosen.pause_image,
    )


def _tools(chosen: options.Options) -> tuple[components.GoTool, ...]:
    release = chosen.release
    tools = controlplane.tools(release)
    tools += (components.kubernetes(release).kubelet,) if chosen.kubelet_nodes else ()
    tools += components.container_node(release) if chosen.containers else ()
    tools += (components.REGISTRY,) if chosen.wants_registry else ()
    return tools


def _identities(
    chosen: options.Options, kubelet_names: list[str], vm_names: list[str]
) -> list[pki.ClientIdentity]:
    found = list(controlplane.IDENTITIES)
    if kubelet_names or vm_names:
        found.append(controlplane.KUBELET_CLIENT)
    if kubelet_names:
        planned = containerkind if chosen.containers else kubeletkind
        found += planned.identities(kubelet_names)
    found += vmkind.identities(vm_names)
    return found


def _plan(
    record: state.SandboxState,
    chosen: options.Options,
    node_plan: list[tuple[str, str]],
    free: list[int],
    pinned: Path | None,
    boot: vmplanning.Boot | None,
) -> list[nodekinds.NodeKind]:
    """Each kind of node ``chosen`` asks for, planned (KWOK's first: its
    nodes are Ready before any kubelet starts, as before kinds existed; VM
    nodes last, their ports and fabric places after the kubelet nodes')."""
    planned: list[nodekinds.NodeKind] = [
        kwokkind.plan(record, node_plan, tainted=bool(record.container_nodes or record.vm_nodes))
    ]
    if record.container_nodes:
        assert pinned is not None  # built with the container nodes' tools
        planned.append(
            containerkind.plan(
                record,
                free,
                fake_modules=chosen.fake_modules,
                pinned=pinned,
                pause_archive=chosen.pause_image,
            )
        )
    elif record.kubelet_nodes:
        planned.append(kubeletkind.plan(record, free))
    if boot is not None:
        planned.append(vmkind.plan(record, free[3 * len(record.kubelet_nodes) :], boot=boot))
    return planned


async def up(
    options: options.Options, *, progress: building.BuildProgress | None = None
) -> state.SandboxState:
    """Start a sandbox; return once every node is Ready."""
    chosen = options
    directory = chosen.directory.resolve()
    chosen.check()
    _check_directory(directory, chosen)
    _refuse_if_running(directory)
    if chosen.apiserver_port:
        ports.require_free(chosen.apiserver_port, what="kube-apiserver")

    boot = _vm_boot(directory, chosen)
    tools = _tools(chosen)
    binaries = await building.ensure_built(chosen.cache_dir, tools, progress=progress)
    gates = chosen.release.gates
    pinned = (
        building.pinned_dir(chosen.cache_dir, components.container_node(chosen.release))
        if chosen.containers
        else None
    )
    directory.mkdir(parents=True, exist_ok=True)
    _reset(directory)
    kubelet_names = kubeletkind.names(chosen.kubelet_nodes)
    vm_names = vmkind.names(chosen.vm_nodes)
    credentials = pki.create(directory / "pki", tuple(_identities(chosen, kubelet_names, vm_names)))
    if boot is not None:
        vmplanning.signing_key(directory)

    # One call, so that no two coincide: the nodes' host ports (and the
    # relay's health port) are bound by the relay before the API server starts.
    networked = len(kubelet_names) + len(vm_names)
    chosen_ports = ports.free_ports(8 + (1 + 3 * networked if networked else 0))
    etcd_port, peer_port, cm_port, scheduler_port, kwok_port, free_api_port = chosen_ports[:6]
    # The registry's: chosen now, for the relay (started first) to forward to.
    registry_port, registry_debug_port = chosen_ports.pop(6), chosen_ports.pop(6)
    relay_health_port, *node_ports = chosen_ports[6:] or [0]  # 0: no relay without nodes
    api_port = chosen.apiserver_port or free_api_port
    server = f"https://{ports.HOST}:{api_port}"

    def kubeconfig_for(identity: pki.ClientIdentity, path: Path) -> Path:
        return kubeconfigs.write(
            path,
            server=server,
            ca_cert=credentials.ca_cert,
            client_cert=credentials.client_cert(identity),
            client_key=credentials.client_key(identity),
        )

    admin_kubeconfig = kubeconfig_for(controlplane.ADMIN, directory / "kubeconfig")
    node_plan = kwoknodes.spread(chosen.nodes, chosen.kernels)
    record = state.SandboxState(
        directory=directory,
        server=server,
        kubeconfig=admin_kubeconfig,
        launched=[],
        node_names=[name for name, _ in node_plan],
        versions={tool.name: tool.version for tool in tools},
        kubelet_nodes=kubelet_names,
        container_nodes=kubelet_names if chosen.containers else [],
        cgroup_parent=f"kmm-sandbox-{secrets.token_hex(4)}" if chosen.containers else "",
        vm_nodes=vm_names,
    )
    launcher = launching.Launcher(record)
    planned = _plan(record, chosen, node_plan, node_ports, pinned, boot)
    attachments = [attachment for kind in planned for attachment in kind.attachments()]
    # VM nodes boot while the control plane starts (their kubelets wait for
    # it): a guest's boot is the longest step of a sandbox's start.
    booting: asyncio.Task[None] | None = None
    try:
        etcd = launcher.launch(
            "etcd",
            controlplane.etcd_argv(binaries["etcd"], directory, etcd_port, peer_port),
            health_url=f"http://{ports.HOST}:{etcd_port}/health",
        )
        await health.wait_healthy(etcd, timeout=chosen.start_timeout)
        network = None
        if attachments:
            network = networking.start(
                launcher,
                directory,
                attachments,
                api_port=api_port,
                health_port=relay_health_port,
                registry_port=registry_port if chosen.wants_registry else 0,
            )
            await health.wait_healthy(network.relay, timeout=chosen.start_timeout)
        starting = nodekinds.Starting(
            launcher=launcher,
            binaries=binaries,
            credentials=credentials,
            kubeconfig_for=kubeconfig_for,
            network=network,
            api_port=api_port,
            timeout=chosen.start_timeout,
            cache_dir=chosen.cache_dir,
            kubelet_feature_gates=gates.kubelet,
        )
        vms = next((kind for kind in planned if isinstance(kind, vmkind.VmNodes)), None)
        if vms is not None:
            booting = asyncio.create_task(vms.boot(starting), name="kmm-sandbox-vm-boot")
        apiserver = launcher.launch(
            "kube-apiserver",
            controlplane.apiserver_argv(
                binaries["kube-apiserver"], credentials, etcd_port, api_port, network, gates=gates
            )
            + chosen.apiserver_flags(),
            health_url=f"{server}/readyz",
        )
        await health.wait_healthy(
            apiserver,
            timeout=chosen.start_timeout,
            access=controlplane.admin(credentials, server),
        )
        controller_manager = launcher.launch(
            "kube-controller-manager",
            controlplane.controller_manager_argv(
                binaries["kube-controller-manager"],
                credentials,
                kubeconfig=kubeconfig_for(
                    controlplane.CONTROLLER_MANAGER, directory / "controller-manager.kubeconfig"
                ),
                port=cm_port,
                gates=gates,
            ),
            health_url=f"https://{ports.HOST}:{cm_port}/healthz",
        )
        scheduler = launcher.launch(
            "kube-scheduler",
            controlplane.scheduler_argv(
                binaries["kube-scheduler"],
                kubeconfig=kubeconfig_for(
                    controlplane.SCHEDULER, directory / "scheduler.kubeconfig"
                ),
                port=scheduler_port,
                gates=gates,
            ),
            health_url=f"https://{ports.HOST}:{scheduler_port}/healthz",
        )
        kwok = launcher.launch(
            "kwok",
            controlplane.kwok_argv(
                binaries["kwok"],
                directory,
                kubeconfig=kubeconfig_for(controlplane.KWOK, directory / "kwok.kubeconfig"),
                port=kwok_port,
            ),
            health_url=f"http://{ports.HOST}:{kwok_port}/healthz",
        )
        registry_process = None
        if chosen.wants_registry:
            # VM nodes' driver toolkit images, those built: linked into its
            # storage from the cache, not uploaded (``registryseeding``).
            seeds = (
                toolkitimages.seeds(chosen.cache_dir, boot.image.kernels)[0]
                if boot is not None
                else []
            )
            registry_process, record.registry = registry.start(
                launcher.launch,
                directory,
                binaries["registry"],
                credentials,
                auth=chosen.registry_auth,
                port=registry_port,
                debug_port=registry_debug_port,
                seeds=seeds,
            )
            state.save(record)
        await asyncio.gather(
            health.wait_healthy(
                controller_manager,
                timeout=chosen.start_timeout,
                access=controlplane.insecure(controller_manager.health_url),
            ),
            health.wait_healthy(
                scheduler,
                timeout=chosen.start_timeout,
                access=controlplane.insecure(scheduler.health_url),
            ),
            health.wait_healthy(kwok, timeout=chosen.start_timeout),
        )
        if registry_process is not None:
            await health.wait_healthy(registry_process, timeout=chosen.start_timeout)
        kwok_nodes, *kubelet_kinds = planned
        await kwok_nodes.start(starting)
        # A cluster where a pod can be created: the controller-manager has
        # made the default namespace's ServiceAccount, which admission needs.
        async with api_client(admin_kubeconfig) as api:
            try:
                await wait_default_account(api, timeout=chosen.start_timeout)
            except TimeoutError as err:
                raise errors.ComponentFailed(
                    "kube-controller-manager",
                    "did not create the default ServiceAccount of namespace default within "
                    f"{chosen.start_timeout:.0f} s",
                    controller_manager.log,
                    processes.log_tail(controller_manager.log),
                ) from err
        for kind in kubelet_kinds:
            if kind is vms:
                assert booting is not None
                await booting
            await kind.start(starting)
    except BaseException:
        if booting is not None and not booting.done():
            booting.cancel()
            with contextlib.suppress(BaseException):
                await booting
        _stop(record, planned)
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


def kinds(record: state.SandboxState) -> list[nodekinds.NodeKind]:
    """The kinds of node a running sandbox has, as its record and files say."""
    found: list[nodekinds.NodeKind] = [kwokkind.of(record)]
    for kind in (kubeletkind.of(record), containerkind.of(record), vmkind.of(record)):
        if kind is not None:
            found.append(kind)
    return found


def vm_nodes(directory: Path) -> vmkind.VmNodes:
    """A running sandbox's VM nodes; NotRunning when it has none."""
    record = status(directory)
    found = vmkind.of(record)
    if found is None:
        raise errors.NotRunning(
            f"the sandbox in {record.directory} has no VM node (`kmm sandbox up --vm-nodes N`)"
        )
    return found


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


def _stop(record: state.SandboxState, planned: list[nodekinds.NodeKind]) -> None:
    """Each kind's nodes (the last started first), then every other process
    in reverse start order; the first error of a kind is raised once
    everything else was done."""
    failure: errors.SandboxError | None = None
    for kind in reversed(planned):
        try:
            kind.stop()
        except errors.SandboxError as err:
            failure = failure or err
    for process in reversed(record.launched):
        process.stop()
    if failure is not None:
        raise failure


def down(directory: Path) -> list[processes.Process]:
    """Stop exactly the processes the sandbox in ``directory`` started, and
    what its nodes left behind (see the module docstring).

    Returns those that were still running. Processes are stopped in reverse
    start order so etcd outlives the API server that writes to it.
    """
    record = state.load(directory.resolve())
    if record is None:
        raise errors.NotRunning(f"no sandbox recorded in {directory}; nothing to stop")
    running = record.alive()
    _stop(record, kinds(record))
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
        found = node.get("status") or {}
        ready = next(
            (c["status"] for c in found.get("conditions") or () if c.get("type") == "Ready"),
            "Unknown",
        )
        kernel = (found.get("nodeInfo") or {}).get("kernelVersion", "")
        rows.append((objects.name(node), ready, kernel))
    return rows
