"""The objects that install the operator: namespace, ServiceAccount, RBAC, Deployment.

Rendered like the CRD so ``kmm manifests`` can print all of ``deploy/`` from an
installed kmm, which has no ``deploy/`` directory. The RBAC is least
privilege for the reconcilers (loader, device plugin, DRA, build and sign,
preflight): every verb below is one the operator uses, and
``tests/integration/test_operator_rbac.py`` proves it is enough by running the
operator as this ServiceAccount (``test_build_rbac.py``: the build, sign and
preflight pods' part). kmm ships no user-facing roles.
"""

from __future__ import annotations

from typing import Any

from kmm.api import modules, preflight

__all__ = [
    "DRA_DRIVER_ACCOUNT",
    "HEALTH_PORT",
    "IMAGE",
    "KUBERNETES_TESTED",
    "METRICS_PORT",
    "NAMESPACE",
    "SERVICE_ACCOUNT",
    "cluster_rbac",
    "deployment",
    "dra_driver_rbac",
    "leader_election_rbac",
    "metrics_service",
    "namespace_and_account",
    "service_monitor",
]

NAMESPACE = "kmm-system"
# The Kubernetes minors kmm is tested on, oldest and newest: the sandbox's
# releases (``kmm.sandbox.kubereleases``; a unit test keeps the two equal),
# the newest by every test, the others by `make test-compat`. DRA's v1 API,
# which the DRA part needs, is served from 1.34.
KUBERNETES_TESTED = ("1.35", "1.37")
SERVICE_ACCOUNT = "kmm-operator"
_APP = {"app.kubernetes.io/name": "kmm-operator"}
_METRICS = {**_APP, "app.kubernetes.io/component": "metrics"}
METRICS_PORT = 8080
HEALTH_PORT = 8081
# kmm's own image: the operator runs it, and so do the DRA driver pods of
# kmm-driven Modules; `kmm kubelet` runs its containers as local processes.
IMAGE = "ghcr.io/kmm/kmm:0.1.0"


# Pod Security Standard levels (pod-security.kubernetes.io/<mode>) of the
# operator's namespace: only the operator runs there, and it needs nothing
# `restricted` forbids. Loader and DRA pods run in their Module's namespace.
_POD_SECURITY = {
    f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")
}


def namespace_and_account() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NAMESPACE, "labels": dict(_POD_SECURITY)},
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE},
        },
    ]


def _rule(group: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources, "verbs": verbs}


def _subjects() -> list[dict[str, Any]]:
    return [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]


def cluster_rbac() -> list[dict[str, Any]]:
    """What the informers watch and the reconcilers write, cluster-wide."""
    # Every object the operator reads comes from an informer (list, watch):
    # no get on Modules, validations or DaemonSets. Its writes are all in
    # kmm.operator.writing, and each verb below is one of them.
    rules = [
        _rule(modules.GROUP, [modules.PLURAL], ["list", "watch", "patch"]),  # patch: finalizer
        _rule(modules.GROUP, [f"{modules.PLURAL}/status"], ["patch"]),
        # ownerReferences with blockOwnerDeletion need update on the owner's finalizers.
        _rule(modules.GROUP, [f"{modules.PLURAL}/finalizers"], ["update"]),
        # PreflightValidations are read and answered through /status only, by
        # merge patch (Writer.patch_preflight_status); their preflight pods
        # are owned with blockOwnerDeletion, hence /finalizers too.
        _rule(preflight.GROUP, [preflight.PLURAL], ["list", "watch"]),
        _rule(preflight.GROUP, [f"{preflight.PLURAL}/status"], ["patch"]),
        _rule(preflight.GROUP, [f"{preflight.PLURAL}/finalizers"], ["update"]),
        # Server-side apply creates through patch, and the API server asks
        # for create as well when the object does not exist yet. get: the
        # pod template of a DaemonSet whose pods stay missing is read whole
        # (the cache keeps no template) for a dry-run pod create
        # (``operator.podadmission``: Pod Security, quotas).
        _rule("apps", ["daemonsets"], ["get", "list", "watch", "create", "patch", "delete"]),
        # Loader pods are watched; build, sign and preflight pods are also
        # made and removed. Their failure text comes from the termination message in
        # the pod's status, so no pods/log.
        _rule("", ["pods"], ["list", "watch", "create", "delete"]),
        # Build and sign inputs (the Dockerfile ConfigMap, build secrets,
        # signing key and certificate, imageRepoSecret for registry checks),
        # read by name when needed: get only, never a Secret list or watch.
        _rule("", ["configmaps"], ["get"]),
        _rule("", ["secrets"], ["get"]),
        _rule("", ["nodes"], ["list", "watch", "patch"]),  # kernel and readiness labels
        _rule("", ["events"], ["create"]),
        # DRA: DeviceClasses made from spec.dra (create, apply, delete; all
        # watched, to see a listed name taken by someone else), and claims
        # read to keep a cordoned node's driver while it still holds one.
        _rule("resource.k8s.io", ["deviceclasses"], ["list", "watch", "create", "patch", "delete"]),
        _rule("resource.k8s.io", ["resourceclaims"], ["list", "watch"]),
        # Ordered upgrades of a DRA Module taint the moving node's devices:
        # rules created, applied (their effect changed) and deleted (with a
        # uid precondition), all watched; the slices of the Module's driver
        # read (informer) to know which pools and devices are the node's.
        _rule(
            "resource.k8s.io", ["devicetaintrules"], ["list", "watch", "create", "patch", "delete"]
        ),
        _rule("resource.k8s.io", ["resourceslices"], ["list", "watch"]),
    ]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "kmm-operator"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kmm-operator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "kmm-operator",
            },
            "subjects": _subjects(),
        },
    ]


