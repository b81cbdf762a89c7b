"""The loader DaemonSet builder (pure, table-driven)."""

from __future__ import annotations

import shlex
from typing import Any

import operator_fixtures as fixtures
import pytest

from kmm.api import kernels, labels, modprobing
from kmm.operator import objects
from kmm.operator.loader import builders as loader_builders
from kmm.operator.loader import scripts as loader_scripts


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
    module_spec = module.spec.module_loader
    assert module_spec is not None
    modprobe = module_spec.container.modprobe
    assert container["lifecycle"]["postStart"]["exec"]["command"] == [
        "/bin/sh",
        "-c",
        loader_builders.load_script(modprobe, target),
    ]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [
        "/bin/sh",
        "-c",
        loader_scripts.unload_script([["modprobe", "-rv", "-d", "/opt", "kmod_x"]]),
    ]
    # Where a failed hook writes why (loader.scripts), kept by the kubelet.
    assert container["terminationMessagePath"] == loader_scripts.REPORT_PATH
    assert container["terminationMessagePolicy"] == "File"
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
            ["modprobe", "-v", "-q", "-d", "/mods", "x"],
            [["modprobe", "-rv", "-q", "-d", "/mods", "x"]],
        ),
        (
            {"rawArgs": {"load": ["-a", "y"], "unload": ["-r", "y"]}},
            ["modprobe", "-a", "y"],
            [["modprobe", "-r", "y"]],
        ),
        (
            {"moduleName": "x", "modulesLoadingOrder": ["x", "dep"]},
            ["modprobe", "-v", "-d", "/opt", "x"],
            [["modprobe", "-rv", "-d", "/opt", "x"], ["modprobe", "-rv", "-d", "/opt", "dep"]],
        ),
        (
            {"moduleName": "x", "firmwarePath": "/fw"},
            ["modprobe", "-v", "-d", "/opt", "x"],
            [["modprobe", "-rv", "-d", "/opt", "x"]],
        ),
    ],
)
def test_modprobe_commands(
    modprobe: dict[str, Any], load: list[str], unload: list[list[str]]
) -> None:
    raw = fixtures.module_raw()
    raw["spec"]["moduleLoader"]["container"]["modprobe"] = modprobe
    module = fixtures.module(raw)
    spec = module.spec.module_loader
    assert spec is not None
    assert loader_builders.load_command(spec.container.modprobe) == load
    assert loader_builders.unload_commands(spec.container.modprobe) == unload
    ds = loader_builders.daemonset(module, _target("6.1.0-27-amd64", raw))
    lifecycle = ds["spec"]["template"]["spec"]["containers"][0]["lifecycle"]
    post_start = lifecycle["postStart"]["exec"]["command"][-1]
    assert post_start.splitlines()[-2 if "moduleName" in modprobe else -1] == shlex.join(
        ["kmm_run", shlex.join(load), *load]
    )
    assert ("kmm_run 'cp -r /fw/. /var/lib/firmware'" in post_start) == ("firmwarePath" in modprobe)
    assert lifecycle["preStop"]["exec"]["command"][-1].splitlines()[-len(unload) :] == [
        shlex.join(["kmm_run", shlex.join(command), *command]) for command in unload
    ]


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
        loader_builders.load_script(modprobe, target)
    with pytest.raises(ValueError, match=r"rawArgs\.load and rawArgs\.unload must both be set"):
        loader_builders.unload_commands(modprobe)


def test_in_tree_modules_removed_before_the_load() -> None:
    """By the names the kernel shows (kmod's ``-`` is ``_``), once the load's
    files are listed (``kmm_probe`` changes nothing) and before anything else."""
    raw = fixtures.module_raw()
    mapping = raw["spec"]["moduleLoader"]["container"]["kernelMappings"][1]
    mapping["inTreeModulesToRemove"] = ["old", "other-mod"]
    ds = loader_builders.daemonset(fixtures.module(raw), _target("6.1.0-27-amd64", raw))
    command = ds["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["postStart"]["exec"]
    steps = [line.split()[0] for line in command["command"][-1].splitlines()]
    main = steps[steps.index("kmm_probe") :]
    assert main == ["kmm_probe", "kmm_remove_in_tree", "kmm_unload_stale", "kmm_run", "kmm_verify"]
    assert "\nkmm_remove_in_tree old other_mod\n" in command["command"][-1]


def test_template_depends_only_on_pair_and_module_content() -> None:
    """Operator restarts rebuild the same object: the hash is stable."""
    first = loader_builders.daemonset(fixtures.module(), _target("6.8.0-45-generic"))
    again = loader_builders.daemonset(fixtures.module(), _target("6.8.0-45-generic"))
    assert objects.observed_hash(first) == objects.observed_hash(again)
    raw = fixtures.module_raw()
    raw["spec"]["moduleLoader"]["container"]["modprobe"]["parameters"] = ["a=2"]
    changed = loader_builders.daemonset(fixtures.module(raw), _target("6.8.0-45-generic", raw))
    assert objects.observed_hash(changed) != objects.observed_hash(first)
