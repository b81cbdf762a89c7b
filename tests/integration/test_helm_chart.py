"""The Helm chart (deploy/helm/kmm) through the sandbox's helm.

Rendered, it is deploy/: the same RBAC rules, CRD, admission policy and
operator container, with the values in their places and the parts switched
off rendering nothing. The API server accepts its output (server-side dry
run), and installed by ``helm install`` into a sandbox of its own, its RBAC
is enough for the operator: run locally as the chart's ServiceAccount
(impersonated, as test_operator_rbac.py does for deploy/), leader-elected in
the release namespace, it converges the demo Module.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_support
import pytest
import test_operator_support as support
import yaml
from kubernetes_asyncio import client

from kmm.api import crd, examples, installation, labels, modules
from kmm.cli import applying, paths
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import kubeconfigs
from kmm.operator import wiring
from kmm.sandbox import cluster, components, testing

RELEASE_NAMESPACE = "kmm-helm"
# `make demo`'s nodes: the demo Module maps each of these kernels.
KERNELS = ("6.8.0-45-generic", "6.1.0-27-amd64", "5.14.0-427.el9.x86_64+")


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_support.binary(components.HELM)


def _deploy_container() -> dict[str, Any]:
    (container,) = installation.deployment()["spec"]["template"]["spec"]["containers"]
    return container


def test_helm_lint_passes(helm: Path, tmp_path: Path) -> None:
    done = helm_support.helm(helm, tmp_path, "lint", "--strict", str(helm_support.CHART))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_default_rendering_is_deploy(helm: Path, tmp_path: Path) -> None:
    kinds = helm_support.by_kind(helm_support.template(helm, tmp_path, RELEASE_NAMESPACE))
    assert sorted(kinds) == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "Deployment",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    )
    definitions = kinds["CustomResourceDefinition"]
    assert [d["spec"] for d in definitions] == [d["spec"] for d in crd.render_all()]
    for definition in definitions:
        assert definition["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    (role,) = kinds["ClusterRole"]
    assert role["rules"] == installation.cluster_rbac()[0]["rules"]
    (election,) = kinds["Role"]
    assert election["rules"] == installation.leader_election_rbac()[0]["rules"]
    for binding in kinds["ClusterRoleBinding"] + kinds["RoleBinding"]:
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": installation.SERVICE_ACCOUNT,
                "namespace": RELEASE_NAMESPACE,
            }
        ]
    (deployment,) = kinds["Deployment"]
    expected = copy.deepcopy(installation.deployment()["spec"])
    (container,) = expected["template"]["spec"]["containers"]
    container["imagePullPolicy"] = "IfNotPresent"
    container["args"].append("--leader-election")
    assert deployment["spec"] == expected
    namespaced = ("Deployment", "Role", "RoleBinding", "Service", "ServiceAccount")
    assert {doc["metadata"]["namespace"] for kind in namespaced for doc in kinds[kind]} == {
        RELEASE_NAMESPACE
    }


def test_values_reach_the_deployment(helm: Path, tmp_path: Path) -> None:
    values = {
        "image": {"repository": "registry.example/kmm", "tag": "9.9.9", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "pull"}],
        "replicas": 3,
        # Helm merges a values file into the defaults: both halves given.
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
    }
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    kinds = helm_support.by_kind(
        helm_support.template(helm, tmp_path, RELEASE_NAMESPACE, "--values", str(path))
    )
    (deployment,) = kinds["Deployment"]
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/kmm:9.9.9"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == values["resources"]
    assert pod["imagePullSecrets"] == values["imagePullSecrets"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]


def test_disabled_parts_render_nothing(helm: Path, tmp_path: Path) -> None:
    off = ",".join(
        [
            "crds.install=false",
            "admissionPolicy.enabled=false",
            "metrics.enabled=false",
            "metrics.serviceMonitor.enabled=true",  # nothing to monitor without metrics
            "leaderElection.enabled=false",
            "replicas=1",
        ]
    )
    kinds = helm_support.by_kind(
        helm_support.template(helm, tmp_path, RELEASE_NAMESPACE, "--set", off)
    )
    assert sorted(kinds) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount"]
    (deployment,) = kinds["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][-1] == "--no-leader-election"
    # Empty values leave their keys out rather than rendering nulls.
    assert not {"nodeSelector", "tolerations", "imagePullSecrets"} & set(
        deployment["spec"]["template"]["spec"]
    )


def test_service_monitor_selects_the_metrics_service(helm: Path, tmp_path: Path) -> None:
    kinds = helm_support.by_kind(
        helm_support.template(
            helm,
            tmp_path,
            RELEASE_NAMESPACE,
            "--set",
            "metrics.serviceMonitor.enabled=true,metrics.serviceMonitor.labels.release=prom",
        )
    )
    (service,) = kinds["Service"]
    (monitor,) = kinds["ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] == "metrics"
    assert port["port"] == installation.METRICS_PORT
    # The Service reaches the operator's pods and their metrics port.
    assert service["spec"]["selector"].items() <= (
        installation.deployment()["spec"]["template"]["metadata"]["labels"].items()
    )
    assert {"name": "metrics", "containerPort": installation.METRICS_PORT} in _deploy_container()[
        "ports"
    ]


def test_replicas_without_leader_election_are_refused(helm: Path, tmp_path: Path) -> None:
    done = helm_support.helm(
        helm,
        tmp_path,
        "template",
        "kmm",
        str(helm_support.CHART),
        "--set",
        "replicas=2,leaderElection.enabled=false",
    )
    assert done.returncode == 1
    assert "replicas above 1 need leaderElection.enabled" in done.stderr


async def test_rendering_is_accepted_by_server_side_dry_run(
    sandbox: testing.RunningSandbox, kmm_api: kube_client.Client, namespace: str, tmp_path: Path
) -> None:
    helm = await asyncio.to_thread(helm_support.binary, components.HELM)
    docs = await asyncio.to_thread(helm_support.template, helm, tmp_path, namespace)
    lines = await applying.apply_documents(kmm_api, docs, dry_run=True)
    assert len(lines) == len(docs)
    assert all(line.endswith("(dry run)") for line in lines), lines


@pytest.fixture(scope="module")
def installed_sandbox(helm: Path) -> Iterator[testing.RunningSandbox]:
    """A sandbox of its own, with the chart installed: helm owns what it
    makes, so it cannot share the session's, where deploy/ is applied."""
    directory = Path(tempfile.mkdtemp(prefix="kh", dir="/tmp"))
    options = cluster.Options(
        directory=directory, cache_dir=paths.cache_dir(), nodes=4, kernels=KERNELS
    )
    record = asyncio.run(cluster.up(options))
    try:
        yield testing.RunningSandbox(
            directory=directory,
            kubeconfig=record.kubeconfig,
            server=record.server,
            node_names=record.node_names,
            kernels=KERNELS,
        )
    finally:
        cluster.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


