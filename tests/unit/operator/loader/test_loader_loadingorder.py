"""``modulesLoadingOrder``: the loader pod's softdep file, and its hooks run
against a ``modprobe`` with kmod's semantics (``tests/fakemodprobe.py``).

The hooks are run exactly as the pod template carries them (``/bin/sh -c``),
with the softdep file projected from the template as the kubelet projects a
downward-API volume, so the tests prove the wiring as well as the commands.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import fakemodprobe
import operator_fixtures as fixtures
import pytest

from kmm.api import kernels, labels
from kmm.operator import objects
from kmm.operator.loader import builders as loader_builders
from kmm.operator.loader import scripts as loader_scripts

KERNEL = "6.1.0-27-amd64"
CHAIN = ("kmm_a", "kmm_b", "kmm_c")


def _module_raw(modprobe: dict[str, Any] | None = None, **container: Any) -> dict[str, Any]:
    raw = fixtures.module_raw()
    if modprobe is not None:
        raw["spec"]["moduleLoader"]["container"]["modprobe"] = modprobe
    raw["spec"]["moduleLoader"]["container"].update(container)
    return raw


def _daemonset(raw: dict[str, Any], kernel: str = KERNEL) -> dict[str, Any]:
    module = fixtures.module(raw)
    target = kernels.target(module, kernel)
    assert target is not None
    return loader_builders.daemonset(module, target)


def _chain_daemonset(**modprobe: Any) -> dict[str, Any]:
    spec = {"moduleName": CHAIN[0], "parameters": ["debug=1"], "modulesLoadingOrder": list(CHAIN)}
    return _daemonset(_module_raw({**spec, **modprobe}))


@pytest.mark.parametrize(
    ("order", "text"),
    [
        (["a", "b"], "softdep a pre: b\n"),
        (["a", "b", "c"], "softdep a pre: b\nsoftdep b pre: c\n"),
    ],
)
def test_softdep_config_is_kmms(order: list[str], text: str) -> None:
    assert loader_builders.softdep_config(order) == text


def test_loading_order_mounts_the_softdep_file() -> None:
    ds = _chain_daemonset(firmwarePath="/fw")
    template = ds["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        labels.MODULES_ORDER: "softdep kmm_a pre: kmm_b\nsoftdep kmm_b pre: kmm_c\n"
    }
    pod = template["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["firmware", "modules-order"]
    assert pod["volumes"][1]["downwardAPI"] == {
        "items": [
            {
                "path": "softdep.conf",
                "fieldRef": {"fieldPath": f"metadata.annotations['{labels.MODULES_ORDER}']"},
            }
        ]
    }
    container = pod["containers"][0]
    assert container["volumeMounts"][1] == {
        "name": "modules-order",
        "mountPath": "/etc/modprobe.d/softdep.conf",
        "subPath": "softdep.conf",
        "readOnly": True,
    }
    lifecycle = container["lifecycle"]
    assert lifecycle["postStart"]["exec"]["command"][-1].splitlines()[-5:] == [
        "kmm_probe /opt kmm_a kmm_a",
        "kmm_run 'cp -r /fw/. /var/lib/firmware' cp -r /fw/. /var/lib/firmware",
        "kmm_unload_stale",
        "kmm_run 'modprobe -v -d /opt kmm_a debug=1' modprobe -v -d /opt kmm_a debug=1",
        "kmm_verify",
    ]
    assert lifecycle["preStop"]["exec"]["command"][-1].splitlines()[-3:] == [
        f"kmm_run 'modprobe -rv -d /opt {name}' modprobe -rv -d /opt {name}" for name in CHAIN
    ]


# -- templates of Modules without modulesLoadingOrder: pinned ----------------

# Spec hashes of the whole DaemonSet, computed by the builder after
# modulesLoadingOrder got its softdep file (which left them as they were),
# after the main process became a shell exiting on SIGTERM and after the
# hooks became loader.scripts' scripts, which check the kernel and report
# through the termination message, and after a stale module's unload named
# its own build once (each changed them, on purpose:
# loader_builders.MAIN_COMMAND, loader.scripts). A changed value is one
# patch of every loader DaemonSet of such a Module on an operator upgrade,
# and a new command for its pods made afterwards (OnDelete keeps the running ones).
_PINNED = {
    ("plain", "6.8.0-45-generic"): "9928e6e39ec7816670fe",
    ("plain", "6.1.0-27-amd64"): "8b1090881f02a51a772c",
    ("args", "6.8.0-45-generic"): "884b73c2b005264d71ad",
    ("args", "6.1.0-27-amd64"): "05eb6262311a916c9840",
    ("raw", "6.8.0-45-generic"): "f809c53524492eb79991",
    ("raw", "6.1.0-27-amd64"): "e4cd6f7bbf84f2e2a9d5",
    ("firmware", "6.8.0-45-generic"): "dbd4a2c891b66582d5cb",
    ("firmware", "6.1.0-27-amd64"): "e96def174ef2e71157a3",
    ("version", "6.8.0-45-generic"): "4bb8ab04c69ebbaacc29",
    ("version", "6.1.0-27-amd64"): "7018b680edba5e8fb8db",
}
_VARIANTS: dict[str, dict[str, Any]] = {
    "plain": _module_raw(),
    "args": _module_raw(
        {"moduleName": "x", "dirName": "/mods", "args": {"load": ["-q"], "unload": ["-q"]}}
    ),
    "raw": _module_raw({"rawArgs": {"load": ["-a", "y"], "unload": ["-r", "y"]}}),
    "firmware": _module_raw({"moduleName": "x", "firmwarePath": "/fw"}),
    "version": _module_raw(version="v1"),
}


@pytest.mark.parametrize(("variant", "kernel"), sorted(_PINNED))
def test_template_without_loading_order_is_unchanged(variant: str, kernel: str) -> None:
    assert objects.observed_hash(_daemonset(_VARIANTS[variant], kernel)) == _PINNED[variant, kernel]


def test_plain_template_is_byte_identical() -> None:
    """The same template, key order included (what is sent is json of it)."""
    load = loader_scripts.load_script(
        in_tree=(),
        firmware=None,
        load=["modprobe", "-v", "-d", "/opt", "kmod_x", "a=1"],
        checked=("/opt", "kmod_x"),
    )
    unload = loader_scripts.unload_script([["modprobe", "-rv", "-d", "/opt", "kmod_x"]])
    expected = {
        "metadata": {
            "labels": {
                "kmm.node.kubernetes.io/module.name": "m",
                "kmm.node.kubernetes.io/module.namespace": "ns",
                "kmm.node.kubernetes.io/role": "module-loader",
                "kmm.node.kubernetes.io/kernel-version.full": "6.1.0-27-amd64",
                "kmm.node.kubernetes.io/image-hash": "b913ed88295dc39c",
            }
        },
        "spec": {
            "priorityClassName": "system-node-critical",
            "containers": [
                {
                    "name": "module-loader",
                    "image": "r.io/m:v1",
                    "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait"],
                    "securityContext": {
                        "capabilities": {"drop": ["ALL"], "add": ["SYS_MODULE"]},
                        "runAsUser": 0,
                    },
                    "lifecycle": {
                        "postStart": {"exec": {"command": ["/bin/sh", "-c", load]}},
                        "preStop": {"exec": {"command": ["/bin/sh", "-c", unload]}},
                    },
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                }
            ],
            "nodeSelector": {
                "pick": "yes",
                "kmm.node.kubernetes.io/kernel-version.full": "6.1.0-27-amd64",
            },
        },
    }
    template = _daemonset(_module_raw())["spec"]["template"]
    assert json.dumps(template) == json.dumps(expected)


# -- the hooks, run against kmod's semantics ----------------------------------

_ANNOTATION = re.compile(r"^metadata\.annotations\['([^']+)'\]$")


def _project(template: dict[str, Any], root: Path) -> None:
    """What the kubelet does for the container's downward-API mounts: each
    item a file holding the field; a ``subPath`` mount puts that one file at
    ``mountPath``. Only annotations are handled (anything else fails)."""
    pod = template["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", ())}
    for mount in pod["containers"][0].get("volumeMounts", ()):
        volume = volumes[mount["name"]]
        if "downwardAPI" not in volume:
            continue
        item = next(i for i in volume["downwardAPI"]["items"] if i["path"] == mount["subPath"])
        match = _ANNOTATION.match(item["fieldRef"]["fieldPath"])
        assert match is not None
        target = root / mount["mountPath"].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(template["metadata"]["annotations"][match[1]])


class Node:
    """One node: the fake kernel, the loader container's files, its hooks.

    The kernel has no module support (no ``/proc/modules``), as on the
    sandbox's container nodes: the hooks run their ``modprobe`` commands as
    written and check nothing (``test_loader_scripts`` checks a kernel that
    has it). ``KMM_LOADER_ROOT`` points the hooks at the fake kernel's tree."""

    def __init__(self, tmp_path: Path, ds: dict[str, Any]) -> None:
        self.kernel = fakemodprobe.Kernel(tmp_path / "root")
        self.kernel.provide(CHAIN, dirname="/opt", release=KERNEL)
        self.bin = tmp_path / "bin"
        fakemodprobe.install(self.bin, self.kernel.root)
        template = ds["spec"]["template"]
        _project(template, self.kernel.root)
        self.lifecycle = template["spec"]["containers"][0]["lifecycle"]
        self.report = self.kernel.root / "dev/termination-log"
        self.report.parent.mkdir(parents=True, exist_ok=True)
        self.report.touch()

    def run(self, hook: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "KMM_LOADER_ROOT": str(self.kernel.root),
        }
        command = self.lifecycle[hook]["exec"]["command"]
        return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


