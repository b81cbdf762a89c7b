"""``kmm sandbox``: bring a local control plane up, take it down, show it."""

from __future__ import annotations

import asyncio
import sysconfig
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TimeElapsedColumn
from rich.table import Table

from kmm.cli import paths, sandboxnodes
from kmm.oci import errors as oci_errors
from kmm.sandbox import (
    building,
    cluster,
    components,
    errors,
    nodekinds,
    processes,
    pushing,
    restarting,
    state,
)
from kmm.sandbox import registry as sandbox_registry
from kmm.sandbox.containernodes import fakemodules

app = typer.Typer(
    help="Run a local Kubernetes control plane with fake nodes.", no_args_is_help=True
)
_console = Console()
_errors = Console(stderr=True)

DirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir", help="Sandbox directory (default: $KMM_SANDBOX_DIR or ~/.local/state/kmm/sandbox)."
    ),
]


class _BuildBars:
    """Draws one progress bar per Go tool being compiled, and a line at the
    start and end of each build so logs without a terminal show it too."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._tasks: dict[str, TaskID] = {}
        self._started: dict[str, float] = {}

    def started(self, tool: str, total_packages: int) -> None:
        self._progress.console.print(
            f"building {tool} from its pinned Go module ({total_packages} packages); "
            "this happens once per version"
        )
        self._started[tool] = time.monotonic()
        self._tasks[tool] = self._progress.add_task(f"building {tool}", total=total_packages)

    def advanced(self, tool: str, packages: int) -> None:
        self._progress.advance(self._tasks[tool], packages)

    def finished(self, tool: str, *, cached: bool) -> None:
        if tool in self._tasks:
            task = self._tasks[tool]
            self._progress.update(task, completed=self._progress.tasks[task].total)
            elapsed = time.monotonic() - self._started[tool]
            self._progress.console.print(f"built {tool} in {elapsed / 60:.1f} min")


def _progress() -> Progress:
    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_errors,
        transient=True,
    )


def register(parent: typer.Typer) -> None:
    app.add_typer(sandboxnodes.app, name="node")
    parent.add_typer(app, name="sandbox")


def _fail(err: Exception) -> typer.Exit:
    _errors.print(f"[bold red]error:[/] {err}", highlight=False)
    return typer.Exit(1)


@app.command()
def up(
    directory: DirOption = None,
    nodes: Annotated[int, typer.Option(help="Number of fake nodes.")] = 3,
    kernel: Annotated[
        list[str] | None,
        typer.Option(
            help="Kernel version for the nodes' nodeInfo; repeat to spread nodes over several."
        ),
    ] = None,
    port: Annotated[int, typer.Option(help="kube-apiserver port (default: a free one).")] = 0,
    kubelet_nodes: Annotated[
        int,
        typer.Option(
            help="Nodes served by real kubelets (built from the pinned module) on a fake "
            "container runtime, beside the KWOK nodes; their DRA manager is the real one."
        ),
    ] = 0,
    runtime: Annotated[
        str,
        typer.Option(
            help="What runs the kubelet nodes' pods: fake (nothing runs, a fake CRI) or "
            "containerd (real containers: containerd, runc, CNI and kube-proxy per node, "
            "each node in network and mount namespaces of its own)."
        ),
    ] = "fake",
    pause_image: Annotated[
        Path,
        typer.Option(
            help="OCI archive of the pause image containerd nodes import "
            "(`make test-images` writes it)."
        ),
    ] = Path("build/images/pause.tar"),
    runtime_config: Annotated[
        list[str] | None,
        typer.Option(
            help="kube-apiserver --runtime-config entry (repeatable), e.g. "
            "resource.k8s.io/v1=false for a cluster without DRA."
        ),
    ] = None,
    etcd_compaction_interval: Annotated[
        float | None,
        typer.Option(
            help="Seconds between the compactions the API server asks of etcd (default: its "
            "5 minutes); a short one makes old resourceVersions answer 410 Gone.",
            show_default=False,
        ),
    ] = None,
    watch_cache: Annotated[
        bool,
        typer.Option(
            help="The API server's watch cache; without it watches are served from etcd, and "
            "one from a resourceVersion compaction has passed answers 410 Gone."
        ),
    ] = True,
    max_requests_inflight: Annotated[
        int | None,
        typer.Option(
            help="API server limit on read requests in flight; past it, 429 with Retry-After. "
            "Either limit turns API Priority and Fairness off. The admin is never throttled.",
            show_default=False,
        ),
    ] = None,
    max_mutating_requests_inflight: Annotated[
        int | None,
        typer.Option(
            help="API server limit on writes in flight; past it, 429 with Retry-After.",
            show_default=False,
        ),
    ] = None,
    registry: Annotated[
        bool | None,
        typer.Option(
            "--registry/--no-registry",
            help="Serve an image registry (distribution, TLS from the sandbox CA) that images "
            f"are named {sandbox_registry.REFERENCE_HOST}/NAME:TAG by; `kmm sandbox push` "
            "uploads to it. Default: on when --registry-auth is given.",
            show_default=False,
        ),
    ] = None,
    fake_module: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME=COUNT",
            help="Container nodes show kernel module NAME as loaded, with COUNT character "
            "devices: /sys/class/NAME/NAMEi, /sys/module/NAME and /dev/NAMEi in each node's "
            "mount namespace (repeatable; no module is really loaded).",
            show_default=False,
        ),
    ] = None,
    registry_auth: Annotated[
        str | None,
        typer.Option(
            metavar="USER:PASSWORD",
            help="The registry asks for these credentials (htpasswd, bcrypt); they are written "
            "as a .dockerconfigjson into the sandbox directory (see `status`).",
            show_default=False,
        ),
    ] = None,
    vm_nodes: Annotated[
        int,
        typer.Option(
            help="Nodes that are qemu guests booting Debian's signed kernels (OVMF, shim, "
            "grub), each with its own kubelet, containerd, runc, CNI and kube-proxy: where "
            "kernel modules are real (`make vm-image` builds their image once; root)."
        ),
    ] = 0,
    secure_boot: Annotated[
        bool,
        typer.Option(
            help="VM nodes boot under Secure Boot with the sandbox's signing key trusted "
            "(DIR/secure-boot/signing.key, signing.crt): unsigned modules are refused."
        ),
    ] = True,
    node_kernel: Annotated[
        str | None,
        typer.Option(
            metavar="VERSION",
            help="The kernel VM nodes boot first (one of the node image's; default its first).",
            show_default=False,
        ),
    ] = None,
    accel: Annotated[
        str,
        typer.Option(
            help="What runs VM nodes: kvm, tcg (qemu's emulation), or auto: KVM where a probe "
            "boot of the node image under it reaches userspace (the verdict is cached), else TCG.",
        ),
    ] = "auto",
) -> None:
    """Start etcd, kube-apiserver, controller-manager, scheduler and KWOK with fake nodes."""
    target = directory or paths.sandbox_dir()
    try:
        parsed_auth = sandbox_registry.parse_auth(registry_auth) if registry_auth else None
        fake_modules = tuple(fakemodules.parse(text) for text in fake_module or ())
    except ValueError as err:
        raise _fail(err) from err
    options = cluster.Options(
        directory=target,
        cache_dir=paths.cache_dir(),
        nodes=nodes,
        kernels=tuple(kernel) if kernel else cluster.DEFAULT_KERNELS,
        apiserver_port=port,
        runtime_config=tuple(runtime_config or ()),
        kubelet_nodes=kubelet_nodes,
        runtime=runtime,
        pause_image=pause_image.resolve(),
        etcd_compaction_interval=etcd_compaction_interval,
        watch_cache=watch_cache,
        max_requests_inflight=max_requests_inflight,
        max_mutating_requests_inflight=max_mutating_requests_inflight,
        registry=registry,
        registry_auth=parsed_auth,
        fake_modules=fake_modules,
        vm_nodes=vm_nodes,
        secure_boot=secure_boot,
        node_kernel=node_kernel or "",
        accel=accel,
    )
    started = time.monotonic()
    with _progress() as progress:
        try:
            record = asyncio.run(cluster.up(options, progress=_BuildBars(progress)))
        except (errors.SandboxError, ValueError) as err:
            raise _fail(err) from err
    elapsed = time.monotonic() - started
    kubelets = f" and {len(record.kubelet_nodes)} kubelet node(s)" if record.kubelet_nodes else ""
    vms = f" and {len(record.vm_nodes)} VM node(s)" if record.vm_nodes else ""
    _console.print(
        f"Sandbox up in {elapsed:.1f} s: API server {record.server}, "
        f"{len(record.node_names)} node(s){kubelets}{vms} Ready."
    )
    if record.vm_nodes:
        for line in sandboxnodes.vm_lines(record):
            _console.print(line, soft_wrap=True)
    # soft_wrap: these lines are meant to be copied into a shell whole.
    _console.print(f"Use it with:  export KUBECONFIG={record.kubeconfig}", soft_wrap=True)
    _console.print(_kubectl_hint(), soft_wrap=True)
    if record.registry is not None:
        _console.print(_registry_line(record), soft_wrap=True)
    _console.print(f"Stop it with: kmm sandbox down --dir {record.directory}", soft_wrap=True)


def _kubectl_hint() -> str:
    """How to reach the kubectl ``up`` built, and the kubectl-kmm plugin
    installed beside this kmm, from a shell."""
    kubectl = building.binary_dir(paths.cache_dir(), components.KUBECTL)
    plugin = Path(sysconfig.get_path("scripts"))
    return (
        f"kubectl {components.KUBECTL.version}, this cluster's own: "
        f"export PATH={kubectl}:{plugin}:$PATH; then e.g. kubectl get nodes, kubectl kmm modules"
    )


@app.command()
def build(
    kubelet: Annotated[
        bool, typer.Option(help="Also the kubelet and fake runtime of --kubelet-nodes.")
    ] = True,
    peers: Annotated[
        bool, typer.Option(help="Also the programs kmm is tested against (the DRA test driver).")
    ] = True,
    clients: Annotated[
        bool, typer.Option(help="Also helm (kubectl is always built: `up` offers it).")
    ] = True,
    container_nodes: Annotated[
        bool,
        typer.Option(
            help="Also what container nodes run (containerd, runc, CNI plugins, kube-proxy) "
            "and the registry they pull from."
        ),
    ] = True,
) -> None:
    """Build the sandbox binaries into the cache now (up does it when needed)."""
    tools = (
        cluster.TOOLS
        + ((components.KUBELET,) if kubelet else ())
        + (components.PEERS if peers else ())
        + ((components.HELM,) if clients else ())
        + ((*components.CONTAINER_NODE, components.REGISTRY) if container_nodes else ())
    )
    with _progress() as progress:
        try:
            binaries = asyncio.run(
                building.ensure_built(paths.cache_dir(), tools, progress=_BuildBars(progress))
            )
        except errors.SandboxError as err:
            raise _fail(err) from err
    for name, path in binaries.items():
        _console.print(f"{name:<24} {path}", soft_wrap=True)


@app.command()
def down(directory: DirOption = None) -> None:
    """Stop exactly the processes this sandbox started."""
    target = directory or paths.sandbox_dir()
    try:
        stopped = cluster.down(target)
    except errors.SandboxError as err:
        raise _fail(err) from err
    names = (
        ", ".join(f"{process.name} ({process.pid})" for process in stopped) or "nothing was running"
    )
    _console.print(f"Stopped: {names}")


ComponentArgument = Annotated[
    str,
    typer.Argument(
        help="As `status` names it: etcd, kube-apiserver, kube-controller-manager (or "
        "controller-manager), kube-scheduler (or scheduler), kwok, kubelet/kmm-kubelet-0 ..."
    ),
]


@app.command()
def stop(component: ComponentArgument, directory: DirOption = None) -> None:
    """Stop one component, keeping its data, port and log for `start`."""
    target = directory or paths.sandbox_dir()
    try:
        was_running = restarting.stop(target, component)
    except (errors.SandboxError, ValueError) as err:
        raise _fail(err) from err
    _console.print(f"Stopped {component}" if was_running else f"{component} was not running")


@app.command()
def start(component: ComponentArgument, directory: DirOption = None) -> None:
    """Start a stopped component again on its data (its log continues)."""
    target = directory or paths.sandbox_dir()
    _run_start(restarting.start, target, component, "Started")


@app.command()
def restart(component: ComponentArgument, directory: DirOption = None) -> None:
    """Stop one component and start it again with its data (its log continues).
    A node's name restarts the node its kind's way: a kubelet node's kubelet,
    a container node's containerd, kubelet and kube-proxy, a VM node's OS
    (a reboot); it returns once the node is Ready again."""
    target = directory or paths.sandbox_dir()
    try:
        record = cluster.status(target)
    except (errors.SandboxError, ValueError) as err:
        raise _fail(err) from err
    if any(component in kind.names for kind in cluster.kinds(record)):
        started = time.monotonic()
        try:
            asyncio.run(restarting.restart_node(target, component))
        except (errors.SandboxError, ValueError) as err:
            raise _fail(err) from err
        _console.print(
            f"Restarted node {component}; Ready after {time.monotonic() - started:.1f} s"
        )
        return
    _run_start(restarting.restart, target, component, "Restarted")


def _run_start(
    how: Callable[[Path, str], Coroutine[Any, Any, processes.Process]],
    target: Path,
    component: str,
    verb: str,
) -> None:
    started = time.monotonic()
    try:
        process = asyncio.run(how(target, component))
    except (errors.SandboxError, ValueError) as err:
        raise _fail(err) from err
    _console.print(
        f"{verb} {process.name} (pid {process.pid}); healthy after "
        f"{time.monotonic() - started:.1f} s"
    )


@app.command()
def status(directory: DirOption = None) -> None:
    """Say what runs where: components, ports, memory, nodes."""
    target = directory or paths.sandbox_dir()
    try:
        record = cluster.status(target)
    except (errors.SandboxError, ValueError) as err:
        raise _fail(err) from err
    table = Table(title=f"kmm sandbox in {record.directory}")
    for column in ("component", "pid", "state", "RSS MiB", "health endpoint", "log"):
        table.add_column(column)
    total_rss = 0
    running = 0
    for process in record.launched:
        alive = process.alive()
        rss = process.rss_bytes() if alive else 0
        total_rss += rss
        running += alive
        table.add_row(
            process.name,
            str(process.pid),
            "[green]running[/]" if alive else "[red]stopped[/]",
            f"{rss / 2**20:.0f}" if alive else "-",
            process.health_url,
            str(process.log),
        )
    _console.print(table)
    _console.print(f"API server {record.server}; control plane RSS {total_rss / 2**20:.0f} MiB")
    _console.print(f"KUBECONFIG={record.kubeconfig}", soft_wrap=True)
    if record.registry is not None:
        _console.print(_registry_line(record), soft_wrap=True)
    if running != len(record.launched) or not record.launched:
        raise typer.Exit(0 if running == 0 and not record.launched else 1)
    node_rows = asyncio.run(cluster.node_table(record.kubeconfig))
    nodes_table = Table(title="nodes")
    for column in ("name", "Ready", "kernel"):
        nodes_table.add_column(column)
    for row in node_rows:
        nodes_table.add_row(*row)
    _console.print(nodes_table)
    ready = {row[0]: row[1] for row in node_rows}
    for kind in cluster.kinds(record):
        title = _NODE_TABLES.get(kind.kind)
        if title is None:
            continue
        described = asyncio.run(kind.status())
        if described:
            _console.print(_node_kind_table(title, described, ready))


# The kinds of node ``status`` shows a table of, beside the nodes table.
_NODE_TABLES = {"containerd": "container nodes", "vm": "VM nodes"}


def _node_kind_table(
    title: str, described: list[nodekinds.NodeInfo], ready: dict[str, str]
) -> Table:
    """One kind's nodes: name, what the kind says of each, node IP, Ready."""
    table = Table(title=title)
    columns = [column for column, _ in described[0].details]
    for column in ("name", *columns, "node IP", "Ready"):
        table.add_column(column)
    for node in described:
        values = dict(node.details)
        table.add_row(
            node.name,
            *(values.get(column, "") for column in columns),
            node.address,
            ready.get(node.name, "Unknown"),
        )
    return table


