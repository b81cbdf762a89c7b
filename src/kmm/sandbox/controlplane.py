"""The control plane's command lines, identities and health access.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK (the
controller that keeps KWOK's nodes Ready and their pods Running, started
whatever nodes a sandbox has), each on a port of 127.0.0.1 that ``cluster``
chose; their client identities (``pki``); how each one's health endpoint is
asked. ``cluster.up`` launches them in order; nothing here starts a process.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from kmm.kube import kubeconfigs as kube_access
from kmm.sandbox import (
    addressing,
    components,
    health,
    kubereleases,
    networking,
    pki,
    ports,
    processes,
    state,
)
from kmm.sandbox.kwoknodes import nodes as kwoknodes

__all__ = [
    "ADMIN",
    "CONTROLLER_MANAGER",
    "IDENTITIES",
    "KUBELET_CLIENT",
    "KWOK",
    "SCHEDULER",
    "SERVICE_CIDR",
    "TOOLS",
    "admin",
    "apiserver_argv",
    "controller_manager_argv",
    "etcd_argv",
    "health_access",
    "insecure",
    "kwok_argv",
    "scheduler_argv",
    "tools",
]

ADMIN = pki.ClientIdentity("admin", "kmm-sandbox-admin", ("system:masters",))
CONTROLLER_MANAGER = pki.ClientIdentity("controller-manager", "system:kube-controller-manager")
SCHEDULER = pki.ClientIdentity("scheduler", "system:kube-scheduler")
KWOK = pki.ClientIdentity("kwok", "kwok-controller", ("system:masters",))
# Every sandbox's: the admin's and the control plane's own.
IDENTITIES = (ADMIN, CONTROLLER_MANAGER, SCHEDULER, KWOK)
# The API server's identity towards kubelets (logs, exec, proxy), which ask
# the API server itself whether it may: as a member of system:masters, yes.
KUBELET_CLIENT = pki.ClientIdentity(
    "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
)

SERVICE_CIDR = "10.96.0.0/12"
# What every ``up`` of the default release builds: the control plane and the
# kubectl of its release, which ``up`` offers because a machine's own may be
# outside the version skew.
TOOLS = (*components.ALL, components.KUBECTL)


def tools(release: kubereleases.Release) -> tuple[components.GoTool, ...]:
    """What every ``up`` of ``release`` builds (``TOOLS`` for the default)."""
    kubernetes = components.kubernetes(release)
    return (components.ETCD, kubernetes.control_plane, components.KWOK, kubernetes.kubectl)


def admin(credentials: pki.Pki, server: str) -> kube_access.Access:
    return kube_access.Access(
        server=server,
        source="the sandbox's admin certificate",
        ca_file=credentials.ca_cert,
        client_cert_file=credentials.client_cert(ADMIN),
        client_key_file=credentials.client_key(ADMIN),
    )


def insecure(health_url: str) -> kube_access.Access:
    """controller-manager and scheduler serve health with self-signed certificates."""
    return kube_access.Access(
        server=health.server_of(health_url), source="a sandbox component", insecure=True
    )


def health_access(record: state.SandboxState, process: processes.Process) -> kube_access.Access:
    """How to ask ``process``'s health endpoint: the admin certificate for the
    API server, no verification for the self-signed controller-manager and
    scheduler, plain HTTP (the URL's own) for etcd and KWOK."""
    if process.name == "kube-apiserver":
        return admin(pki.Pki(record.directory / "pki"), record.server)
    if process.health_url.startswith("https"):
        return insecure(process.health_url)
    return kube_access.Access(server=health.server_of(process.health_url), source=process.name)


def etcd_argv(binary: Path, directory: Path, client_port: int, peer_port: int) -> list[str]:
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


def apiserver_argv(
    binary: Path,
    credentials: pki.Pki,
    etcd_port: int,
    port: int,
    network: networking.Network | None = None,
    *,
    gates: kubereleases.FeatureGates = kubereleases.DEFAULT.gates,
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
    # From 1.37 the API server refuses to advertise a loopback address to
    # the endpoint reconciler, which publishes it as the `kubernetes`
    # Service's endpoint; without nodes nothing dials that Service, so a
    # sandbox advertising 127.0.0.1 publishes no endpoint at all.
    reconciler = [] if network else ["--endpoint-reconciler-type=none"]
    kubelets = (
        [
            *networking.apiserver_flags(network),
            f"--kubelet-client-certificate={credentials.client_cert(KUBELET_CLIENT)}",
            f"--kubelet-client-key={credentials.client_key(KUBELET_CLIENT)}",
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
        *reconciler,
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={credentials.service_account_public_key}",
        f"--service-account-signing-key-file={credentials.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
        # The release's (kubereleases): e.g. ResourceHealthStatus in 1.35,
        # without which the server drops the device health a kubelet (or
        # `kmm kubelet --resource-health-status`) reports.
        *kubereleases.flag(gates.apiserver),
        *kubelets,
    ]


def controller_manager_argv(
    binary: Path,
    credentials: pki.Pki,
    *,
    kubeconfig: Path,
    port: int,
    gates: kubereleases.FeatureGates = kubereleases.DEFAULT.gates,
) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--bind-address={ports.HOST}",
        f"--secure-port={port}",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={credentials.service_account_key}",
        f"--root-ca-file={credentials.ca_cert}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--controllers=*",
        # KWOK's status heartbeats are jittered up to 35 s; a grace
        # above that keeps a busy machine from marking nodes NotReady.
        "--node-monitor-grace-period=60s",
        *kubereleases.flag(gates.controller_manager),
    ]


def scheduler_argv(
    binary: Path,
    *,
    kubeconfig: Path,
    port: int,
    gates: kubereleases.FeatureGates = kubereleases.DEFAULT.gates,
) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--bind-address={ports.HOST}",
        f"--secure-port={port}",
        "--leader-elect=false",
        *kubereleases.flag(gates.scheduler),
    ]


def _stages_file(directory: Path) -> Path:
    target = directory / "kwok.yaml"
    stages = resources.files("kmm.sandbox").joinpath("stages/kwok.yaml").read_text()
    target.write_text(stages)
    return target


def kwok_argv(binary: Path, directory: Path, *, kubeconfig: Path, port: int) -> list[str]:
    """KWOK managing only the nodes annotated as KWOK's (``kwoknodes``), with
    the stages file written into ``directory``."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={_stages_file(directory)}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector="
        f"{kwoknodes.FAKE_NODE_ANNOTATION[0]}={kwoknodes.FAKE_NODE_ANNOTATION[1]}",
        f"--server-address={ports.HOST}:{port}",
        "--node-lease-duration-seconds=40",
        "--cidr=10.244.0.0/16",
        "--node-ip=10.200.0.1",
    ]