def test_load_then_unload_through_the_softdep_file(tmp_path: Path) -> None:
    node = Node(tmp_path, _chain_daemonset())
    loaded = node.run("postStart")
    assert loaded.returncode == 0, loaded.stderr
    assert node.kernel.events() == ["insmod kmm_c", "insmod kmm_b", "insmod kmm_a debug=1"]
    assert node.kernel.loaded() == set(CHAIN)
    unloaded = node.run("preStop")
    assert unloaded.returncode == 0, unloaded.stderr
    assert node.kernel.events()[3:] == ["rmmod kmm_a", "rmmod kmm_b", "rmmod kmm_c"]
    assert node.kernel.loaded() == set()


_STATES = [
    set(state) for size in range(len(CHAIN) + 1) for state in itertools.combinations(CHAIN, size)
]


@pytest.mark.parametrize("state", _STATES, ids=lambda s: "+".join(sorted(s)) or "none")
def test_unload_from_any_state_removes_the_rest_in_order(tmp_path: Path, state: set[str]) -> None:
    """Whatever an earlier partial unload, or the kernel, left loaded: it goes,
    first to last; the hook succeeds, and again as a no-op."""
    node = Node(tmp_path, _chain_daemonset())
    for name in state:
        node.kernel.load(name)
    first = node.run("preStop")
    assert first.returncode == 0, first.stderr
    assert node.kernel.events() == [f"rmmod {name}" for name in CHAIN if name in state]
    assert node.kernel.loaded() == set()
    again = node.run("preStop")
    assert again.returncode == 0, again.stderr
    assert len(node.kernel.events()) == len(state)


