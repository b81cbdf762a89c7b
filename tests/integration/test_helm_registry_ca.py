"""The chart's registryCA value: the ConfigMap or Secret of CAs mounted into
the operator, and --registry-ca pointing at it (Helm's own rendering)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_support
import pytest

from kmm.api import chart
from kmm.sandbox import components


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_support.binary(components.HELM)


def _operator_pod(helm: Path, home: Path, *args: str) -> dict[str, Any]:
    kinds = helm_support.by_kind(helm_support.template(helm, home, "kmm-system", *args))
    (deployment,) = kinds["Deployment"]
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def test_without_the_value_nothing_is_mounted(helm: Path, tmp_path: Path) -> None:
    pod = _operator_pod(helm, tmp_path)
    (container,) = pod["containers"]
    assert container["args"] == ["--metrics-port=8080", "--health-port=8081", "--leader-election"]
    assert "volumes" not in pod
    assert "volumeMounts" not in container


@pytest.mark.parametrize(
    ("value", "source"),
    [("configMap", {"configMap": {"name": "cas"}}), ("secret", {"secret": {"secretName": "cas"}})],
)
def test_a_configmap_or_secret_is_mounted_and_passed(
    helm: Path, tmp_path: Path, value: str, source: dict[str, Any]
) -> None:
    pod = _operator_pod(helm, tmp_path, "--set", f"registryCA.{value}=cas")
    (container,) = pod["containers"]
    assert container["args"][-1] == f"--registry-ca={chart.REGISTRY_CA_DIRECTORY}"
    assert pod["volumes"] == [{"name": "registry-ca", **source}]
    assert container["volumeMounts"] == [
        {"name": "registry-ca", "mountPath": chart.REGISTRY_CA_DIRECTORY, "readOnly": True}
    ]


def test_both_at_once_is_refused(helm: Path, tmp_path: Path) -> None:
    done = helm_support.helm(
        helm, tmp_path, "template", "kmm", str(helm_support.CHART),
        "--set", "registryCA.configMap=a", "--set", "registryCA.secret=b",
    )  # fmt: skip
    assert done.returncode != 0
    assert "registryCA: set configMap or secret, not both" in done.stderr


def test_without_leader_election_the_flag_still_follows(helm: Path, tmp_path: Path) -> None:
    pod = _operator_pod(
        helm, tmp_path, "--set", "replicas=1", "--set", "leaderElection.enabled=false"
    )
    assert pod["containers"][0]["args"][-1] == "--no-leader-election"