DRA_DRIVER_ACCOUNT = "kmm-dra-driver"


def dra_driver_rbac(namespace: str, account: str = DRA_DRIVER_ACCOUNT) -> list[dict[str, Any]]:
    """The ServiceAccount a ``kmm driver`` pod runs as, and no more access
    than it uses: its node's ResourceSlices (listed and watched by node, made
    and removed; RBAC cannot narrow them to one node, the Node authorizer
    does that only for kubelets), the claims it prepares (read, cached),
    its Node (read: the slices' owner, and the Event's subject) and Events
    (the RestartRequired warning)."""
    name = f"{account}-{namespace}"  # cluster-scoped: one per account
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [
                _rule("resource.k8s.io", ["resourceslices"], ["list", "watch", "create", "delete"]),
                _rule("resource.k8s.io", ["resourceclaims"], ["get", "list", "watch"]),
                _rule("", ["nodes"], ["get"]),
                _rule("", ["events"], ["create"]),
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    ]


def leader_election_rbac() -> list[dict[str, Any]]:
    """The leader-election Lease, in the operator's own namespace only."""
    name = "kmm-operator-leader-election"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "rules": [_rule("coordination.k8s.io", ["leases"], ["get", "create", "update"])],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": _subjects(),
        },
    ]


def deployment() -> dict[str, Any]:
    """``kmm operator``: two replicas, one leading (Lease kmm-system/kmm-operator).

    Its pods pass the Pod Security Standard ``restricted``: non-root, no
    privilege escalation, every capability dropped, seccomp RuntimeDefault,
    and a read-only root filesystem besides (the operator writes no file).
    """
    field = "metadata.{}"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "kmm-operator", "namespace": NAMESPACE, "labels": dict(_APP)},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": dict(_APP)},
            "template": {
                "metadata": {"labels": dict(_APP)},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "operator",
                            "image": IMAGE,
                            "command": ["kmm", "operator"],
                            "args": [
                                f"--metrics-port={METRICS_PORT}",
                                f"--health-port={HEALTH_PORT}",
                            ],
                            "env": [
                                {
                                    "name": f"POD_{part.upper()}",
                                    "valueFrom": {"fieldRef": {"fieldPath": field.format(part)}},
                                }
                                for part in ("name", "namespace")
                            ],
                            "ports": [
                                {"name": "metrics", "containerPort": METRICS_PORT},
                                {"name": "health", "containerPort": HEALTH_PORT},
                            ],
                            "livenessProbe": {
                                "httpGet": {"path": "/healthz", "port": "health"},
                                "periodSeconds": 10,
                            },
                            "readinessProbe": {
                                "httpGet": {"path": "/readyz", "port": "health"},
                                "periodSeconds": 5,
                            },
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                "limits": {"memory": "256Mi"},
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        },
    }


def metrics_service(namespace: str = NAMESPACE) -> dict[str, Any]:
    """The operator's ``/metrics`` as a Service: what a ServiceMonitor selects.
    Every replica serves it, the standbys too (their leader-election gauge)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kmm-operator-metrics", "namespace": namespace, "labels": _METRICS},
        "spec": {
            "selector": dict(_APP),
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}],
        },
    }


def service_monitor(namespace: str = NAMESPACE, interval: str = "30s") -> dict[str, Any]:
    """A Prometheus Operator ServiceMonitor (monitoring.coreos.com/v1) for
    ``metrics_service``, as KMM's own bundle ships one."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "kmm-operator", "namespace": namespace, "labels": dict(_METRICS)},
        "spec": {
            "selector": {"matchLabels": dict(_METRICS)},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": interval}],
        },
    }
