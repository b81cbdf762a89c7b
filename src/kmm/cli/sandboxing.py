"""``kmm sandbox``: bring a local control plane up, take it down, show it.

This module is the command group: it registers every ``kmm sandbox``
command, in the order help lists them, and holds those that make or end a
sandbox as a whole: ``up`` (its flags become ``cluster.Options``), ``build``
(the pinned binaries into the cache, with a progress bar per Go tool),
``down`` and ``push`` (an image into the sandbox registry). The others live
in modules of their own: ``sandboxcomponents`` (``stop``, ``start``,
``restart``), ``sandboxstatus`` (``status``), ``sandboxnodes`` (``node exec``,
``node reboot``); ``sandboxcommon`` holds what they all share.

Limits: flags to calls and results to lines only; the sandbox itself is
``kmm.sandbox``'s.
"""

from __future__ import annotations

import asyncio
import sysconfig
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TimeElapsedColumn

from kmm.cli import paths, sandboxcommon, sandboxcomponents, sandboxnodes, sandboxstatus
from kmm.oci import errors as oci_errors
from kmm.sandbox import building, cluster, components, controlplane, errors, kubereleases, pushing
from kmm.sandbox import registry as sandbox_registry
from kmm.sandbox.containernodes import fakemodules

app = typer.Typer(
    help="Run a local Kubernetes control plane with fake nodes.", no_args_is_help=True
)


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
        console=sandboxcommon.error_console,
        transient=True,
    )


def register(parent: typer.Typer) -> None:
    app.add_typer(sandboxnodes.app, name="node")
    parent.add_typer(app, name="sandbox")


KubernetesVersionOption = Annotated[
    str,
    typer.Option(
        metavar="VERSION",
        help=f"The Kubernetes release of the control plane and kubelets: {kubereleases.supported()} "
        f"(a minor or its pinned patch; default {kubereleases.DEFAULT.minor}). Each is built "
        "once into the cache.",
        show_default=False,
    ),
]


def up(
    directory: sandboxcommon.DirOption = None,
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
    kubernetes_version: KubernetesVersionOption = "",
) -> None:
    """Start etcd, kube-apiserver, controller-manager, scheduler and KWOK with fake nodes."""
    target = directory or paths.sandbox_dir()
    try:
        parsed_auth = sandbox_registry.parse_auth(registry_auth) if registry_auth else None
        fake_modules = tuple(fakemodules.parse(text) for text in fake_module or ())
    except ValueError as err:
        raise sandboxcommon.fail(err) from err
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
        kubernetes_version=kubernetes_version,
    )
    started = time.monotonic()
    with _progress() as progress:
        try:
            record = asyncio.run(cluster.up(options, progress=_BuildBars(progress)))
        except (errors.SandboxError, ValueError) as err:
            raise sandboxcommon.fail(err) from err
    elapsed = time.monotonic() - started
    kubelets = f" and {len(record.kubelet_nodes)} kubelet node(s)" if record.kubelet_nodes else ""
    vms = f" and {len(record.vm_nodes)} VM node(s)" if record.vm_nodes else ""
    sandboxcommon.console.print(
        f"Sandbox up in {elapsed:.1f} s: API server {record.server}, "
        f"{len(record.node_names)} node(s){kubelets}{vms} Ready."
    )
    if record.vm_nodes:
        for line in sandboxnodes.vm_lines(record):
            sandboxcommon.console.print(line, soft_wrap=True)
    # soft_wrap: these lines are meant to be copied into a shell whole.
    sandboxcommon.console.print(
        f"Use it with:  export KUBECONFIG={record.kubeconfig}", soft_wrap=True
    )
    sandboxcommon.console.print(_kubectl_hint(options.release), soft_wrap=True)
    if record.registry is not None:
        sandboxcommon.console.print(sandboxstatus.registry_line(record), soft_wrap=True)
    sandboxcommon.console.print(
        f"Stop it with: kmm sandbox down --dir {record.directory}", soft_wrap=True
    )


def _kubectl_hint(release: kubereleases.Release) -> str:
    """How to reach the kubectl ``up`` built, and the kubectl-kmm plugin
    installed beside this kmm, from a shell."""
    tool = components.kubernetes(release).kubectl
    kubectl = building.binary_dir(paths.cache_dir(), tool)
    plugin = Path(sysconfig.get_path("scripts"))
    return (
        f"kubectl {tool.version}, this cluster's own: "
        f"export PATH={kubectl}:{plugin}:$PATH; then e.g. kubectl get nodes, kubectl kmm modules"
    )


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
    kubernetes_version: KubernetesVersionOption = "",
) -> None:
    """Build the sandbox binaries into the cache now (up does it when needed)."""
    try:
        release = kubereleases.find(kubernetes_version)
    except ValueError as err:
        raise sandboxcommon.fail(err) from err
    kubernetes = components.kubernetes(release)
    tools = (
        controlplane.tools(release)
        + ((kubernetes.kubelet,) if kubelet else ())
        + ((kubernetes.dra_test_driver,) if peers else ())
        + ((components.HELM,) if clients else ())
        + ((*components.container_node(release), components.REGISTRY) if container_nodes else ())
    )
    with _progress() as progress:
        try:
            binaries = asyncio.run(
                building.ensure_built(paths.cache_dir(), tools, progress=_BuildBars(progress))
            )
        except errors.SandboxError as err:
            raise sandboxcommon.fail(err) from err
    for name, path in binaries.items():
        sandboxcommon.console.print(f"{name:<24} {path}", soft_wrap=True)


def down(directory: sandboxcommon.DirOption = None) -> None:
    """Stop exactly the processes this sandbox started."""
    target = directory or paths.sandbox_dir()
    try:
        stopped = cluster.down(target)
    except errors.SandboxError as err:
        raise sandboxcommon.fail(err) from err
    names = (
        ", ".join(f"{process.name} ({process.pid})" for process in stopped) or "nothing was running"
    )
    sandboxcommon.console.print(f"Stopped: {names}")


def push(
    archive: Annotated[
        Path,
        typer.Argument(help="An OCI archive (what `make image` and buildah's oci-archive: write)."),
    ],
    name_tag: Annotated[str, typer.Argument(metavar="NAME:TAG", help="Repository and tag.")],
    directory: sandboxcommon.DirOption = None,
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
                progress=lambda line: sandboxcommon.error_console.print(
                    line, highlight=False, markup=False, soft_wrap=True
                ),
            )
        )
    except (errors.SandboxError, oci_errors.RegistryError, ValueError) as err:
        raise sandboxcommon.fail(err) from err
    sandboxcommon.error_console.print(
        f"pushed in {time.monotonic() - started:.1f} s", highlight=False
    )
    # print(), not the console: the reference must be one line whatever the width.
    print(reference)


# The group's commands, in the order its help lists them.
for _command in (
    up,
    build,
    down,
    sandboxcomponents.stop,
    sandboxcomponents.start,
    sandboxcomponents.restart,
    sandboxstatus.status,
    push,
):
    app.command()(_command)