def _registry_line(record: state.SandboxState) -> str:
    registry = record.registry
    assert registry is not None
    credentials = (
        f"credentials {registry.credentials}" if registry.credentials else "no authentication"
    )
    return (
        f"Registry {registry.reference_host} (from the host: {registry.host}; "
        f"CA {record.directory / 'pki' / 'ca.crt'}; {credentials})"
    )


@app.command()
def push(
    archive: Annotated[
        Path,
        typer.Argument(help="An OCI archive (what `make image` and buildah's oci-archive: write)."),
    ],
    name_tag: Annotated[str, typer.Argument(metavar="NAME:TAG", help="Repository and tag.")],
    directory: DirOption = None,
) -> None:
    """Upload an OCI archive's image to the sandbox registry; the last line
    printed is its reference, as nodes and pods pull it."""
    target = directory or paths.sandbox_dir()
    started = time.monotonic()
    try:
        reference = asyncio.run(
            pushing.push(
                target,
                archive,
                name_tag,
                progress=lambda line: _errors.print(
                    line, highlight=False, markup=False, soft_wrap=True
                ),
            )
        )
    except (errors.SandboxError, oci_errors.RegistryError, ValueError) as err:
        raise _fail(err) from err
    _errors.print(f"pushed in {time.monotonic() - started:.1f} s", highlight=False)
    # print(), not the console: the reference must be one line whatever the width.
    print(reference)
