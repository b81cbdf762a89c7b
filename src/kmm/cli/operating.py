"""``kmm operator``: the Module operator (DESIGN §5), leader-elected.

Reads flags and the environment (``POD_NAME``/``POD_NAMESPACE`` from the
Deployment's downward API), sizes the process's TLS read buffers
(``kmm.aio.tlsbuffers``) and runs ``kmm.operator.running.run`` until
SIGTERM/SIGINT. Exit status 1 after losing the lease: the replica restarts
with fresh caches rather than race the new leader (client-go's habit).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path
from typing import Annotated

import typer

from kmm.aio import tlsbuffers
from kmm.cli import clients
from kmm.kube import client
from kmm.oci import trust
from kmm.operator import jsonlogs, running, wiring
from kmm.operator.build import asking, toolkit
from kmm.operator.build import settings as build_settings
from kmm.runtime import leaderelection, manager

__all__ = ["operator", "register"]

_log = logging.getLogger(__name__)

# client-go's lease timing, the flags' defaults.
DEFAULT_ELECTION = wiring.Election(identity="", namespace="")


async def _main(api: client.Client, settings: running.Settings) -> None:
    stop = asyncio.Event()
    undo = manager.stop_on_signals(stop)
    try:
        async with api:
            await running.run(api, settings, stop)
    finally:
        undo()


def operator(
    kubeconfig: clients.KubeconfigOption = None,
    context: clients.ContextOption = None,
    metrics_port: Annotated[int, typer.Option(help="Port for /metrics.")] = 8080,
    health_port: Annotated[int, typer.Option(help="Port for /healthz and /readyz.")] = 8081,
    bind_address: Annotated[
        str,
        typer.Option(
            help="Address the HTTP endpoints bind; default: every address, IPv6 and IPv4 "
            "(0.0.0.0 where there is no IPv6)."
        ),
    ] = "",
    leader_election: Annotated[
        bool, typer.Option(help="Run the controllers only while holding the Lease.")
    ] = True,
    namespace_of_lease: Annotated[
        str | None,
        typer.Option(help="Namespace of the Lease; default: $POD_NAMESPACE, else kube-system."),
    ] = None,
    identity: Annotated[
        str | None, typer.Option(help="Lease holder identity; default: $POD_NAME, else host_pid.")
    ] = None,
    lease_duration: Annotated[
        float,
        typer.Option(help="Seconds a follower waits on an unrenewed Lease before taking it."),
    ] = DEFAULT_ELECTION.lease_duration,
    renew_deadline: Annotated[
        float,
        typer.Option(
            help="Seconds after its last renewal was sent that a leader stops writing "
            "and exits, unless renewed; less than --lease-duration."
        ),
    ] = DEFAULT_ELECTION.renew_deadline,
    retry_period: Annotated[
        float, typer.Option(help="Seconds between attempts to take or renew the Lease.")
    ] = DEFAULT_ELECTION.retry_period,
    workers: Annotated[int, typer.Option(help="Modules reconciled at once.")] = 4,
    resync_period: Annotated[
        float,
        typer.Option(
            help="Seconds between requeues of every Module, which heal a lost event "
            "(a converged Module costs no write).",
            min=0.001,
        ),
    ] = wiring.DEFAULT_RESYNC_PERIOD,
    registry_ca: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="PATH",
            help="Extra CA certificates (a PEM file, or a directory of them such as a mounted "
            "ConfigMap; repeatable) trusted beside the system's for registry requests: the "
            "image existence checks of build and sign. Checked at start.",
            show_default=False,
        ),
    ] = None,
    registry_endpoint: Annotated[
        list[str] | None,
        typer.Option(
            metavar="HOST=ENDPOINT",
            help="Dial ENDPOINT (host:port) for registry HOST in the image existence checks "
            "(repeatable): an operator outside the network HOST is reached in. TLS still "
            "checks HOST's name. ENDPOINT is dialled even on loopback or link-local "
            "addresses, which the checks refuse for any other host.",
            show_default=False,
        ),
    ] = None,
    builder_image: Annotated[
        str, typer.Option(help="The image build and sign pods run (buildah, sign-file).")
    ] = build_settings.DEFAULT_BUILDER_IMAGE,
    build_pod_retention: Annotated[
        float,
        typer.Option(help="Seconds a succeeded build or sign pod is kept before deletion.", min=0),
    ] = 0.0,
    driver_toolkit_image: Annotated[
        str | None,
        typer.Option(
            metavar="TEMPLATE",
            help="The driver toolkit image a build gets as its build argument DTK_AUTO (as "
            "KMM on OpenShift passes it), for a Dockerfile written ARG DTK_AUTO / FROM "
            "${DTK_AUTO}: expanded per kernel like a kernel mapping's containerImage, e.g. "
            "registry.example/kmm/driver-toolkit:${KERNEL_FULL_VERSION}. Passed only to "
            "builds whose Dockerfile mentions DTK_AUTO and whose buildArgs do not set it. "
            "Checked at start.",
            show_default=False,
        ),
    ] = None,
    build_input_poll: Annotated[
        float,
        typer.Option(
            help="Seconds between looks at the inputs (ConfigMaps, Secrets) of a build or sign "
            "pod that has not succeeded, which is replaced once they change; and between asks "
            "for a sign-only kernel's unsignedImage until the registry has it.",
            min=0.1,
        ),
    ] = build_settings.DEFAULT_POLL,
    device_taints: Annotated[
        bool,
        typer.Option(
            help="In ordered upgrades of DRA Modules, taint a moving node's devices of the "
            "Module with DeviceTaintRules (NoSchedule; NoExecute for Modules annotated "
            'kmm.sigs.x-k8s.io/evict-device-users="true") where the cluster serves them. '
            "Off: no rule is read or written (nor ResourceSlices), nothing is evicted, and a "
            "moving node's DRA driver stays while pods use its devices.",
        ),
    ] = True,
) -> None:
    """Run the Module operator: loader and device-plugin DaemonSets, node labels, status."""
    try:
        leaderelection.check_timing(lease_duration, renew_deadline, retry_period)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--lease-duration/--renew-deadline") from err
    try:
        registry_ca_files = trust.load(registry_ca or ())
        build_settings.registry_ca_bundle(registry_ca_files)  # it fits in a pod annotation
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--registry-ca") from err
    try:
        endpoints = asking.parse_endpoints(registry_endpoint or ())
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--registry-endpoint") from err
    if driver_toolkit_image:
        try:
            toolkit.check_template(driver_toolkit_image)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint=toolkit.FLAG) from err
    jsonlogs.configure()
    # Before the first connection: each watch keeps its TLS connection for good.
    tlsbuffers.limit()
    name = identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"
    lease_namespace = namespace_of_lease or os.environ.get("POD_NAMESPACE") or "kube-system"
    election = wiring.Election(
        identity=name,
        namespace=lease_namespace,
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
    )
    settings = running.Settings(
        identity=name,
        election=election if leader_election else None,
        metrics_port=metrics_port,
        health_port=health_port,
        host=bind_address,
        workers=workers,
        resync_period=resync_period,
        registry_ca_files=registry_ca_files,
        registry_endpoints=endpoints,
        builder_image=builder_image,
        driver_toolkit_image=driver_toolkit_image or "",
        build_pod_retention=build_pod_retention,
        build_input_poll=build_input_poll,
        device_taints=device_taints,
    )
    api = clients.api_client(kubeconfig, context)
    try:
        asyncio.run(_main(api, settings))
    except manager.LeadershipLost:
        _log.error("lost the lease; exiting so the replica restarts")
        raise typer.Exit(1) from None


def register(app: typer.Typer) -> None:
    app.command("operator")(operator)