@pytest.mark.parametrize("state", [set(CHAIN[i:]) for i in range(len(CHAIN) + 1)])
def test_load_completes_the_chain(tmp_path: Path, state: set[str]) -> None:
    """From what an unload stopped part way leaves (a tail of the chain)."""
    node = Node(tmp_path, _chain_daemonset())
    for name in state:
        node.kernel.load(name)
    result = node.run("postStart")
    assert result.returncode == 0, result.stderr
    assert node.kernel.loaded() == set(CHAIN)
    inserted = [event.split()[1] for event in node.kernel.events()]
    assert inserted == [name for name in reversed(CHAIN) if name not in state]


@pytest.mark.parametrize("busy", CHAIN)
def test_unload_stops_at_a_module_in_use(tmp_path: Path, busy: str) -> None:
    """Nothing after a module in use is removed: what stays loaded keeps
    everything it was loaded after (a later ``modprobe <first>`` does
    nothing for a loaded module, so it could not bring them back)."""
    node = Node(tmp_path, _chain_daemonset())
    for name in CHAIN:
        node.kernel.load(name, refcnt=1 if name == busy else 0)
    result = node.run("preStop")
    assert result.returncode != 0
    # What the kubelet keeps of the container (its termination message).
    assert node.report.read_text() == (
        f"modprobe -rv -d /opt {busy}: modprobe: FATAL: Module {busy} is in use.\n"
    )
    stays = set(CHAIN[CHAIN.index(busy) :])
    assert node.kernel.loaded() == stays