async def test_installed_chart_runs_the_operator_to_a_ready_demo_module(
    installed_sandbox: testing.RunningSandbox, helm: Path, tmp_path: Path
) -> None:
    kubeconfig = str(installed_sandbox.kubeconfig)
    installed = await asyncio.to_thread(
        helm_support.helm,
        helm,
        tmp_path,
        "install",
        "kmm",
        str(helm_support.CHART),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--kubeconfig",
        kubeconfig,
    )
    assert installed.returncode == 0, installed.stderr
    account = f"system:serviceaccount:{RELEASE_NAMESPACE}:{installation.SERVICE_ACCOUNT}"
    access = dataclasses.replace(
        kubeconfigs.load(installed_sandbox.kubeconfig), impersonate=account
    )
    async with kube_client.Client(access) as limited:
        with pytest.raises(kube_errors.Forbidden):
            await limited.request("GET", "/api/v1/secrets")

    api = await support.independent_client(installed_sandbox.kubeconfig)
    demo = examples.demo_module()
    name, namespace = demo["metadata"]["name"], demo["metadata"]["namespace"]
    ready_key = labels.ready(namespace, name)
    election = wiring.Election(identity="helm-test", namespace=RELEASE_NAMESPACE)
    async with api, cluster.api_client(installed_sandbox.kubeconfig) as admin:
        # The chart's admission policy is in force once the API server has it.
        too_long = support.module_body("n" * labels.MAX_NAME_AND_NAMESPACE, {"probe": "x"})

        async def policy_enforced() -> bool:
            return await support.refusal(api, "default", too_long) is not None

        await testing.eventually(policy_enforced, "the chart's CRD and admission policy in force")

        async def converged() -> bool:
            module = await support.get_module(api, namespace, name)
            ready = support.condition(module, "Ready")
            nodes = await support.node_labels(api)
            return (
                ready is not None
                and ready["status"] == "True"
                and {n for n, lbl in nodes.items() if ready_key in lbl}
                == set(installed_sandbox.node_names)
            )

        async with support.operator_in_process(
            installed_sandbox.kubeconfig, impersonate=account, election=election
        ) as running:
            await applying.apply_documents(admin, [demo])
            await testing.eventually(converged, "demo Module Ready on every node")
            assert running.op.leading()
            lease = await client.CoordinationV1Api(api).read_namespaced_lease(
                "kmm-operator", RELEASE_NAMESPACE
            )
            assert lease.spec.holder_identity == "helm-test"
            await client.CustomObjectsApi(api).delete_namespaced_custom_object(
                modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
            )

            async def gone() -> bool:
                return await support.get_module(api, namespace, name) is None

            await testing.eventually(gone, "demo Module deleted (finalizer released)")

        uninstalled = await asyncio.to_thread(
            helm_support.helm,
            helm,
            tmp_path,
            "uninstall",
            "kmm",
            "--namespace",
            RELEASE_NAMESPACE,
            "--kubeconfig",
            kubeconfig,
        )
        assert uninstalled.returncode == 0, uninstalled.stderr
        # The CRDs stay (resource-policy keep): the Module CRD's deletion would
        # take every Module.
        extensions = client.ApiextensionsV1Api(api)
        for name in (crd.NAME, crd.PREFLIGHT_NAME):
            assert await extensions.read_custom_resource_definition(name)
        with pytest.raises(client.ApiException) as missing:
            await client.RbacAuthorizationV1Api(api).read_cluster_role("kmm-operator")
        assert missing.value.status == 404
