"""The chart's builder.image value: the operator's --builder-image, passed
only when set (Helm's own rendering)."""

from __future__ import annotations

from pathlib import Path

import helm_support
import pytest

from kmm.sandbox import components


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_support.binary(components.HELM)


def _operator_args(helm: Path, home: Path, *args: str) -> list[str]:
    kinds = helm_support.by_kind(helm_support.template(helm, home, "kmm-system", *args))
    (deployment,) = kinds["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    found: list[str] = container["args"]
    return found


def test_without_the_value_the_operator_keeps_its_default(helm: Path, tmp_path: Path) -> None:
    args = _operator_args(helm, tmp_path)
    assert not any(arg.startswith("--builder-image") for arg in args), args


def test_the_value_is_passed_as_builder_image(helm: Path, tmp_path: Path) -> None:
    image = "registry.example:5000/kmm/builder:1.2"
    args = _operator_args(
        helm,
        tmp_path,
        "--set",
        f"builder.image={image}",
        "--set",
        "registryCA.configMap=cas",
    )
    assert args[-2:] == ["--registry-ca=/etc/kmm/registry-ca", f"--builder-image={image}"]
    assert args.count(f"--builder-image={image}") == 1
