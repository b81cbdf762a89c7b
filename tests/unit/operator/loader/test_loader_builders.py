"""The loader DaemonSet builder (pure, table-driven)."""

from __future__ import annotations

from typing import Any

import operator_fixtures as fixtures
import pytest

from kmm.api import kernels, labels, modprobing
from kmm.operator import objects
from kmm.operator.loader import builders as loader_builders


def _target(kernel: str, raw: dict[str, Any] | None = None) -> kernels.Target:
    found = kernels.target(fixtures.module(raw), kernel)
    assert found is not None
    return found


@pytest.mark.parametrize(
    ("kernel", "image"),
    [
        ("6.8.0-45-generic", "r.io/lit:6.8.0"),
        ("6.1.0-27-amd64", "r.io/m:v1"),
        ("5.14.0-427.el9.x86_64+", "r.io/default:5.14"),
    ],
)
def test_loader_daemonset_per_pair(kernel: str, image: str) -> None:
    module = fixtures.module()
    target = _target(kernel)
    ds = loader_builders.daemonset(module, target)
    trimmed = kernels.node_kernel(kernel)
    pair = {
        labels.MODULE_NAME: "m",
        labels.MODULE_NAMESPACE: "ns",
        labels.ROLE: "module-loader",
        labels.KERNEL_VERSION_FULL: trimmed,
        labels.IMAGE_HASH: labels.image_hash(image),
    }
    assert ds["metadata"]["labels"] == pair
    assert ds["spec"]["selector"]["matchLabels"] == pair
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    owner = ds["metadata"]["ownerReferences"][0]
    assert owner["controller"] is True
    assert owner["blockOwnerDeletion"] is True
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pick": "yes", labels.KERNEL_VERSION_FULL: trimmed}
    assert pod["priorityClassName"] == "system-node-critical"
    container = pod["containers"][0]
    assert container["image"] == image
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_MODULE"]}
    assert container["lifecycle"]["postStart"]["exec"]["command"] == [
        "/bin/sh",
        "-c",
        "modprobe -v -d /opt kmod_x a=1",
    ]
    assert container["lifecycle"]["preStop"]["exec"]["command"][-1] == "modprobe -rv -d /opt kmod_x"
    assert objects.observed_hash(ds) is not None


def test_name_is_deterministic_per_pair_and_fits() -> None:
    module = fixtures.module()
    a = loader_builders.daemonset(module, _target("6.8.0-45-generic"))
    b = loader_builders.daemonset(module, _target("6.8.0-45-generic"))
    c = loader_builders.daemonset(module, _target("6.1.0-27-amd64"))
    assert a == b
    assert a["metadata"]["name"] != c["metadata"]["name"]
    assert len(a["metadata"]["name"]) <= 63


@pytest.mark.parametrize(
    ("modprobe", "load", "unload"),
    [
        (
            {"moduleName": "x", "dirName": "/mods", "args": {"load": ["-q"], "unload": ["-q"]}},
            "modprobe -v -q -d /mods x",
            "modprobe -rv -q -d /mods x",
        ),
        (
            {"rawArgs": {"load": ["-a", "y"], "unload": ["-r", "y"]}},
            "modprobe -a y",
            "modprobe -r y",
        ),
        (
            {"moduleName": "x", "modulesLoadingOrder": ["x", "dep"]},
            "modprobe -v -d /opt x",
            "modprobe -rv -d /opt x && modprobe -rv -d /opt dep",
        ),
        (
            {"moduleName": "x", "firmwarePath": "/fw"},
            "cp -r /fw/. /var/lib/firmware && modprobe -v -d /opt x",
            "modprobe -rv -d /opt x",
        ),
    ],
)
def test_modprobe_commands(modprobe: dict[str, Any], load: str, unload: str) -> None:
    raw = fixtures.module_raw()
    raw["spec"]["moduleLoader"]["container"]["modprobe"] = modprobe
    ds = loader_builders.daemonset(fixtures.module(raw), _target("6.1.0-27-amd64", raw))
    lifecycle = ds["spec"]["template"]["spec"]["containers"][0]["lifecycle"]
    assert lifecycle["postStart"]["exec"]["command"][-1] == load
    assert lifecycle["preStop"]["exec"]["command"][-1] == unload


@pytest.mark.parametrize(
    "raw_args",
    [None, {"load": ["-v", "y"]}, {"unload": ["-rv", "y"]}, {"load": [], "unload": []}],
)
def test_modprobe_commands_refuse_a_spec_without_module_name_or_both_raw_args(
    raw_args: dict[str, Any] | None,
) -> None:
    """Validation refuses these; the builder says so with an error too, not an
    ``assert`` that ``python -O`` strips (it would then run a bare ``modprobe``)."""
    modprobe = modprobing.ModprobeSpec.model_construct(
        module_name=None,
        raw_args=None if raw_args is None else modprobing.ModprobeArgs.model_construct(**raw_args),
    )
    target = _target("6.1.0-27-amd64")
    with pytest.raises(ValueError, match=r"rawArgs\.load and rawArgs\.unload must both be set"):
        loader_builders.load_commands(modprobe, target)
    with pytest.raises(ValueError, match=r"rawArgs\.load and rawArgs\.unload must both be set"):
        loader_builders.unload_commands(modprobe)


def test_in_tree_modules_removed_first() -> None:
    raw = fixtures.module_raw()
    raw["spec"]["moduleLoader"]["container"]["kernelMappings"][1]["inTreeModulesToRemove"] = ["old"]
    ds = loader_builders.daemonset(fixtures.module(raw), _target("6.1.0-27-amd64", raw))
    command = ds["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["postStart"]["exec"]
    assert command["command"][-1] == "modprobe -rva old && modprobe -v -d /opt kmod_x a=1"


def test_template_depends_only_on_pair_and_module_content() -> None:
    """Operator restarts rebuild the same object: the hash is stable."""
    first = loader_builders.daemonset(fixtures.module(), _target("6.8.0-45-generic"))
    again = loader_builders.daemonset(fixtures.module(), _target("6.8.0-45-generic"))
    assert objects.observed_hash(first) == objects.observed_hash(again)
    raw = fixtures.module_raw()
    raw["spec"]["moduleLoader"]["container"]["modprobe"]["parameters"] = ["a=2"]
    changed = loader_builders.daemonset(fixtures.module(raw), _target("6.8.0-45-generic", raw))
    assert objects.observed_hash(changed) != objects.observed_hash(first)
