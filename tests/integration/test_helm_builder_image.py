"""The chart's builder.image, builder.driverToolkitImage and
deviceTaints.enabled values: the operator's --builder-image,
--driver-toolkit-image and --no-device-taints, passed only when set (Helm's
own rendering)."""

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
    assert not any(arg.startswith("--driver-toolkit-image") for arg in args), args
    assert "--no-device-taints" not in args, args


def test_device_taints_turned_off_pass_no_device_taints(helm: Path, tmp_path: Path) -> None:
    args = _operator_args(helm, tmp_path, "--set", "deviceTaints.enabled=false")
    assert args.count("--no-device-taints") == 1, args


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


def test_the_driver_toolkit_template_reaches_the_operator_as_written(
    helm: Path, tmp_path: Path
) -> None:
    template = "10.253.0.1:5000/kmm/driver-toolkit:${KERNEL_FULL_VERSION}"
    values = tmp_path / "values.yaml"
    values.write_text(f"builder:\n  driverToolkitImage: '{template}'\n")
    home = tmp_path / "home"
    home.mkdir()
    args = _operator_args(helm, home, "--values", str(values))
    assert args[-1] == f"--driver-toolkit-image={template}"
    assert not any(arg.startswith("--builder-image") for arg in args), args
